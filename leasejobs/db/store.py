"""The queue's statements as calls: their parameters, their rows, their connections.

``leasejobs.db.sql`` holds the text of every statement; this module is the one
place that knows what each takes and returns. A claim comes back as
``ClaimedRow``s, a heartbeat as ``BeatRow``s, a finish as ``FinishRow``s,
never as tuples unpacked by position in several files. ``WorkerStore`` owns
the worker's three connections and the settings each statement needs.
"""

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.types.json import Jsonb

from leasejobs import conf
from leasejobs.db import sql
from leasejobs.db.connection import WorkerConnection
from leasejobs.db.rows import ErrorEntry
from leasejobs.db.sql import workers

#: How long a claim or finish waits for a table-level lock before it gives
#: up and tries again later (row locks are skipped, never waited for): a
#: migration's ALTER TABLE must not wedge the worker.
LOCK_TIMEOUT_MS = 5000

#: Every statement of the worker's claim, heartbeat and finish connections
#: is an index walk or a primary-key probe per job, and none of them may
#: become a sequential scan, whatever the table's statistics say. Right after
#: a burst into an empty table they still say "a few rows" (and a statement
#: planned generically then keeps that plan until the next VACUUM or ANALYZE
#: of the table): the claim read every queued row and sorted them (40 ms instead
#: of 2 ms per claim at 50,000 queued jobs), and a finish of 500 outcomes ran
#: a sequential scan of the whole table per outcome (2 to 3 s instead of
#: 20 ms, measured on 4 December in a steady flow of 2,000 jobs/s into an
#: empty table: outcomes waited seconds to be written, so the heartbeat
#: renewed thousands of them, and the flow fell to 500 jobs/s at three times
#: the WAL per job). These connections run nothing else, so the other plans
#: are simply taken away. The queue controls' tables are tiny and read by
#: sequential scan all the same (there is no other plan), which the
#: switched-off plans price at 10^10: JIT compilation would then start on
#: every statement (seconds on a loaded machine), so JIT is off too. So is
#: Memoize, a cache PostgreSQL puts in front of a lookup repeated with the same
#: key: these statements look each row up once (by ``ctid``, see
#: ``leasejobs.db.sql``), and the cache cost a finish 1.2 µs a row in misses.
#:
#: Each of these settings holds for every statement of its connection (see
#: ``WorkerConnection``: startup options on a direct connection, one
#: transaction's ``set_config(..., true)`` through a transaction pooler).
LOOKUP_PLANS = {"enable_seqscan": "off", "enable_bitmapscan": "off", "enable_memoize": "off", "jit": "off"}
CLAIM_SETTINGS = {**LOOKUP_PLANS, "lock_timeout": str(LOCK_TIMEOUT_MS)}
FINISH_SETTINGS = {**LOOKUP_PLANS, "lock_timeout": str(LOCK_TIMEOUT_MS)}

#: A limited claim looks at this many candidates per job it wants (at least
#: ``LIMITED_SCAN_MIN``): some candidates get no place (their key's places
#: were taken since the snapshot), and the others should still fill the children.
LIMITED_SCAN_FACTOR = 4
LIMITED_SCAN_MIN = 32


def heartbeat_settings(timeout_seconds: float) -> dict[str, str]:
    """A heartbeat never waits long: not on a lock, not on a slow server."""
    ms = str(max(1000, int(timeout_seconds * 1000)))
    return {**LOOKUP_PLANS, "statement_timeout": ms, "lock_timeout": ms}


class ClaimedRow(NamedTuple):
    """One row a claim returned: claimed for this worker, or ended by the claim."""

    id: int
    task_name: str
    #: The arguments as JSON text (the worker hands them on unread); None when
    #: they are too large to hold (``max_row_bytes``): the job cannot run.
    args: str | None
    kwargs: str | None
    attempt: int
    runs: int
    max_attempts: int
    queue: str
    #: None when claimed; "failed" (no runs left) or "cancelled" (cancel pending)
    #: when the claim ended the job instead of running it.
    ended: str | None
    last_error: str
    #: This claim counted the run (every row a worker claims goes to a child now).
    counted: bool
    #: The job was running under an expired lease (taken over), not queued.
    taken_over: bool
    #: Seconds from the job's ``run_at`` to this claim (database clock): its queue time.
    waited: float
    #: The W3C trace context stored at enqueue, as JSON text (None without OpenTelemetry).
    trace_context: str | None
    #: Times the job snoozed before this claim (``leasejobs.Snooze``).
    snoozes: int
    #: The retry policy stored by ``.using(retry=...)``, as JSON text, or None.
    retry_policy: str | None
    #: Places under concurrency limits (queue, key) this attempt holds; its
    #: heartbeats keep the job only while it holds them all.
    slots: int = 0
    #: The size of the arguments' JSON text.
    bytes: int = 0
    #: The job's priority and ``run_at`` (as PostgreSQL prints it, never read
    #: here): with ``id``, its place in claim order, where the worker's next
    #: claim of that priority may start (``CLAIM_AFTER``).
    priority: int = 0
    run_at: str | None = None


