"""Claiming: the main thread's loop that keeps the children supplied.

One CLAIM statement takes jobs for every child at once: each child holds
the job it runs and those it will start within a few milliseconds
(``rules.child_depth``), and a claim fills them all once one runs low
(``rules.claim_room``). Every claimed job goes to a child at once, so its
run is counted by the claim itself: a body never starts without its run on
record, and a worker killed from outside leaves at most the jobs its
children had not reached counted and unstarted (docs/guarantees.md). The
claim keeps the arguments it takes in memory under ``PREFETCH_BYTES``.
It claims again when a NOTIFY arrives, a child runs low, or the poll
interval passes. A NOTIFY that finds this loop waiting is claimed for in
the listener's thread itself (``notified``), on the listen connection when
the listener hands it over: waking this thread for it cost a median 155 µs
of a job's 2 ms from enqueue to start, and waking the claim connection's
sleeping server process more (docs/performance.md, "Latency"). The two
threads never claim at once (``_turn``); each claim starts where its last one stopped
(``ClaimStart``), and the front look's thread finds what lies before
(``FrontLook``, which the claim asks for when one is due).

Queue controls: while a queue this worker serves has a limit (or jobs with
a concurrency key were enqueued), idle children are first offered to
``CLAIM_LIMITED`` (jobs under limits, each with its places), when the
``LimitGate`` says it may find work; a job under limits never waits in a
child, so it holds its places only while its body runs.
"""

import threading
import time
from collections.abc import Callable

from leasejobs import conf
from leasejobs.db.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.db.rows import effective_lease
from leasejobs.db.store import Attempt, ClaimedRow, ClaimKey, WorkerStore, max_row_bytes
from leasejobs.jobs import registry
from leasejobs.jobs.registry import Task
from leasejobs.worker import outcomes, rules
from leasejobs.worker.claim_start import ClaimStart
from leasejobs.worker.due_soon import DueSoon, seconds_until
from leasejobs.worker.events import Events
from leasejobs.worker.front_look import FrontLook
from leasejobs.worker.held import HeldJob, HeldJobs, refunds
from leasejobs.worker.limits import LimitGate
from leasejobs.worker.listener import Heard
from leasejobs.worker.options import WorkerOptions
from leasejobs.worker.pool import Pool

#: How often a give-back found locked is tried again (at the claim loop's turns,
#: which come far more often under load): a statement or two per try, while an
#: operator's transaction holds the row.
GIVE_BACK_AGAIN_SECONDS = 0.02


