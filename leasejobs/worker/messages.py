"""What the worker and its children tell each other (see ``channel`` for how).

Worker to child: ``(RUN, [BodyJob, ...])`` jobs to run in this order,
``(REVOKE, [seq, ...])`` jobs not to start after all, ``(STOP,)`` start no
more bodies and leave once the running one has ended.

Child to worker: ``(ENDED, [Ended, ...])`` bodies that ended, in the order
they ran; ``(UNSTARTED, [seq, ...])`` jobs it will not start (revoked, their
lease ran out while they waited, or it is leaving); ``(LEAVING, why)`` it
exits on its own (``--max-jobs-per-child``, ``--max-memory-per-child``, a
body the worker stopped), after which its socket closes.

Every job a child is given carries an assignment number (``seq``), unique
in that child and growing, by which both sides name it.

``BodyJob`` and ``Ended`` travel as plain tuples (``run_message``,
``ended_message``) and are rebuilt on arrival (``body_jobs``, ``endeds``):
pickle writes a named tuple through a Python call per object, and at tens of
thousands of jobs a second that was a tenth of the children's CPU per job.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from leasejobs.db.store import Outcome

RUN = "run"
REVOKE = "revoke"
STOP = "stop"
ENDED = "ended"
UNSTARTED = "unstarted"
LEAVING = "leaving"


class BodyJob(NamedTuple):
    """One claimed attempt, as a child needs it to run the body and decide its outcome."""

    seq: int
    id: int
    attempt: int
    task_name: str
    #: The row's JSON, as text: read by the child, never by the worker.
    args: str
    kwargs: str
    retry_policy: str | None
    trace_context: str | None
    runs: int
    max_attempts: int
    snoozes: int
    queue: str
    lease_seconds: float
    #: Monotonic time until which the claim's lease surely holds; a body
    #: that would start later does not start.
    lease_ends: float
    #: Places under limits the attempt holds (its fence checks them).
    places: int


class Ended(NamedTuple):
    """How one body ended."""

    seq: int
    #: None: the body let ``LeaseLost`` escape, or the worker stopped it.
    outcome: Outcome | None
    seconds: float
    #: The body started (False: its row could not run, e.g. unreadable arguments).
    started: bool
    #: What ``LeaseLost`` said, when the body let it escape.
    lost: str | None = None
    #: Its writes the fence refused (the worker's metrics count them).
    stale_writes: int = 0
    #: Threads the body left running: the child leaves, and the attempt ends
    #: only once the process (and what it still runs) is gone.
    strays: int = 0


def run_message(jobs: Sequence[tuple[Any, ...]]) -> tuple[str, list[tuple[Any, ...]]]:
    """``(RUN, jobs)`` as it is sent: each ``BodyJob`` (or its fields, as the worker builds them)
    as a plain tuple."""
    return (RUN, [tuple(job) for job in jobs])


def body_jobs(sent: list[tuple[Any, ...]]) -> list[BodyJob]:
    """The jobs of a RUN message as they arrived."""
    return [BodyJob._make(job) for job in sent]


def ended_message(reports: list[Ended]) -> tuple[str, list[tuple[Any, ...]]]:
    """``(ENDED, reports)`` as it is sent."""
    return (
        ENDED,
        [
            (
                e.seq,
                None if e.outcome is None else tuple(e.outcome),
                e.seconds,
                e.started,
                e.lost,
                e.stale_writes,
                e.strays,
            )
            for e in reports
        ],
    )


def endeds(sent: list[tuple[Any, ...]]) -> list[Ended]:
    """The reports of an ENDED message as they arrived."""
    return [
        Ended(seq, None if outcome is None else Outcome._make(outcome), seconds, started, lost, stale, strays)
        for seq, outcome, seconds, started, lost, stale, strays in sent
    ]
