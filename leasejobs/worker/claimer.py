"""Claiming: the main thread's loop that fills free runner slots and the buffer.

One CLAIM statement takes jobs for all free room at once: the idle runners
plus a prefetch buffer sized so a buffered job starts within a tenth of a
second (``rules.prefetch_size``). It claims again when a NOTIFY arrives, the
buffer runs low, or the poll interval passes.

Queue controls: while a queue this worker serves has a limit (or jobs with
a concurrency key were enqueued), the runners not busy are first offered to
``CLAIM_LIMITED`` (jobs under limits, each with its places), when the
``LimitGate`` says it may find work; then the plain claim fills the rest.
A job under limits waits at most behind the short prefetch buffer.
"""

import threading
import time
from collections.abc import Callable

from leasejobs import observe, registry, retry
from leasejobs.connection import CONNECTION_ERRORS
from leasejobs.context import JobContext
from leasejobs.registry import Task
from leasejobs.retry import RetryPolicy
from leasejobs.store import Attempt, ClaimedRow, Outcome, WorkerStore
from leasejobs.validators import effective_lease
from leasejobs.worker import outcomes, rules
from leasejobs.worker.events import Events
from leasejobs.worker.held import HeldJob, HeldJobs
from leasejobs.worker.limits import LimitGate
from leasejobs.worker.options import WorkerOptions


