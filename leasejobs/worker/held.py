"""The jobs a worker holds: one table, keyed by attempt, with an explicit phase.

A worker may hold two attempts of the same job at once: its old attempt,
whose lease ran out while a side-effect block kept it busy, and the new
attempt it claimed afterwards. So a held job is keyed by ``(job id,
attempt)``, never by the id alone: the old attempt's rejected finish must not
touch the new attempt's entry.

Every held job is in one phase, and only these moves exist::

    ASSIGNED --ended--> SETTLED --finished--> FINISHED
       |  \\                ^  \\
       |   +--stop--> STOPPING  +--unwritten--> DROPPED
       |                  |
       +--drop------------+--drop--> DROPPED        (lost: nothing to write)
       +--give back----------------> DROPPED        (released at a stop)

ASSIGNED: claimed and given to a child, which runs it when its turn comes.
STOPPING: its outcome is decided by the worker (a timeout, or "give the
lease back" at the end of a stop's grace) while its body may still run; it
keeps its lease and its places until the body is known to have stopped.
SETTLED: its outcome is decided and its body has stopped: only the
finisher's fenced write ends it. A heartbeat that finds the row moved on may
be seeing the job's own finish, committed a moment before the finisher marks
it FINISHED; so ``drop`` leaves a SETTLED job alone (it only stops its
heartbeats), and a finish refused as stale reports the lost lease.

FINISHED and DROPPED jobs leave the table. ``HeldJobs`` owns the lock (the
pool of children shares it) and the counters; nobody else changes a phase.
"""

import enum
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from leasejobs.db.store import Attempt, Outcome
from leasejobs.jobs.context import JobContext, context_for
from leasejobs.worker import outcomes
from leasejobs.worker.outcomes import Facts

if TYPE_CHECKING:
    from leasejobs.jobs.registry import Task


class Phase(enum.Enum):
    ASSIGNED = "assigned"  # in a child's hands: waiting for its turn, or running
    STOPPING = "stopping"  # its outcome decided; its body is being stopped
    SETTLED = "settled"  # its one outcome is decided and its body has ended: to be written
    FINISHED = "finished"  # its outcome is written
    DROPPED = "dropped"  # it no longer holds the job, or gave it back: nothing to write


#: The counter a written outcome adds to, where it is not named by its status.
_COUNTED_AS = {"queued": "retried"}

#: Phases in which the worker holds the job and must keep its lease alive.
HOLDING = (Phase.ASSIGNED, Phase.STOPPING, Phase.SETTLED)


@dataclass(slots=True, eq=False)
class HeldJob:
    """One attempt this worker claimed and has not yet finished or dropped."""

    key: Attempt
    task_name: str
    queue: str
    #: The row's JSON as text, handed to the child unread.
    args: str | None
    kwargs: str | None
    task: "Task | None"
    max_attempts: int
    #: Started runs of the job, this attempt's included (counted at the claim).
    runs: int
    #: This attempt's run is on record in the database (the claim counted it).
    counted: bool
    #: Claimed from an expired lease rather than from the queue.
    taken_over: bool
    lease_seconds: float
    worker_id: str
    #: Seconds from ``run_at`` to the claim (database clock), and the monotonic
    #: time of the claim: together the job's queue time when its body starts.
    waited: float = 0.0
    claimed_at: float = 0.0
    #: Monotonic time until which the lease surely holds: from just before the
    #: claim (or the last heartbeat that renewed it) plus the lease.
    lease_ends: float = float("inf")
    trace_context: str | None = None
    retry_policy: str | None = None
    #: Times the job snoozed before this claim.
    snoozes: int = 0
    #: Places under concurrency limits held with the claim (see ``CLAIM_LIMITED``).
    slots: int = 0
    #: The size of its arguments (what it weighs in the worker's memory).
    bytes: int = 0
    phase: Phase = Phase.ASSIGNED
    #: The child it was given to, its assignment number there, and the seconds
    #: of that child's work it was estimated at.
    child: int = -1
    seq: int = 0
    estimate: float = 0.0
    #: Its body started (known once it ended, or its process died after starting it).
    started: bool = False
    #: False once dropped: the worker stops heartbeating the attempt.
    beating: bool = True
    outcome: Outcome | None = None
    #: Why its body is being stopped (for the log line when it has).
    stop_reason: str = ""
    #: A heartbeat found a cancel requested; the attempt no longer holds its job.
    cancel_requested: bool = False
    lease_lost: bool = False
    #: Its finish met its row locked once (logged only the first time).
    finish_skipped: bool = field(default=False)

    @property
    def id(self) -> int:
        return self.key.id

    @property
    def attempt(self) -> int:
        return self.key.attempt

    @property
    def ctx(self) -> JobContext:
        """The attempt as signals and metrics see it (made when asked: most jobs never are)."""
        ctx = context_for(self, worker_id=self.worker_id, lease_seconds=self.lease_seconds, places=self.slots)
        if self.lease_lost:
            ctx.mark_lease_lost()
        if self.cancel_requested:
            ctx.mark_cancel_requested()
        return ctx


