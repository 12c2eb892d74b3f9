"""The queue's statements as calls: their parameters, their rows, their connections.

``leasejobs.sql`` holds the text of every statement; this module is the one
place that knows what each takes and returns. A claim comes back as
``ClaimedRow``s, a heartbeat as ``BeatRow``s, a finish as ``FinishRow``s,
never as tuples unpacked by position in several files. ``WorkerStore`` owns
the worker's three connections and the session settings each needs.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from psycopg.types.json import Jsonb

from leasejobs import conf, sql
from leasejobs.connection import WorkerConnection

#: How long a claim or finish waits for a table-level lock before it gives
#: up and tries again later (row locks are skipped, never waited for): a
#: migration's ALTER TABLE must not wedge the worker.
LOCK_TIMEOUT_MS = 5000

#: The claim must walk its partial index in claim order and stop after LIMIT
#: rows. Right after a bulk enqueue the table's statistics still say "a few
#: rows", and the planner then prefers to read every queued row and sort
#: them: 40 ms instead of 2 ms per claim at 50,000 queued jobs, and worse as
#: the queue grows. The claim connection runs nothing but the claim (and the
#: rare start mark, a primary-key probe), so it simply takes the other plans
#: away. The queue controls' tables are tiny and read by sequential scan
#: all the same (there is no other plan), which the switched-off plans price
#: at 10^10: JIT compilation would then start on every claim (seconds on a
#: loaded machine), so JIT is off on this connection.
CLAIM_SESSION = f"-c enable_seqscan=off -c enable_bitmapscan=off -c jit=off -c lock_timeout={LOCK_TIMEOUT_MS}"
FINISH_SESSION = f"-c lock_timeout={LOCK_TIMEOUT_MS}"

#: A limited claim looks at this many candidates per job it wants (at least
#: ``LIMITED_SCAN_MIN``): some candidates get no place (their key's places
#: were taken since the snapshot), and the others should still fill the runners.
LIMITED_SCAN_FACTOR = 4
LIMITED_SCAN_MIN = 32


def heartbeat_session(timeout_seconds: float) -> str:
    """A heartbeat never waits long: not on a lock, not on a slow server."""
    ms = max(1000, int(timeout_seconds * 1000))
    return f"-c statement_timeout={ms} -c lock_timeout={ms}"


class ClaimedRow(NamedTuple):
    """One row a claim returned: claimed for this worker, or ended by the claim."""

    id: int
    task_name: str
    args: Any
    kwargs: Any
    attempt: int
    runs: int
    max_attempts: int
    queue: str
    #: None when claimed; "failed" (no runs left) or "cancelled" (cancel pending)
    #: when the claim ended the job instead of running it.
    ended: str | None
    last_error: str
    #: This claim counted the run (the job goes straight to an idle runner).
    counted: bool
    #: The job was running under an expired lease (taken over), not queued.
    taken_over: bool
    #: Places under concurrency limits (queue, key) this attempt holds; its
    #: heartbeats keep the job only while it holds them all.
    slots: int = 0


class BeatRow(NamedTuple):
    id: int
    attempt: int
    renewed: bool
    cancel_requested: bool
    #: False: the attempt no longer holds the job (taken over, ended, released).
    held: bool


class FinishRow(NamedTuple):
    id: int
    attempt: int
    #: True: written. False: still this attempt's, but locked right now; try again.
    written: bool


@dataclass(slots=True)
class Outcome:
    """The result of one attempt, waiting to be written by the finisher."""

    status: str  # done, queued (retry), failed or cancelled
    #: The return value as JSON text (already checked), or None.
    result: str | None = None
    last_error: str | None = None
    error_entry: dict[str, Any] | None = None
    retry_delay: float | None = None


@dataclass(slots=True, frozen=True)
class Attempt:
    """What every fenced write of one attempt names: the job and its token."""

    id: int
    attempt: int


class WorkerStore:
    """The worker's statements on its own connections (claim, heartbeat, finish).

    Each connection runs one statement per call as its own transaction and
    reconnects after failures; callers decide when to try again.
    """

    def __init__(self, worker_id: str, *, heartbeat_timeout: float) -> None:
        self.worker_id = worker_id
        self._claim = WorkerConnection("claim", worker_id, session_settings=CLAIM_SESSION)
        self._beat = WorkerConnection(
            "heartbeat", worker_id, session_settings=heartbeat_session(heartbeat_timeout)
        )
        self._finish = WorkerConnection("finish", worker_id, session_settings=FINISH_SESSION)

    def claim(
        self,
        *,
        limit: int,
        counted: int,
        queues: list[str] | None,
        lease_seconds: float,
        task_leases: dict[str, float],
        limited: bool = False,
    ) -> list[ClaimedRow]:
        """Claim up to ``limit`` jobs; the first ``counted`` count their run now.

        ``limited``: jobs under queue or key limits, each with its places
        (``CLAIM_LIMITED``), instead of the plain jobs (``CLAIM``).
        """
        params = {
            "queues": queues,
            "limit": limit,
            "counted": counted,
            "lease_seconds": lease_seconds,
            "task_leases": Jsonb(task_leases),
            "worker_id": self.worker_id,
        }
        if limited:
            params["scan"] = max(limit * LIMITED_SCAN_FACTOR, LIMITED_SCAN_MIN)
        rows = self._claim.execute(sql.CLAIM_LIMITED if limited else sql.CLAIM, params)
        return [ClaimedRow(*row) for row in rows]

    def limits_apply(self, queues: list[str] | None) -> tuple[list[str], bool]:
        """``(limited queues, keys in use)``: the queues this worker serves with a limit, not paused."""
        limited, keys = self._claim.execute(sql.LIMITS_APPLY, {"queues": queues})[0]
        return list(limited), bool(keys)

    def mark_started(self, job: Attempt) -> bool:
        """Count the run of a buffered job before its body starts; False if no longer held."""
        rows = self._claim.execute(
            sql.MARK_STARTED, {"id": job.id, "attempt": job.attempt, "worker_id": self.worker_id}
        )
        return bool(rows)

    def heartbeat(
        self, jobs: Sequence[tuple[Attempt, float]], slots: Sequence[int] | None = None
    ) -> list[BeatRow]:
        """Extend the lease of each (attempt, lease seconds); ``slots``: places each holds."""
        rows = self._beat.execute(
            sql.HEARTBEAT,
            {
                "ids": [a.id for a, _ in jobs],
                "attempts": [a.attempt for a, _ in jobs],
                "lease_seconds": [lease for _, lease in jobs],
                "slots": list(slots) if slots is not None else [0] * len(jobs),
                "slotted": slots is not None and any(slots),
                "worker_id": self.worker_id,
            },
        )
        return [BeatRow._make(row) for row in rows]

    def finish(
        self, batch: Sequence[tuple[Attempt, Outcome, bool]], *, slotted: bool = True
    ) -> list[FinishRow]:
        """Write outcomes; each (attempt, outcome, count the run now).

        ``slotted`` false: no attempt of the batch holds a place under a limit.
        """
        rows = self._finish.execute(
            sql.FINISH,
            {
                "ids": [a.id for a, _, _ in batch],
                "attempts": [a.attempt for a, _, _ in batch],
                "statuses": [o.status for _, o, _ in batch],
                "results": [o.result for _, o, _ in batch],
                "last_errors": [o.last_error for _, o, _ in batch],
                "error_entries": [_jsonb(o.error_entry) for _, o, _ in batch],
                "retry_delays": [o.retry_delay for _, o, _ in batch],
                "count_runs": [int(count) for _, _, count in batch],
                "worker_id": self.worker_id,
                "channel": conf.get("NOTIFY_CHANNEL"),
                "slotted": slotted,
            },
        )
        return [FinishRow._make(row) for row in rows]

    def release(self, jobs: Sequence[tuple[Attempt, bool]], *, slotted: bool = True) -> set[Attempt]:
        """Give leases back; each (attempt, refund the run counted at its claim).

        ``slotted`` false: no attempt given back holds a place under a limit.
        """
        rows = self._finish.execute(
            sql.RELEASE,
            {
                "ids": [a.id for a, _ in jobs],
                "attempts": [a.attempt for a, _ in jobs],
                "refunds": [int(refund) for _, refund in jobs],
                "worker_id": self.worker_id,
                "channel": conf.get("NOTIFY_CHANNEL"),
                "slotted": slotted,
            },
        )
        return {Attempt(job_id, attempt) for job_id, attempt in rows}

    def close(self) -> None:
        for conn in (self._claim, self._beat, self._finish):
            conn.close()


def _jsonb(value: dict[str, Any] | None) -> Jsonb | None:
    return None if value is None else Jsonb(value)