class Claimer:
    def __init__(
        self,
        store: WorkerStore,
        held: HeldJobs,
        events: Events,
        options: WorkerOptions,
        *,
        lease_seconds: float,
        poll_interval: float,
        prefetch: int,
        mean_duration: Callable[[], float | None],
        settle: Callable[[HeldJob, Outcome], bool],
        new_lease: Callable[[float], None],
        after_side_effect: Callable[[], None],
    ) -> None:
        self.store = store
        self.held = held
        self.events = events
        self.options = options
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.prefetch = prefetch
        self._mean_duration = mean_duration
        self._settle = settle
        self._new_lease = new_lease
        self._after_side_effect = after_side_effect
        self.task_leases = {
            name: float(t.lease_seconds) for name, t in registry.all_tasks().items() if t.lease_seconds
        }
        self._tasks: dict[str, tuple[Task | None, float, RetryPolicy | None]] = {}
        self.wake = threading.Event()
        self.limits = LimitGate(store, options.queues, poll_interval)

    def notified(self, queue: str | None) -> None:
        """The listener's wake-up: a NOTIFY for ``queue`` (None: it reconnected)."""
        self.limits.notified(queue)
        self.wake.set()

    def run(self, stopping: threading.Event) -> None:
        """Claim until stopped, or until --burst finds nothing or --max-jobs is reached."""
        o = self.options
        poll = self.poll_interval
        while True:
            # Cleared before the look at ``stopping``: a stop (or a NOTIFY) that lands
            # after this wakes the wait below instead of being cleared unseen.
            self.wake.clear()
            if stopping.is_set():
                return
            if o.max_jobs is not None and self.held.claimed >= o.max_jobs:
                self.events.exiting(f"reached --max-jobs {o.max_jobs}:")
                return
            try:
                if self.limits.refresh() and self.limits.due():
                    self.claim_limited()
            except CONNECTION_ERRORS as exc:
                self.events.claim_failed(exc)
                self.wake.wait(poll)
                continue
            running, buffered = self.held.sizes()
            prefetch = rules.prefetch_size(
                prefetch=self.prefetch,
                concurrency=o.concurrency,
                mean_duration=self._mean_duration(),
                lease_seconds=self.lease_seconds,
            )
            room, worth, counted = rules.claim_size(
                concurrency=o.concurrency,
                prefetch=prefetch,
                running=running,
                buffered=buffered,
                claimed=self.held.claimed,
                max_jobs=o.max_jobs,
            )
            if room >= worth:
                # --burst ends on a claim that finds nothing while nothing is held, looked at
                # before it is sent: then every write of ours (a retry due at once, say) was
                # committed before its snapshot, and nothing of ours can be due after it.
                idle = o.burst and self.held.empty()
                try:
                    got = self.claim(room, counted)
                    # Nothing held, so no place of ours is held either; a last look.
                    if got == 0 and idle and self.limits.active:
                        got = self.claim_limited()
                except CONNECTION_ERRORS as exc:
                    self.events.claim_failed(exc)
                    self.wake.wait(poll)
                    continue
                if got == 0 and idle:
                    self.events.exiting("no job ready: --burst")
                    return
                if got == room:
                    continue  # more may be ready; claim again as soon as there is room
            self.wake.wait(poll)

    def claim_limited(self) -> int:
        """Offer the runners not busy to jobs under limits; returns the rows claimed."""
        o = self.options
        running, buffered = self.held.sizes()
        room, counted = rules.limited_claim_size(
            concurrency=o.concurrency,
            running=running,
            buffered=buffered,
            claimed=self.held.claimed,
            max_jobs=o.max_jobs,
        )
        if room <= 0:
            return 0
        self.limits.claiming()
        began = time.perf_counter()
        rows = self.store.claim(
            limit=room,
            counted=counted,
            queues=o.queues,
            lease_seconds=self.lease_seconds,
            task_leases=self.task_leases,
            limited=True,
        )
        seconds = time.perf_counter() - began
        self.limits.claimed(len(rows), room)
        return self._hold(rows, seconds)

    def claim(self, limit: int, counted: int) -> int:
        """Claim up to ``limit`` jobs and hand them to the runners; returns the rows claimed."""
        began = time.perf_counter()
        rows = self.store.claim(
            limit=limit,
            counted=counted,
            queues=self.options.queues,
            lease_seconds=self.lease_seconds,
            task_leases=self.task_leases,
        )
        return self._hold(rows, time.perf_counter() - began)

    def _hold(self, rows: list[ClaimedRow], seconds: float) -> int:
        """Hand claimed rows to the runners (or settle refusals); returns the rows.

        ``seconds``: how long the claim statement took (for the metrics).
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
            why = _refusal(job)
            if why is None:
                jobs.append(job)
            else:
                refused.append((job, why))
        # Runners first: a run counted at the claim should start at once (a
        # worker killed before it does leaves that run counted, unstarted).
        self.held.add(jobs, [job for job, _ in refused])
        self.events.claimed(jobs, seconds)
        for job, why in refused:
            self._settle(job, outcomes.refusal(why))
        shortest = min((j.lease_seconds for j in jobs), default=None)
        if shortest is not None:
            self._new_lease(shortest)
        return len(rows)

    def _task(self, name: str) -> tuple[Task | None, float, RetryPolicy | None]:
        """A task's (task, lease, own retry policy), looked up once per task name.

        An unknown name is not remembered: its module may register it later.
        """
        found = self._tasks.get(name)
        if found is None:
            task = registry.get(name)
            if task is None:
                return None, self.lease_seconds, None
            found = self._tasks[name] = (
                task,
                effective_lease(task.lease_seconds, self.lease_seconds),
                task.retry,
            )
        return found

    def _held_job(self, row: ClaimedRow, claimed_at: float, seconds: float) -> HeldJob:
        """``seconds``: how long the claim took (its lease runs from before it was sent)."""
        task, lease, policy = self._task(row.task_name)
        return HeldJob(
            key=Attempt(row.id, row.attempt),
            task_name=row.task_name,
            queue=row.queue,
            args=row.args,
            kwargs=row.kwargs,
            task=task,
            max_attempts=row.max_attempts,
            runs=row.runs if row.counted else row.runs + 1,
            counted=row.counted,
            taken_over=row.taken_over,
            lease_seconds=lease,
            slots=row.slots,
            waited=row.waited,
            claimed_at=claimed_at,
            lease_ends=claimed_at - seconds + lease,
            trace_context=row.trace_context,
            snoozes=row.snoozes,
            retry_policy=policy if row.retry_policy is None else retry.policy_for(policy, row.retry_policy),
            ctx=JobContext(
                job_id=row.id,
                attempt=row.attempt,
                worker_id=self.store.worker_id,
                task_name=row.task_name,
                queue=row.queue,
                runs=row.runs if row.counted else row.runs + 1,
                lease_seconds=lease,
                after_side_effect=self._after_side_effect,
                on_stale_write=observe.stale_write_rejected,
            ),
        )


def _refusal(job: HeldJob) -> str | None:
    """Why a claimed row cannot run at all (no retry will help), or None."""
    if job.task is None:
        return f"unknown task {job.task_name!r}"
    if not isinstance(job.args, list) or not isinstance(job.kwargs, dict):
        return "malformed job row: args must be a JSON list and kwargs a JSON object"
    return None