class ClaimKey(NamedTuple):
    """A job's place in claim order within its priority: a claim may start after it.

    ``run_at`` as the claim returned it (text, or a datetime from a test)."""

    run_at: str | datetime
    id: int


class BeatRow(NamedTuple):
    id: int
    attempt: int
    renewed: bool
    cancel_requested: bool
    #: False: the attempt no longer holds the job (taken over, ended, released).
    held: bool
    #: For a row skipped as locked: how many of its places were renewed all the same.
    places_renewed: int = 0


class FinishRow(NamedTuple):
    id: int
    attempt: int
    #: True: written. False: still this attempt's, but locked right now; try again.
    written: bool
    #: The status written (a retry becomes ``cancelled`` when a cancel is pending); None if not written.
    status: str | None


class Outcome(NamedTuple):
    """The result of one attempt, waiting to be written by the finisher.

    A named tuple: a child sends one per body to the worker, and a tuple
    pickles in a fraction of a dataclass's time.
    """

    status: str  # done, queued (retry or snooze), failed or cancelled
    #: The return value as JSON text (already checked), or None.
    result: str | None = None
    last_error: str | None = None
    error_entry: ErrorEntry | None = None
    retry_delay: float | None = None
    #: Queued by ``Snooze``: snoozes + 1, no error entry, and not a run.
    snoozed: bool = False
    #: Queued by a durable sleep or wait (``leasejobs.exceptions.Suspended``): no
    #: delay (the row's ``run_at``, set by the fenced sleep or wait, stays), no
    #: error entry, and not a run.
    suspended: bool = False

    @property
    def gives_back_run(self) -> bool:
        """A snooze or a suspend is not a run: its finish takes back the run its claim counted."""
        return self.snoozed or self.suspended


class Attempt(NamedTuple):
    """What every fenced write of one attempt names: the job and its token.

    A named tuple: the worker builds one per claimed job and keys its held
    jobs by it, and a frozen dataclass cost four times as much to build.
    """

    id: int
    attempt: int


def claim_params(
    *,
    limit: int,
    counted: int,
    queues: list[str] | None,
    lease_seconds: float,
    task_leases: dict[str, float],
    worker_id: str,
    job_id: int | None = None,
    max_bytes: int | None = None,
    after: Mapping[int, ClaimKey] | None = None,
) -> dict[str, Any]:
    """The parameters of ``sql.CLAIM`` (the worker's, ``leasejobs.testing``'s, the bench's EXPLAIN).

    ``max_bytes``: keep claimed rows, in claim order, while their arguments
    fit in this many bytes (the first row always); None: no bound.
    ``after``: for ``sql.CLAIM_AFTER``, where each priority's walk starts.
    """
    limit_bytes = int(conf.get("MAX_PAYLOAD_BYTES"))
    return {
        **key_params(after or {}),
        "job_id": job_id,
        "queues": queues,
        "limit": limit,
        "counted": counted,
        "lease_seconds": lease_seconds,
        "task_leases": Jsonb(task_leases),
        "worker_id": worker_id,
        "max_bytes": max_bytes if max_bytes is not None else 2**62,
        "max_row_bytes": max_row_bytes(limit_bytes),
    }


def key_params(after: Mapping[int, ClaimKey]) -> dict[str, list[Any]]:
    """Per-priority keys as ``CLAIM_AFTER`` and ``FRONT_LOOK`` take them: three arrays.

    The times as text: a claim returns its rows' as text and a NOTIFY's are read
    into datetimes (``listener.parse_payload``), and psycopg dumps no list of both."""
    keys = sorted(after.items(), reverse=True)
    return {
        "after_priorities": [priority for priority, _ in keys],
        "after_run_ats": [
            key.run_at if isinstance(key.run_at, str) else key.run_at.isoformat() for _, key in keys
        ],
        "after_ids": [key.id for _, key in keys],
    }


