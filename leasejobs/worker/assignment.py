"""Which child runs which job: the pool's state, and the claimer's and heartbeat's side of it.

The claimer asks how much room the children have and hands them the jobs it
claimed (``assign``): each goes to the child with the least estimated work,
within ``rules.child_budget``; the heartbeat moves each child's watchdog
deadline on when leases are renewed. This module holds the state every part
of the pool shares (the children, the backlog, the jobs to give back, the
measured durations) and the rules that place a job. The claimer sends the
jobs it placed at once (``_send``: a job's start waits for no thread hop);
the pool thread sends the rest and writes what a full socket left waiting
(``leasejobs.worker.pool``).
"""

import contextlib
import heapq
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from leasejobs.worker import rules
from leasejobs.worker.childstate import ChildState
from leasejobs.worker.events import Events
from leasejobs.worker.held import HeldJob, HeldJobs
from leasejobs.worker.messages import run_message
from leasejobs.worker.slots import SlotTable
from leasejobs.worker.zygote import Zygote


class JobAssignment:
    """The pool's shared state, and the placing of jobs on children (see the module docstring)."""

    def __init__(
        self,
        slots: SlotTable,
        held: HeldJobs,
        events: Events,
        *,
        finish: Callable[[HeldJob], None],
        work_wanted: Callable[[], None],
        stop_grace: float,
        watch: bool = True,
    ) -> None:
        """``watch``: kill a body that outlives its lease (off with ``--no-heartbeat``)."""
        #: Forked by ``Worker.start_children`` (before any thread), set before ``start``.
        self.zygote: Zygote | None = None
        self.slots = slots
        self.held = held
        self.events = events
        self._finish = finish
        self._work_wanted = work_wanted
        self.stop_grace = stop_grace
        self.watch = watch
        self.lock = threading.Lock()
        self._children: list[ChildState] = []
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: Jobs whose child never started them, waiting for another child.
        self._backlog: deque[HeldJob] = deque()
        #: Jobs to give back (never started, or stopped at the end of a stop's grace): the
        #: claimer releases them at its next turn, the worker once claiming has ended.
        self._given_back: list[HeldJob] = []
        self._stopping = False
        self._closed = False
        self._count = 0
        #: When the pool thread looks at the bodies next (``pool.BODY_LOOK_SECONDS``); 0: at once.
        self._next_body_look = 0.0
        #: Each task's smoothed body duration (seconds): how long its jobs are
        #: expected to keep a child busy.
        self.durations: dict[str, float] = {}
        #: The smoothed estimate of the jobs claimed lately, None until a body has
        #: run: how many jobs a claim may take for each child.
        self.mean_duration: float | None = None
        self.bytes_held = 0
        self.children_started = 0
        self.children_died = 0

    def _forks(self) -> Zygote:
        assert self.zygote is not None, "Worker.start_children forks the zygote before the pool starts"
        return self.zygote

    def _wake(self) -> None:
        """Wake the pool thread (it sends what was assigned, looks at bodies)."""
        with contextlib.suppress(BlockingIOError):  # a wake-up is pending already
            os.write(self._wake_w, b"x")

    # -- the claimer's side --------------------------------------------------------

    def outstanding(self) -> tuple[list[int], int]:
        """How many jobs each child with room holds, and how many wait for a child.

        A child whose estimated work left fills its budget (a body of a slow
        task, or of a task not seen yet) has no room, whatever its count; a
        body expected to end within the budget no longer counts, so its next
        job is claimed and sent while it ends, not after (``work_left``).
        """
        with self.lock:
            if self._stopping:
                return [], 0
            budget = rules.CHILD_QUEUE_SECONDS
            now = time.monotonic()
            counts = []
            for c in self._children:
                if not c.accepting:
                    continue
                left, ending = self._work_left(c, now)
                if not c.outstanding or left < budget:
                    counts.append(len(c.outstanding) - ending)
            return counts, len(self._backlog)

    def _work_left(self, child: ChildState, now: float) -> tuple[float, int]:
        """The child's estimated work left, and how many of its jobs no longer count: their
        body ended (only its report is on its way) or is expected to end within
        ``CHILD_QUEUE_SECONDS`` (``rules.work_left``); lock held.

        Read from its slot: a job at or before ``started`` has begun, and one
        not ``running`` then has ended (the child sets ``running`` first).
        """
        started = self.slots[child.index].started
        running = self.slots.running(child.index)
        left, ending = 0.0, 0
        for seq, job in child.outstanding.items():
            if seq > started:
                left += job.estimate
            elif running is not None and seq == running.seq:
                if job.task_name in self.durations:
                    body_left, body_ending = rules.work_left(job.estimate, now - running.started_at)
                    left, ending = left + body_left, ending + body_ending
                else:
                    left += job.estimate
            else:
                ending += 1
        return left, ending

    def may_have_started(self, job: HeldJob) -> bool:
        """Whether ``job``'s body may have started, reported or not (its child's slot says so)."""
        with self.lock:
            if job.started:
                return True
            return job.child >= 0 and job.seq <= self.slots[job.child].started

    def idle_children(self) -> int:
        """Children holding no job: what a claim of jobs under limits may fill (they start at once)."""
        with self.lock:
            if self._stopping:
                return 0
            return sum(1 for c in self._children if c.accepting and not c.outstanding)

    def estimate(self, job: HeldJob) -> float:
        """How long ``job`` will keep a child busy: its task's mean, or a whole queue's worth if unknown."""
        return self.durations.get(job.task_name, rules.CHILD_QUEUE_SECONDS)

    def overflow(self, jobs: list[HeldJob]) -> list[HeldJob]:
        """The claimed jobs no child has room for now, judged as ``assign`` would.

        The claimer gives them back before ``assign`` hands over the rest: no
        body of a claim starts while jobs beyond the children's room are held
        with their runs counted, so a worker killed as those bodies start costs
        no more than the children's room (docs/guarantees.md).
        """
        with self.lock:
            ready = [c for c in self._children if c.accepting]
            return [job for job, child in self._placements(ready, jobs) if child is None] if ready else []

    def assign(self, jobs: list[HeldJob]) -> list[HeldJob]:
        """Give claimed jobs to the children with the least work, in claim order; returns those
        no child has room for (to be given back).

        A child takes a job while the work ahead of it stays within
        ``rules.child_budget`` (judged by each task's own mean duration, its
        running body's time so far counted off), and an idle child always
        takes one: so a job never waits in a child behind more than a few
        milliseconds of others' work, whatever the mix of tasks, and a child of
        jobs longer than the budget gets its next one as its body ends.
        """
        if not jobs:
            return []
        overflow: list[HeldJob] = []
        with self.lock:
            ready = [c for c in self._children if c.accepting]
            if not ready:
                self._backlog.extend(jobs)
            else:
                for job, child in self._placements(ready, jobs):
                    if child is None:
                        overflow.append(job)
                        continue
                    self._hand(child, job)
                    self.mean_duration = rules.mean_duration(self.mean_duration, job.estimate)
                for child in ready:
                    self._set_deadline(child)
                    self._send(child)
        self._wake()  # the pool thread writes what a full socket did not take, and looks at bodies
        return overflow

    def _placements(
        self, ready: list[ChildState], jobs: list[HeldJob]
    ) -> Iterator[tuple[HeldJob, ChildState | None]]:
        """Each job with the ready child that would take it (the least work first), or None
        when it would overflow that child's budget; lock held, nothing changed."""
        now = time.monotonic()
        least = [(self._work_left(c, now)[0], i) for i, c in enumerate(ready)]
        heapq.heapify(least)
        for job in jobs:
            queued, i = least[0]
            estimate = self.estimate(job)
            if _full(queued, job):
                yield job, None
                continue
            yield job, ready[i]
            heapq.heapreplace(least, (queued + estimate, i))

    def _all_busy(self, job: HeldJob) -> bool:
        """Whether children accept jobs and none would take ``job`` now (each runs a body far
        past its estimate); lock held. None accepting (children being replaced) is not."""
        now = time.monotonic()
        accepting = [c for c in self._children if c.accepting]
        return bool(accepting) and all(_full(self._work_left(c, now)[0], job) for c in accepting)

    def _give(self, job: HeldJob) -> None:
        """Hand one job to the accepting child with the least work if it has room (else to
        the backlog, for the next look); lock held."""
        now = time.monotonic()
        left = {c.index: self._work_left(c, now)[0] for c in self._children if c.accepting}
        child = min((c for c in self._children if c.index in left), key=lambda c: left[c.index], default=None)
        if child is None or _full(left[child.index], job):
            self._backlog.append(job)
            return
        self._hand(child, job)
        self._set_deadline(child)

    def _send(self, child: ChildState) -> None:
        """Send ``child`` the jobs handed to it (what its socket does not take now waits in
        its channel for the pool thread); lock held."""
        if child.to_send and child.pid:
            child.channel.send(run_message(child.to_send))
            child.to_send = []

    def _hand(self, child: ChildState, job: HeldJob) -> None:
        """``job`` is ``child``'s now, to be sent by ``_send``; lock held."""
        child.next_seq += 1
        job.child, job.seq = child.index, child.next_seq
        child.outstanding[job.seq] = job
        job.estimate = self.estimate(job)
        self.bytes_held += job.bytes
        assert job.args is not None and job.kwargs is not None
        # A ``BodyJob`` as it is sent: a plain tuple of its fields, in their order (a
        # named tuple built here, then copied into a plain one to pickle, cost twice).
        child.to_send.append(
            (
                job.seq,
                job.key.id,
                job.key.attempt,
                job.task_name,
                job.args,
                job.kwargs,
                job.retry_policy,
                job.trace_context,
                job.runs,
                job.max_attempts,
                job.snoozes,
                job.queue,
                job.lease_seconds,
                job.lease_ends - rules.watchdog_margin(job.lease_seconds),
                job.slots,
            )
        )

    # -- the heartbeat's side --------------------------------------------------------

    def renewed(self) -> None:
        """Leases were renewed: move each child's watchdog deadline on."""
        with self.lock:
            for child in self._children:
                self._set_deadline(child)

    def _set_deadline(self, child: ChildState) -> None:
        """The zygote kills the child's running body once the first lease it holds runs out; lock held."""
        if not child.outstanding:
            return
        deadline = min(
            j.lease_ends - rules.watchdog_margin(j.lease_seconds) for j in child.outstanding.values()
        )
        self.slots.set_deadline(child.index, deadline)


def _full(work_left: float, job: HeldJob) -> bool:
    """Whether a child with this much estimated work left has no room for ``job``: an idle
    child always has; a busy one while the job would start within ``rules.child_budget``.
    A body of a task not measured yet counts a whole budget, so nothing waits behind it."""
    return work_left > 0 and work_left >= rules.child_budget(job.lease_seconds)
