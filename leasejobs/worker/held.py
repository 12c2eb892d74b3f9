"""The jobs a worker holds: one table, keyed by attempt, with an explicit phase.

A worker may hold two attempts of the same job at once: its old attempt,
whose lease ran out while a side-effect block kept it busy, and the new
attempt it claimed afterwards. So a held job is keyed by ``(job id,
attempt)``, never by the id alone: the old attempt's rejected finish must not
touch the new attempt's entry.

Every held job is in one phase, and only these moves exist::

    BUFFERED --take--> RUNNING --settle--> SETTLED --finished--> FINISHED
        |                 |                   |
        +--settle---------+                   |   (a refusal settles a buffered job)
        +--drop-----------+                   +--unwritten--> DROPPED
        +-----------------+--drop--> DROPPED

Only the finisher ends a SETTLED job: its fenced write decides. A heartbeat
that finds the row moved on, or a body that raised ``LeaseLost`` after its
timeout, may be seeing the job's own finish, committed a moment before the
finisher marks it FINISHED; so ``drop`` leaves a SETTLED job alone (it only
stops its heartbeats), and a finish refused as stale reports the lost lease.

FINISHED and DROPPED jobs leave the table. ``HeldJobs`` owns the lock, the
buffer of jobs waiting for a runner and the counters; nobody else changes a
job's phase.
"""

import enum
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from leasejobs.context import JobContext
from leasejobs.store import Attempt, Outcome

if TYPE_CHECKING:
    from leasejobs.registry import Task
    from leasejobs.retry import RetryPolicy


class Phase(enum.Enum):
    BUFFERED = "buffered"  # claimed, waiting for a runner
    RUNNING = "running"  # its body runs
    SETTLED = "settled"  # its one outcome is decided, waiting to be written
    FINISHED = "finished"  # its outcome is written
    DROPPED = "dropped"  # it no longer holds the job, or gave it back: nothing to write


#: The counter a written outcome adds to, where it is not named by its status.
_COUNTED_AS = {"queued": "retried"}

#: Phases in which the worker holds the job and must keep its lease alive.
HOLDING = (Phase.BUFFERED, Phase.RUNNING, Phase.SETTLED)


@dataclass(slots=True, eq=False)
class HeldJob:
    """One attempt this worker claimed and has not yet finished or dropped."""

    key: Attempt
    task_name: str
    queue: str
    args: Any
    kwargs: Any
    task: "Task | None"
    max_attempts: int
    #: Started runs of the job, this attempt's included once its body starts.
    runs: int
    #: This attempt's run is on record in the database (counted at the claim
    #: or by a start mark); otherwise its finish counts it.
    counted: bool
    #: Claimed from an expired lease rather than from the queue.
    taken_over: bool
    lease_seconds: float
    ctx: JobContext
    #: Seconds from ``run_at`` to the claim (database clock), and the monotonic
    #: time of the claim: together the job's queue time when its body starts.
    waited: float = 0.0
    claimed_at: float = 0.0
    #: Monotonic time until which the lease surely holds: from just before the
    #: claim (or the last heartbeat that renewed it) plus the lease. A body
    #: whose buffered job outlived it (its worker was paused) never starts.
    lease_ends: float = float("inf")
    #: The W3C trace context stored at enqueue, for the attempt's span.
    trace_context: Any = None
    #: Times the job snoozed before this claim, and the retry policy it runs under.
    snoozes: int = 0
    retry_policy: "RetryPolicy | None" = None
    #: Places under concurrency limits held with the claim (see ``CLAIM_LIMITED``).
    slots: int = 0
    phase: Phase = Phase.BUFFERED
    started: bool = False
    #: Monotonic time past which the body has timed out (None: no timeout).
    deadline: float | None = None
    #: False once timed out: the worker stops heartbeating the attempt.
    beating: bool = True
    outcome: Outcome | None = None
    #: Its finish met its row locked once (logged only the first time).
    finish_skipped: bool = field(default=False)