def front_look(
    conn: WorkerConnection, after: Mapping[int, ClaimKey], queues: list[str] | None
) -> list[tuple[int, ClaimKey]]:
    """``FRONT_LOOK`` on ``conn`` (the front look's, set up as the claim's): per priority,
    the first job a claim could take now at or before its key in ``after`` (any, for a
    priority not in it), as ``(priority, key)``."""
    rows = conn.execute(sql.FRONT_LOOK, {**key_params(after), "queues": queues, "job_id": None})
    return [(priority, ClaimKey(run_at, job_id)) for priority, run_at, job_id in rows]


def max_row_bytes(max_payload_bytes: int) -> int:
    """The largest arguments a worker takes into memory: twice what enqueue accepts.

    PostgreSQL prints jsonb with a blank after each comma and colon, so the
    text of an accepted payload can be larger than the JSON enqueue measured.
    A row larger than this (written by another producer, or by SQL) fails
    alone instead of filling the worker's memory.
    """
    return 2 * max_payload_bytes


def finish_params(
    batch: Sequence[tuple[Attempt, Outcome, int]], worker_id: str, *, slotted: bool = False
) -> dict[str, Any]:
    """The parameters of ``sql.FINISH`` for (attempt, outcome, run delta) triples.

    ``slotted``: some attempt of the batch may hold places under a limit, to be freed.
    """
    outcomes = [o for _, o, _ in batch]
    return {
        "ids": array_literal([a.id for a, _, _ in batch]),
        "attempts": array_literal([a.attempt for a, _, _ in batch]),
        "statuses": array_literal([o.status for o in outcomes]),
        "results": [o.result for o in outcomes],
        "last_errors": [o.last_error for o in outcomes],
        "error_entries": [_jsonb(o.error_entry) for o in outcomes],
        "retry_delays": array_literal([o.retry_delay for o in outcomes]),
        "run_deltas": array_literal([delta for _, _, delta in batch]),
        "snoozed": array_literal([o.snoozed for o in outcomes]),
        "worker_id": worker_id,
        "channel": conf.get("NOTIFY_CHANNEL"),
        "slotted": slotted,
    }


def array_literal(values: Sequence[int | float | bool | str | None]) -> str:
    """A PostgreSQL array literal of numbers, booleans or plain words (statuses); None is NULL.

    psycopg adapts a list element by element in Python: for the finish's
    arrays of numbers and statuses that was about 8 µs of the worker's time
    per job, a tenth of it; their literal is one join. The statement casts it
    (``%(ids)s::bigint[]``). Never for free text: it is not quoted.
    """
    if all(type(v) is int or type(v) is str for v in values):
        return "{" + ",".join(map(str, values)) + "}"  # ids, attempts, statuses: the common arrays
    return "{" + ",".join(map(_element, values)) + "}"