class HeldJobs:
    """The table of held jobs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._jobs: dict[Attempt, HeldJob] = {}
        self.claimed = 0
        self.counts = {
            "claimed": 0,
            "done": 0,
            "retried": 0,
            "snoozed": 0,
            "suspended": 0,
            "failed": 0,
            "cancelled": 0,
            "lost_leases": 0,
        }

    # -- claiming --------------------------------------------------------------

    def add(self, jobs: list[HeldJob]) -> None:
        """Hold newly claimed jobs (ASSIGNED, or SETTLED for a refusal)."""
        with self.lock:
            for job in jobs:
                self._jobs[job.key] = job
            self.claimed += len(jobs)
            self.counts["claimed"] += len(jobs)

    def ended_at_claim(self, status: str) -> None:
        """Count a job the claim ended instead of running (no runs left, or a pending cancel)."""
        with self.lock:
            self.counts[status] += 1

    # -- the moves (each returns False when the job was not in a phase that allows it)

    def settle(self, job: HeldJob, outcome: Outcome, *, started: bool) -> bool:
        """ASSIGNED -> SETTLED: its body ended (or never could start) with this outcome."""
        with self.lock:
            if job.phase is not Phase.ASSIGNED:
                return False
            job.phase = Phase.SETTLED
            job.outcome = outcome
            job.started = started
            return True

    def stop(self, job: HeldJob, outcome: Outcome | None, reason: str) -> bool:
        """ASSIGNED -> STOPPING: the worker decides the outcome (None: give the lease back)."""
        with self.lock:
            if job.phase is not Phase.ASSIGNED:
                return False
            job.phase = Phase.STOPPING
            job.outcome = outcome
            job.stop_reason = reason
            return True

    def stopped(self, job: HeldJob, *, started: bool) -> bool:
        """STOPPING -> SETTLED once its body has ended; False if it was dropped meanwhile.

        A STOPPING job whose outcome is None (to be given back) becomes
        DROPPED instead, and True means: give its lease back now.
        """
        with self.lock:
            if job.phase is not Phase.STOPPING:
                return False
            job.started = job.started or started
            if job.outcome is None:
                self._remove(job)
                return True
            job.phase = Phase.SETTLED
            return True

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
            if job.phase not in HOLDING:
                return False
            self._remove(job)
            self.counts["lost_leases"] += 1
            job.lease_lost = True
            return True

    def give_back(self, job: HeldJob) -> bool:
        """ASSIGNED or STOPPING -> DROPPED: its body never started, or is gone; release its lease.

        A job whose body never started is released with its claim undone
        (``sql.RELEASE``), so it no longer counts as claimed (``--max-jobs``).
        """
        with self.lock:
            if job.phase not in (Phase.ASSIGNED, Phase.STOPPING):
                return False
            self._remove(job)
            if not job.started:
                self.claimed -= 1
                self.counts["claimed"] -= 1
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
                status = (
                    "snoozed"
                    if job.outcome.snoozed
                    else "suspended"
                    if job.outcome.suspended
                    else job.outcome.status
                )
                self.counts[_COUNTED_AS.get(status, status)] += 1

    def unwritten(self, job: HeldJob, *, lost: bool) -> bool:
        """A SETTLED job's outcome will never be written (``lost``: refused as stale); else False."""
        with self.lock:
            if job.phase is not Phase.SETTLED:
                return False
            self._remove(job)
            if lost:
                self.counts["lost_leases"] += 1
                job.lease_lost = True
            return True

    def _remove(self, job: HeldJob) -> None:
        """Forget a held attempt; lock held."""
        job.phase = Phase.DROPPED
        job.beating = False
        self._jobs.pop(job.key, None)

    # -- looking ---------------------------------------------------------------

    def to_beat(self) -> list[HeldJob]:
        """The attempts whose lease must stay alive."""
        with self.lock:
            return [j for j in self._jobs.values() if j.beating]

    def in_phase(self, phase: Phase) -> list[HeldJob]:
        with self.lock:
            return [j for j in self._jobs.values() if j.phase is phase]

    def get(self, key: Attempt) -> HeldJob | None:
        with self.lock:
            return self._jobs.get(key)

    def busy(self) -> bool:
        """Some job is still held: a body runs or waits, or an outcome waits to be written."""
        with self.lock:
            return bool(self._jobs)

    def empty(self) -> bool:
        with self.lock:
            return not self._jobs

    def __len__(self) -> int:
        with self.lock:
            return len(self._jobs)


def refunds(jobs: list[HeldJob]) -> list[tuple[Attempt, bool]]:
    """Each given-back job's attempt, and whether its run is refunded: counted at its claim
    and never started (``store.release``)."""
    return [(job.key, job.counted and not job.started) for job in jobs]


def facts_of(job: HeldJob, worker_id: str) -> Facts:
    """The facts of a held attempt, for the outcomes the worker decides itself."""
    try:
        policy = outcomes.policy_of(job.task.retry if job.task else None, job.retry_policy)
    except ValueError:  # an unreadable stored policy: the task's own (the child refuses the row)
        policy = job.task.retry if job.task else None
    return outcomes.facts_for(job, policy, worker_id)
