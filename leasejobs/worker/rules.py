"""The worker's scheduling rules, as pure functions.

Nothing here touches a thread, a clock or the database: each rule takes the
numbers it depends on and returns a decision, so each is tested on its own
(``tests/unit/test_worker_rules.py``). What a failure becomes (retry, fail,
snooze, discard, and the retry's delay) is ``leasejobs.retry.decide``.
"""

import math

#: A buffered job should start within this share of its lease (and within
#: ``PREFETCH_MAX_WAIT_SECONDS``); the prefetch shrinks as jobs get slower.
#: A tenth of a second keeps the jobs of one burst spread over the workers
#: that are there to take them, yet lets a worker claim hundreds of
#: millisecond jobs in one statement.
PREFETCH_LEASE_SHARE = 0.1
PREFETCH_MAX_WAIT_SECONDS = 0.1

#: An explicit ``--heartbeat`` is capped at this share of the shortest lease
#: held: one late heartbeat must never let a lease run out.
HEARTBEAT_MAX_LEASE_SHARE = 0.5


def prefetch_size(
    *, prefetch: int, concurrency: int, mean_duration: float | None, lease_seconds: float
) -> int:
    """How many claimed jobs may wait for a runner, given how long bodies take.

    Up to ``prefetch``, but only as many as the runners will start within a
    tenth of a second (and of the lease): a buffered job is claimed and
    heartbeated, yet nobody works on it, so with slow jobs it would only keep
    them from idle workers elsewhere. Until a body has run (``mean_duration``
    None), nothing is prefetched: a fresh worker claims free slots only.
    """
    if not prefetch or mean_duration is None:
        return 0
    wait = min(PREFETCH_MAX_WAIT_SECONDS, lease_seconds * PREFETCH_LEASE_SHARE)
    return min(prefetch, int(concurrency * wait / max(mean_duration, 1e-6)))


def claim_size(
    *, concurrency: int, prefetch: int, running: int, buffered: int, claimed: int, max_jobs: int | None
) -> tuple[int, int, int]:
    """``(room, worth, counted)`` for the next claim.

    ``room``: jobs to claim now (free slots plus free buffer). ``worth``: the
    least worth a statement; with a prefetch buffer a claim waits until half
    of it is free, so that a stream of short jobs is claimed many rows per
    statement. ``counted``: how many of the claimed rows go straight to an
    idle runner, so their run counts at the claim.
    """
    room = concurrency + prefetch - running - buffered
    worth = (concurrency + prefetch) // 2 if prefetch else 1
    if max_jobs is not None:
        left = max_jobs - claimed
        room, worth = min(room, left), min(worth, left)
    counted = max(0, min(room, concurrency - running - buffered))
    return room, max(1, worth), counted


def limited_claim_size(
    *, concurrency: int, running: int, buffered: int, claimed: int, max_jobs: int | None
) -> tuple[int, int]:
    """``(room, counted)`` for a claim of jobs under limits.

    Room for every runner not running a body, whatever the buffer holds: the
    buffer is short (``prefetch_size``), and counting it out would let a
    stream of plain jobs keep limited ones from ever being claimed on a busy
    worker. ``counted``: the rows that find a runner idle and start at once.
    """
    room = concurrency - running
    if max_jobs is not None:
        room = min(room, max_jobs - claimed)
    return max(0, room), max(0, min(room, concurrency - running - buffered))


def heartbeat_interval(option: float | None, shortest_lease: float) -> float:
    """Seconds between heartbeats while the shortest lease held is ``shortest_lease``.

    By default a third of it, so two heartbeats may fail before a lease runs
    out. An explicit ``--heartbeat`` is honoured up to half the lease.
    """
    if option is None:
        return shortest_lease / 3
    return min(option, shortest_lease * HEARTBEAT_MAX_LEASE_SHARE)


def timeout_deadline(started: float, timeout_seconds: float | None) -> float | None:
    """The monotonic time past which a body started at ``started`` has timed out."""
    if timeout_seconds is None or not math.isfinite(timeout_seconds):
        return None
    return started + timeout_seconds


def mean_duration(previous: float | None, elapsed: float) -> float:
    """The smoothed body duration after one more body took ``elapsed`` seconds."""
    return elapsed if previous is None else previous + (elapsed - previous) / 16


def vacuum_due(*, dead: int, live: int, floor: int, threshold: int, scale_factor: float) -> bool:
    """Whether enough dead row versions piled up since ``floor`` to VACUUM the job table.

    Autovacuum's rule (a threshold plus a share of the live rows), counted
    from ``floor``: the dead rows a VACUUM could not remove last time (an
    open transaction still sees them) or the count when this worker began
    watching. Counting from zero would VACUUM again and again, in vain,
    while an old snapshot holds them back.
    """
    return dead - floor > threshold + scale_factor * live


#: The first wait after a VACUUM in vain (or failed) before the next: more
#: than the 10 s a backend that went idle may take to report the rows it made
#: dead (PostgreSQL 15's statistics), which would otherwise look like new ones.
VACUUM_BACKOFF_SECONDS = 15.0
#: The longest wait.
VACUUM_BACKOFF_MAX_SECONDS = 60.0


def vacuum_in_vain(*, before: int, after: int) -> bool:
    """A VACUUM that left more than half of the dead rows it found: an old snapshot holds them."""
    return after * 2 > before


def vacuum_retry_after_skip(in_a_row: int) -> float:
    """Seconds to wait after ``in_a_row`` VACUUMs skipped for a taken lock: 5, 10, 20, ... a minute."""
    return min(VACUUM_BACKOFF_MAX_SECONDS, 5.0 * 2.0 ** min(in_a_row - 1, 10))


def vacuum_backoff(in_a_row: int) -> float:
    """Seconds to wait after ``in_a_row`` VACUUMs in vain or failed: 15, 30, then a minute each time."""
    return min(VACUUM_BACKOFF_MAX_SECONDS, VACUUM_BACKOFF_SECONDS * 2.0 ** min(in_a_row - 1, 10))