class Claimer:
    def __init__(
        self,
        store: WorkerStore,
        held: HeldJobs,
        pool: Pool,
        events: Events,
        options: WorkerOptions,
        *,
        lease_seconds: float,
        poll_interval: float,
        prefetch: int,
        prefetch_bytes: int,
        finish: Callable[[HeldJob], None],
        new_lease: Callable[[float], None],
        results_pending: Callable[[], int] = lambda: 0,
    ) -> None:
        self.store = store
        self.held = held
        self.pool = pool
        self.events = events
        self.options = options
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.prefetch = prefetch
        self.prefetch_bytes = prefetch_bytes
        self._finish = finish
        self._new_lease = new_lease
        self._results_pending = results_pending
        self.task_leases = {
            name: float(t.lease_seconds) for name, t in registry.all_tasks().items() if t.lease_seconds
        }
        self._tasks: dict[str, tuple[Task | None, float]] = {}
        self.wake = threading.Event()
        #: Held by whichever thread claims: this loop, between its waits, or the listener's.
        self._turn = threading.Lock()
        #: The loop's stop (set by ``run``): the listener's thread claims nothing once it is set,
        #: nor before the loop runs or after it has ended (``_claiming``, changed under ``_turn``).
        self._stopping = threading.Event()
        self._claiming = False
        #: What a claim in the listener's thread raised, beyond a lost connection: raised
        #: again in the claim loop, which stops the worker the way its own errors do.
        self._failure: BaseException | None = None
        self.limits = LimitGate(store, options.queues, poll_interval)
        #: The last claim took more than the children had room for.
        self._gave_back = False
        #: Jobs given back whose rows another transaction held (an operator's edit, say):
        #: tried again at each turn until their leases run out (changed under ``_turn``).
        self._unreleased: list[HeldJob] = []
        self._give_back_at = 0.0
        #: The claim loop's last claim came back short with room left (``_one_turn``).
        self._ran_dry = False
        self.start = ClaimStart(inline_seconds=float(conf.get("FRONT_WALK_INLINE_MS")) / 1000)
        #: When jobs announced before they were due are (the loop's waits end then).
        self.due_soon = DueSoon(self.wake)
        #: The front look the claims ask for (None: none; the worker sets it, and runs
        #: and stops its thread).
        self.front: FrontLook | None = None

    def notified(
        self, queue: str | None, via: WorkerConnection | None = None, heard: Heard | None = None
    ) -> None:
        """The listener's wake-up: a NOTIFY for ``queue`` (None: it reconnected), and what
        it ``heard``: the places in claim order of the jobs announced, which the claims
        start before when they lie behind the keys (``ClaimStart.heard``), and whether
        the next claim should walk from the front (a queue resumed).

        News only of jobs not due yet wakes the loop when the first is due
        (``DueSoon``); one already due (committed late) is news now.

        When the claim loop is waiting, the listener's thread claims at once (a
        plain claim: news of a limited queue, ``--burst`` and ``--max-jobs`` are
        the loop's), on ``via`` if given, else on the claim connection;
        otherwise, or when the claim filled the room (more may be ready), it
        wakes the loop.
        """
        if heard is not None:
            # A job not due at its INSERT that lies behind a key is due: the key's was claimed.
            due = bool(heard.later) and self.start.heard(heard.later)
            for place in heard.later:
                seconds = seconds_until([place])
                if seconds > 0 and queue is not None:
                    self.due_soon.heard(queue, seconds)
                else:
                    due = True
            if heard.places:
                self.start.heard(heard.places)
            if heard.front:
                self.start.walk_front()
                # Asked within a second of the last: the loop's wait must end then.
                self.wake.set()
            if heard.later and not (due or heard.places or heard.front or heard.news):
                return
        self.limits.notified(queue)
        if (
            queue is not None
            and not self.limits.active
            and not self.options.burst
            and self.options.max_jobs is None
            and self._turn.acquire(blocking=False)
        ):
            try:
                if self._claiming and not self._stopping.is_set() and self._claim_for_notify(via):
                    return
            except Exception as exc:
                self._failure = exc
            finally:
                self._turn.release()
        self.wake.set()

    def _claim_for_notify(self, via: WorkerConnection | None) -> bool:
        """A claim in the listener's thread; whether it is all the loop needed (False: wake it)."""
        room = self._room()
        if room <= 0:
            return True  # the children are full: their reports wake the loop
        try:
            got = self.claim(room, via=via)
        except CONNECTION_ERRORS as exc:
            self.events.claim_failed(exc)
            return False
        if got == 0 and self.limits.stale():
            return False  # a queue may have got a limit since the loop last asked: its claim looks
        if self._unreleased:
            return False  # a give-back found locked: the loop tries it again, 20 ms from now
        return got < room or self._gave_back

    def run(self, stopping: threading.Event) -> None:
        """Claim until stopped, or until --burst finds nothing or --max-jobs is reached."""
        with self._turn:
            self._stopping = stopping
            self._claiming = True
        try:
            while True:
                with self._turn:
                    if not self._one_turn(stopping):
                        return
                    pending = bool(self._unreleased)
                timeout = GIVE_BACK_AGAIN_SECONDS if pending else self.poll_interval
                # A claim that came back short with room left: the front may show more;
                # a walk asked for within a second of the last is due a second after it.
                walk = self.start.walk_due_in() if self._ran_dry else None
                waits = [w for w in (timeout, walk, self.start.asked_walk_in()) if w is not None]
                self.wake.wait(self.due_soon.wait_seconds(min(waits)))
                self.due_soon.waited()
        finally:
            # Once the loop has ended (stopped, or an error), the worker gives back what it
            # holds: no claim of the listener's may add to it meanwhile.
            with self._turn:
                self._claiming = False

    def _one_turn(self, stopping: threading.Event) -> bool:
        """Claim until there is nothing more to do now (the claim loop's, ``_turn`` held);
        False: the loop ends."""
        o = self.options
        self._ran_dry = False
        while True:
            # Cleared before the look at ``stopping``: a stop (or a NOTIFY) that lands
            # after this wakes the wait that follows instead of being cleared unseen.
            self.wake.clear()
            for queue in self.due_soon.take():
                self.limits.notified(queue)
            if self._failure is not None:
                raise self._failure
            if stopping.is_set():
                return False
            if self._unreleased:
                self._give_back_again()
            # Jobs a child sent back unstarted while every child ran a body far past its
            # estimate: the pool gave them up, this releases them.
            self._release(self.pool.take_given_back())
            if o.max_jobs is not None and self.held.claimed >= o.max_jobs:
                # Not before every job is settled: one given back unstarted (its claim
                # undone) leaves room for another claim.
                if self.pool.holds_nothing() and not self._unreleased:
                    self.events.exiting(f"reached --max-jobs {o.max_jobs}:")
                    return False
                return True
            try:
                if self.limits.refresh() and self.limits.due():
                    self.claim_limited()
            except CONNECTION_ERRORS as exc:
                self.events.claim_failed(exc)
                return True
            room = self._room()
            if room > 0:
                # --burst ends on a claim that finds nothing while nothing is held, looked at
                # before it is sent: then every write of ours (a retry due at once, say) was
                # committed before its snapshot, and nothing of ours can be due after it.
                idle = o.burst and self.pool.holds_nothing() and not self._unreleased
                try:
                    got = self.claim(room, front=idle)
                    # Nothing held, so no place of ours is held either; a last look.
                    if got == 0 and idle and self.limits.active:
                        got = self.claim_limited()
                except CONNECTION_ERRORS as exc:
                    self.events.claim_failed(exc)
                    return True
                if got == 0 and idle:
                    if self._retries_keep_it(stopping):
                        continue
                    self.events.exiting("no job ready: --burst")
                    return False
                if got == room and not self._gave_back:
                    continue  # more may be ready; claim again as soon as there is room
                self._ran_dry = got < room
            return True

    def _retries_keep_it(self, stopping: threading.Event) -> bool:
        """``--burst`` found nothing ready: say what waits for later; with ``--wait-for-retries``
        wait until the next one is due (True: claim again)."""
        try:
            count, next_in = self.store.pending_retries(self.options.queues)
        except CONNECTION_ERRORS as exc:
            self.events.claim_failed(exc)
            return False
        if not count:
            return False
        waiting = self.options.wait_for_retries
        self.events.retries_pending(count, next_in, waiting)
        if waiting:
            stopping.wait(max(0.01, min(next_in, self.poll_interval)))
        return waiting

    def _room(self) -> int:
        counts, waiting = self.pool.outstanding()
        depth = rules.child_depth(
            mean_duration=self.pool.mean_duration,
            prefetch=self.prefetch,
            children=len(counts),
            lease_seconds=self.lease_seconds,
        )
        room = rules.claim_room(counts, depth, claimed=self.held.claimed, max_jobs=self.options.max_jobs)
        if room and self._bytes_left() <= 0 and not self.held.empty():
            return 0  # arguments held and results not yet written fill PREFETCH_BYTES: wait
        return max(0, room - waiting)

    def _bytes_left(self) -> int:
        return self.prefetch_bytes - self.pool.bytes_held - self._results_pending()

    def claim_limited(self) -> int:
        """Offer the idle children to jobs under limits; returns the rows claimed."""
        room = self.pool.idle_children()
        if self.options.max_jobs is not None:
            room = min(room, self.options.max_jobs - self.held.claimed)
        if room <= 0:
            return 0
        self.limits.claiming()
        rows, seconds = self._timed_claim(room, limited=True)
        self.limits.claimed(len(rows), room)
        return self._hold(rows, seconds)

    def claim(self, limit: int, *, front: bool = False, via: WorkerConnection | None = None) -> int:
        """Claim up to ``limit`` jobs and hand them to the children; returns the rows claimed.

        The claim starts after this worker's last keys, or at the front of the claim
        index when it has none (``ClaimStart``; ``front``: at the front now); then it
        asks for a front look if one is due. ``via``: the connection to claim on (the
        listener's), instead of the claim connection."""
        after = self.start.after(front=front)
        began = time.monotonic()
        rows, seconds = self._timed_claim(limit, max_bytes=max(1, self._bytes_left()), after=after, via=via)
        given_back: set[int] = set()
        got = self._hold(rows, seconds, given_back)
        self.start.claimed(after, began, seconds, rows, given_back, full=len(rows) >= limit)
        if self.front is not None and (keys := self.start.look_due()) is not None:
            self.front.ask(keys)
        return got

    def _timed_claim(
        self,
        limit: int,
        *,
        limited: bool = False,
        max_bytes: int | None = None,
        after: dict[int, ClaimKey] | None = None,
        via: WorkerConnection | None = None,
    ) -> tuple[list[ClaimedRow], float]:
        """Claim up to ``limit`` jobs, each counting its run; the rows, and how long the claim took
        (the leases run from before it was sent)."""
        began = time.perf_counter()
        rows = self.store.claim(
            limit=limit,
            counted=limit,
            queues=self.options.queues,
            lease_seconds=self.lease_seconds,
            task_leases=self.task_leases,
            limited=limited,
            max_bytes=max_bytes,
            after=after,
            via=via,
        )
        return rows, time.perf_counter() - began

    def _hold(self, rows: list[ClaimedRow], seconds: float, given_back: set[int] | None = None) -> int:
        """Hand claimed rows to the children (or settle refusals); returns the rows.

        ``seconds``: how long the claim statement took (for the metrics);
        ``given_back`` receives the ids of the jobs that went back to the queue unrun.
        """
        claimed_at = time.monotonic()
        jobs: list[HeldJob] = []
        refused: list[tuple[HeldJob, str]] = []
        for row in rows:
            if row.ended is not None:
                self.held.ended_at_claim(row.ended)
                self.events.ended_at_claim(
                    row.id, row.attempt, row.ended, row.last_error, row.queue, row.task_name
                )
                continue
            job = self._held_job(row, claimed_at, seconds)
            why = _refusal(job, row)
            if why is None:
                jobs.append(job)
            else:
                refused.append((job, why))
        self.held.add(jobs + [job for job, _ in refused])
        if self._unreleased:
            # A key claimed again is a live attempt (a give-back undoes the claim's attempt,
            # so the next claim makes the same key): never to be given back as the old one.
            claimed = {job.key for job in jobs} | {job.key for job, _ in refused}
            self._unreleased = [job for job in self._unreleased if job.key not in claimed]
        # What no child has room for goes back before any body of this claim can start (a
        # worker killed as they start must not take those counted runs with it); ``assign``
        # may still find less room than judged (a child died meanwhile).
        early = self.pool.overflow(jobs)
        if early:
            self._give_back(early)
            given = {id(job) for job in early}
            jobs = [job for job in jobs if id(job) not in given]
        overflow = self.pool.assign(jobs)
        if given_back is not None:
            given_back.update(job.key.id for job in early + overflow)
        # Given back, they wait for the next claim after a child reports progress (its wake-up),
        # not for one at once that would find the children as full.
        self._gave_back = bool(early or overflow)
        if overflow:
            self._give_back(overflow)
            # Not by phase: a fast body may have ended (SETTLED) already.
            given = {id(job) for job in overflow}
            jobs = [job for job in jobs if id(job) not in given]
        self.events.claimed(jobs, seconds)
        for job, why in refused:
            if self.held.settle(job, outcomes.refusal(why), started=False):
                self._finish(job)
        shortest = min((j.lease_seconds for j in jobs), default=None)
        if shortest is not None:
            self._new_lease(shortest)
        return len(rows)

    def _give_back(self, jobs: list[HeldJob]) -> None:
        """Jobs claimed beyond what the children have room for (slower than the claim
        judged): released at once, their runs refunded, claimable by anyone.

        A row another transaction holds past the store's fifth of a second is
        tried again at the claim loop's next turns (``_give_back_again``): left
        to run out, its lease would keep the job from every worker that long,
        and a ``--burst`` worker would exit leaving it running."""
        self._release([job for job in jobs if self.held.give_back(job)])

    def _release(self, given: list[HeldJob]) -> None:
        """Release the leases of jobs given back (no longer held), their unstarted runs refunded."""
        if not given:
            return
        try:
            released = self.store.release(refunds(given), slotted=any(job.slots for job in given))
        except CONNECTION_ERRORS as exc:
            # Left to their leases, they would wait that long, and a job of one attempt
            # would then be failed unrun: tried again at the next turns (``_give_back_again``).
            self.events.release_retried(len(given), exc)
            self._unreleased.extend(given)
            return
        for job in given:
            if job.key not in released:
                self.events.give_back_later(job)
                self._unreleased.append(job)

    def _give_back_again(self) -> None:
        """Try once more to release what ``_give_back`` found locked or could not send (a lost
        connection), at most every ``GIVE_BACK_AGAIN_SECONDS``; stop trying for a job that
        has moved on (an operator released or ended it), or whose lease has run out
        (anyone's to claim)."""
        now = time.monotonic()
        if now < self._give_back_at:
            return
        self._give_back_at = now + GIVE_BACK_AGAIN_SECONDS
        for job in [job for job in self._unreleased if job.claimed_at + job.lease_seconds <= now]:
            self._unreleased.remove(job)
            self.events.released(job, False)
        left = self._unreleased
        if not left:
            return
        try:
            released = self.store.release(refunds(left), slotted=any(job.slots for job in left), tries=1)
            left = [job for job in left if job.key not in released]
            held = self.store.still_held([job.key for job in left]) if left else set()
        except CONNECTION_ERRORS as exc:
            # Tried again at the next turns. Safe though whether the release committed is
            # unknown: a claim of ours that takes one back under the same key drops it from
            # here (``_hold``), and another worker's holds it under its own id, which the
            # release's fence does not match.
            self.events.release_retried(len(left), exc)
            return
        for job in left:
            if job.key not in held:
                self.events.give_back_moot(job)
        self._unreleased = [job for job in left if job.key in held]

    def give_back_pending(self) -> bool:
        """Try the give-backs found locked again (the worker's drain, once the claim loop has
        ended: ``--max-jobs``, ``--burst``, a stop); whether any is still pending."""
        with self._turn:
            if self._unreleased:
                self._give_back_again()
            return bool(self._unreleased)

    def take_unreleased(self) -> list[HeldJob]:
        """What is still to be given back once claiming has ended (the worker's last release)."""
        with self._turn:
            left, self._unreleased = self._unreleased, []
        return left

    def _task(self, name: str) -> tuple[Task | None, float]:
        """A task and its lease, looked up once per task name.

        An unknown name is not remembered: its module may register it later.
        """
        found = self._tasks.get(name)
        if found is None:
            task = registry.get(name)
            if task is None:
                return None, self.lease_seconds
            found = self._tasks[name] = (task, effective_lease(task.lease_seconds, self.lease_seconds))
        return found

    def _held_job(self, row: ClaimedRow, claimed_at: float, seconds: float) -> HeldJob:
        """``seconds``: how long the claim took (its lease runs from before it was sent).

        Built by position, in ``HeldJob``'s field order: one per claimed row, and
        twenty keywords cost the worker 1 µs a job more.
        """
        task, lease = self._task(row.task_name)
        return HeldJob(
            Attempt(row.id, row.attempt),
            row.task_name,
            row.queue,
            row.args,
            row.kwargs,
            task,
            row.max_attempts,
            row.runs,
            row.counted,
            row.taken_over,
            lease,
            self.store.worker_id,
            row.waited,
            claimed_at,
            claimed_at - seconds + lease,
            row.trace_context,
            row.retry_policy,
            row.snoozes,
            row.slots,
            row.bytes,
        )


def _refusal(job: HeldJob, row: ClaimedRow) -> str | None:
    """Why a claimed row cannot run at all (no retry will help), or None."""
    if job.task is None:
        return f"unknown task {job.task_name!r}"
    if row.args is None or row.kwargs is None:
        limit = int(conf.get("MAX_PAYLOAD_BYTES"))
        return (
            f"its arguments are {row.bytes} bytes of JSON, over {max_row_bytes(limit)} (twice "
            f"LEASEJOBS['MAX_PAYLOAD_BYTES']): the worker does not load them"
        )
    return None