def _element(value: int | float | bool | str | None) -> str:
    """One element: None is NULL; a boolean is 1 or 0, which ``boolean[]`` and ``int[]`` both read."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def run_delta(*, started: bool, counted: bool, snoozed: bool) -> int:
    """How a finish changes ``runs``: the run is counted once, when its body started.

    +1 for a started run not counted yet, -1 for a run counted at the claim
    whose body never started, and -1 more for a snooze (a snooze is not a run).
    """
    return int(started) - int(counted) - int(snoozed)


#: How often a release tries a row it found locked, and how long it waits between tries.
RELEASE_TRIES = 10
RELEASE_RETRY_SECONDS = 0.02


class WorkerStore:
    """The worker's statements on its own connections (claim, heartbeat, finish).

    Each connection runs one statement per call as its own transaction and
    reconnects after failures; callers decide when to try again.
    """

    def __init__(self, worker_id: str, *, heartbeat_timeout: float, pooled: bool = False) -> None:
        """``pooled``: the queue database is reached through a transaction pooler."""
        self.worker_id = worker_id
        self._claim = WorkerConnection("claim", worker_id, settings=CLAIM_SETTINGS, pooled=pooled)
        self._beat = WorkerConnection(
            "heartbeat", worker_id, settings=heartbeat_settings(heartbeat_timeout), pooled=pooled
        )
        self._finish = WorkerConnection("finish", worker_id, settings=FINISH_SETTINGS, pooled=pooled)
        #: A heartbeat never writes a row a finish or release of this worker is
        #: writing (each would find the other's rows locked and skip them: a
        #: finish skipped waits for its next try, a release skipped leaves its
        #: lease to run out). A heartbeat leaves those attempts out (they are
        #: ending) and never waits; a finish or release waits only for a
        #: heartbeat that holds some of its rows, one short statement.
        self._rows = threading.Condition()
        self._ending: set[Attempt] = set()
        self._beating: set[Attempt] = set()
        #: Finishes (the finisher) and releases (the claimer, the stop) share a connection.
        self._finishing = threading.Lock()

    def claim(
        self,
        *,
        limit: int,
        counted: int,
        queues: list[str] | None,
        lease_seconds: float,
        task_leases: dict[str, float],
        limited: bool = False,
        max_bytes: int | None = None,
        after: Mapping[int, ClaimKey] | None = None,
        via: WorkerConnection | None = None,
    ) -> list[ClaimedRow]:
        """Claim up to ``limit`` jobs; the first ``counted`` count their run now.

        ``limited``: jobs under queue or key limits, each with its places
        (``CLAIM_LIMITED``), instead of the plain jobs (``CLAIM``).
        ``max_bytes``: see ``claim_params``. ``after``: walk each of these
        priorities on from its key (``CLAIM_AFTER``), not from the front.
        ``via``: a connection set up with ``CLAIM_SETTINGS`` to claim on (the
        listener's, ``leasejobs.worker.listener``) instead of the claim connection.
        """
        params = claim_params(
            limit=limit,
            counted=counted,
            queues=queues,
            lease_seconds=lease_seconds,
            task_leases=task_leases,
            worker_id=self.worker_id,
            max_bytes=max_bytes,
            after=after,
        )
        if limited:
            params["scan"] = max(limit * LIMITED_SCAN_FACTOR, LIMITED_SCAN_MIN)
            statement = sql.CLAIM_LIMITED
        else:
            statement = sql.CLAIM_AFTER if after else sql.CLAIM
        rows = (via or self._claim).execute(statement, params)
        return [ClaimedRow._make(row) for row in rows]

    def limits_apply(self, queues: list[str] | None) -> tuple[list[str], bool]:
        """``(limited queues, keys in use)``: the queues this worker serves with a limit, not paused."""
        limited, keys = self._claim.execute(sql.LIMITS_APPLY, {"queues": queues})[0]
        return list(limited), bool(keys)

    def pending_retries(self, queues: list[str] | None) -> tuple[int, float]:
        """``(count, seconds until the first is due)`` of the retries and snoozes of these queues."""
        count, next_in = self._claim.execute(sql.PENDING_RETRIES, {"queues": queues})[0]
        return int(count), float(next_in or 0.0)

    def heartbeat(
        self, jobs: Sequence[tuple[Attempt, float]], slots: Sequence[int] | None = None
    ) -> list[BeatRow]:
        """Extend the lease of each (attempt, lease seconds); ``slots``: places each holds.

        Attempts whose finish or release is being written are left out (and
        not in the rows returned): their lease ends with that statement.
        """
        with self._rows:
            keep = [i for i, (a, _) in enumerate(jobs) if a not in self._ending]
            if len(keep) < len(jobs):
                jobs = [jobs[i] for i in keep]
                slots = None if slots is None else [slots[i] for i in keep]
            self._beating = {a for a, _ in jobs}
        try:
            rows = self._beat_rows(jobs, slots) if jobs else []
        finally:
            with self._rows:
                self._beating = set()
                self._rows.notify_all()
        return [BeatRow._make(row) for row in rows]

    @contextlib.contextmanager
    def _writing_ends(self, attempts: Iterable[Attempt]) -> Iterator[None]:
        """The finish connection, open, with these attempts marked as being ended.

        Opened before they are marked: a connection refused waits out its
        backoff (up to 5 s) while the heartbeat still renews their leases. Marked
        while it waited, a finish that could not reconnect let them run out and
        the job ran again.
        """
        with self._finishing:
            self._finish.open()
            with self._ending_rows(attempts):
                yield

    @contextlib.contextmanager
    def _ending_rows(self, attempts: Iterable[Attempt]) -> Iterator[None]:
        """Mark these attempts as being ended (finish, release), once no heartbeat writes them."""
        mine = set(attempts)
        with self._rows:
            self._rows.wait_for(lambda: not (self._beating & mine))
            self._ending |= mine
        try:
            yield
        finally:
            with self._rows:
                self._ending -= mine

    def _beat_rows(
        self, jobs: Sequence[tuple[Attempt, float]], slots: Sequence[int] | None
    ) -> list[tuple[Any, ...]]:
        return self._beat.execute(
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

    def finish(
        self,
        batch: Sequence[tuple[Attempt, Outcome, int]],
        *,
        slotted: bool = True,
        skipping: bool = False,
    ) -> list[FinishRow]:
        """Write outcomes; each (attempt, outcome, change to ``runs``: see ``run_delta``).

        ``slotted`` false: no attempt of the batch holds a place under a limit.
        The rows are written as one UPDATE (``sql.FINISH_WAITING``), which
        waits a moment for a row another transaction holds; past that moment
        (or in a deadlock) the batch is written again with ``sql.FINISH``,
        which skips such a row and reports it unwritten. An outcome
        ``FINISH_WAITING`` did not write (a stale attempt, or a row another
        transaction changed while it waited) is tried with ``sql.FINISH``,
        which tells the two apart. ``skipping``: go straight to ``sql.FINISH``
        (the batch holds a row skipped before: waiting for it again would
        hold each batch up while it stays locked).
        """
        with self._writing_ends(a for a, _, _ in batch):
            written: list[FinishRow] = []
            if not skipping:
                try:
                    rows = self._finish.execute(
                        sql.FINISH_WAITING, finish_params(batch, self.worker_id, slotted=slotted)
                    )
                    written = [FinishRow._make(row) for row in rows]
                    if len(written) == len(batch):
                        return written
                    done = {(row.id, row.attempt) for row in written}
                    batch = [b for b in batch if (b[0].id, b[0].attempt) not in done]
                except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
                    pass  # a row held elsewhere: write around it
            rows = self._finish.execute(sql.FINISH, finish_params(batch, self.worker_id, slotted=slotted))
        return written + [FinishRow._make(row) for row in rows]

    def release(
        self, jobs: Sequence[tuple[Attempt, bool]], *, slotted: bool = True, tries: int = RELEASE_TRIES
    ) -> set[Attempt]:
        """Give leases back; each (attempt, refund the run counted at its claim).

        ``slotted`` false: no attempt given back holds a place under a limit.
        A row skipped as locked is tried again up to ``tries`` times in all, a
        fiftieth of a second apart (a fifth of a second at the default):
        another worker's claim that walked past it a moment ago may hold its
        lock until that claim commits, and a lease left to run out would keep
        its run counted and its job waiting a whole lease.
        """
        released: set[Attempt] = set()
        left = list(jobs)
        for again in range(tries):
            if again:
                time.sleep(RELEASE_RETRY_SECONDS)
            with self._writing_ends(a for a, _ in left):
                rows = self._release_rows(left, slotted)
            released |= {Attempt(job_id, attempt) for job_id, attempt in rows}
            left = [job for job in left if job[0] not in released]
            if not left:
                break
        return released

    def still_held(self, attempts: Sequence[Attempt]) -> set[Attempt]:
        """Which of these attempts this worker still holds (``sql.STILL_HELD``: no lock waited for)."""
        with self._finishing:
            rows = self._finish.execute(
                sql.STILL_HELD,
                {
                    "ids": [a.id for a in attempts],
                    "attempts": [a.attempt for a in attempts],
                    "worker_id": self.worker_id,
                },
            )
        return {Attempt(job_id, attempt) for job_id, attempt in rows}

    def _release_rows(self, jobs: Sequence[tuple[Attempt, bool]], slotted: bool) -> list[tuple[Any, ...]]:
        return self._finish.execute(
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

    def alive(self, interval: float, *, first: bool) -> None:
        """Keep this worker's ``leasejobs_worker`` row fresh (see ``leasejobs.db.sql.workers``).

        ``first``: also forget workers that died without a clean stop a day ago.
        """
        if first:
            self._beat.execute(workers.FORGET_DEAD)
        self._beat.execute(
            workers.ALIVE,
            {
                "worker_id": self.worker_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "interval": interval,
            },
        )

    def gone(self) -> None:
        """At a clean stop: this worker's row goes."""
        self._beat.execute(workers.GONE, {"worker_id": self.worker_id})

    def close(self) -> None:
        for conn in (self._claim, self._beat, self._finish):
            conn.close()


def _jsonb(value: ErrorEntry | None) -> Jsonb | None:
    return None if value is None else Jsonb(value)