class HeldJobs:
    """The table of held jobs and the buffer runners take them from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._job_ready = threading.Condition(self.lock)
        self._jobs: dict[Attempt, HeldJob] = {}
        self._buffer: deque[HeldJob] = deque()
        self._idle_runners = 0
        self._no_starts = False  # stopping: buffered jobs never start
        self._closed = False  # runners exit
        self.running = 0
        self.claimed = 0
        self.counts = {
            "claimed": 0,
            "done": 0,
            "retried": 0,
            "snoozed": 0,
            "failed": 0,
            "cancelled": 0,
            "lost_leases": 0,
        }

    # -- claiming --------------------------------------------------------------

    def add(self, jobs: list[HeldJob], refused: list[HeldJob]) -> None:
        """Hold newly claimed jobs: ``jobs`` for the runners, ``refused`` to settle at once."""
        with self.lock:
            for job in jobs:
                self._jobs[job.key] = job
                self._buffer.append(job)
            for job in refused:
                self._jobs[job.key] = job
            n = len(jobs) + len(refused)
            self.claimed += n
            self.counts["claimed"] += n
            # Wake only as many idle runners as there are new jobs.
            self._job_ready.notify(min(self._idle_runners, len(jobs)))

    def ended_at_claim(self, status: str) -> None:
        """Count a job the claim ended instead of running (no runs left, or a pending cancel)."""
        with self.lock:
            self.counts[status] += 1

    def sizes(self) -> tuple[int, int]:
        """``(running, buffered)`` right now."""
        with self.lock:
            return self.running, len(self._buffer)

    # -- running ---------------------------------------------------------------

    def take(self) -> HeldJob | None:
        """The oldest buffered job, now RUNNING; waits for one; None once closed."""
        with self.lock:
            while not self._buffer or self._no_starts:
                if self._closed:
                    return None
                self._idle_runners += 1
                self._job_ready.wait()
                self._idle_runners -= 1
            job = self._buffer.popleft()
            job.phase = Phase.RUNNING
            self.running += 1
            return job

    def body_ended(self) -> int:
        """A runner is done with its job (whatever its phase now); returns the buffer's size."""
        with self.lock:
            self.running -= 1
            return len(self._buffer)

    def settle(self, job: HeldJob, outcome: Outcome, *, beating: bool = True) -> bool:
        """Decide the attempt's one outcome; False if it was decided or dropped before."""
        with self.lock:
            if job.phase not in (Phase.BUFFERED, Phase.RUNNING):
                return False
            self._unbuffer(job)  # a settled job never starts
            job.phase = Phase.SETTLED
            job.outcome = outcome
            job.beating = beating
            return True

    # -- finishing -------------------------------------------------------------

    def finished(self, jobs: list[HeldJob]) -> None:
        """Their outcomes are written: the jobs leave the table and are counted (one lock for a batch)."""
        with self.lock:
            for job in jobs:
                if job.phase is not Phase.SETTLED:
                    continue
                job.phase = Phase.FINISHED
                self._jobs.pop(job.key, None)
                assert job.outcome is not None
                status = "snoozed" if job.outcome.snoozed else job.outcome.status
                self.counts[_COUNTED_AS.get(status, status)] += 1

    def drop(self, job: HeldJob) -> bool:
        """This attempt no longer holds its job: forget it; True if its lease is lost now.

        False if it is gone already, or SETTLED: then its finish decides (the
        row may have moved on by that very finish), and it only gets no more
        heartbeats.
        """
        with self.lock:
            if job.phase is Phase.SETTLED:
                job.beating = False
                return False
            return self._drop(job, lost=True)

    def unwritten(self, job: HeldJob, *, lost: bool) -> bool:
        """A SETTLED job's outcome will never be written (``lost``: refused as stale); else False."""
        with self.lock:
            if job.phase is not Phase.SETTLED:
                return False
            return self._drop(job, lost=lost)

    def _drop(self, job: HeldJob, *, lost: bool) -> bool:
        """Forget a held attempt and mark its context lost; lock held."""
        if job.phase not in HOLDING:
            return False
        self._unbuffer(job)
        job.phase = Phase.DROPPED
        self._jobs.pop(job.key, None)
        if lost:
            self.counts["lost_leases"] += 1
        job.ctx.mark_lease_lost()
        return True

    # -- heartbeats and timeouts ------------------------------------------------

    def to_beat(self) -> list[HeldJob]:
        """The attempts whose lease must stay alive: held, and not timed out."""
        with self.lock:
            return [j for j in self._jobs.values() if j.beating]

    def running_jobs(self) -> list[HeldJob]:
        with self.lock:
            return [j for j in self._jobs.values() if j.phase is Phase.RUNNING]

    def get(self, key: Attempt) -> HeldJob | None:
        with self.lock:
            return self._jobs.get(key)

    # -- stopping --------------------------------------------------------------

    def stop_starting(self) -> list[HeldJob]:
        """No buffered job starts from now on; returns them, DROPPED, to be given back."""
        with self.lock:
            self._no_starts = True
            jobs = list(self._buffer)
            self._buffer.clear()
            for job in jobs:
                job.phase = Phase.DROPPED
                self._jobs.pop(job.key, None)
            return jobs

    def busy(self) -> bool:
        """Bodies still run, jobs wait in the buffer, or outcomes wait to be written."""
        with self.lock:
            settled = any(j.phase is Phase.SETTLED for j in self._jobs.values())
            return bool(self.running or self._buffer or settled)

    def empty(self) -> bool:
        with self.lock:
            return not self._jobs

    def close(self) -> None:
        """Runners exit once they are done with their current job."""
        with self.lock:
            self._closed = True
            self._job_ready.notify_all()

    def give_back(self) -> list[HeldJob]:
        """Every job still held but not settled, now DROPPED, to be given back."""
        with self.lock:
            jobs = [j for j in self._jobs.values() if j.phase in (Phase.BUFFERED, Phase.RUNNING)]
            for job in jobs:
                self._unbuffer(job)
                job.phase = Phase.DROPPED
                self._jobs.pop(job.key, None)
        for job in jobs:
            job.ctx.mark_lease_lost()
        return jobs

    def _unbuffer(self, job: HeldJob) -> None:
        """Take a BUFFERED job out of the buffer (a refused one was never in it); lock held."""
        if job.phase is Phase.BUFFERED and job in self._buffer:
            self._buffer.remove(job)

    def __len__(self) -> int:
        with self.lock:
            return len(self._jobs)
