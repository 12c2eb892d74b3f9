"""The worker's scheduling rules, as pure functions.

Nothing here touches a thread, a clock or the database: each rule takes the
numbers it depends on and returns a decision, so each is tested on its own
(``tests/unit/test_worker_rules.py``). What a failure becomes (retry, fail,
snooze, discard, and the retry's delay) is ``leasejobs.jobs.retry.decide``.
"""

import math

#: How far past its estimate a body sends the jobs waiting behind it back to the
#: queue when no other child is idle: well within a pause's second, well past a
#: body descheduled for a moment on a busy machine.
SLOWED_TASK_SECONDS = 0.25

#: A job given to a child ahead of its turn starts within this much of the
#: child's work (and of its lease): enough for a child of short jobs never to
#: wait for a claim, few enough that a worker killed from outside leaves
#: little counted and not run (docs/guarantees.md).
CHILD_QUEUE_SECONDS = 0.02
CHILD_QUEUE_LEASE_SHARE = 0.1

#: An explicit ``--heartbeat`` is capped at this share of the shortest lease
#: held: one late heartbeat must never let a lease run out.
HEARTBEAT_MAX_LEASE_SHARE = 0.5

#: A body whose lease was found lost is interrupted at once and killed after
#: this long (at most half a heartbeat interval): it must not run beside the
#: attempt that holds the job now.
LOST_GRACE_SECONDS = 1.0

#: At the end of a stop's ``--grace``, a body still running is interrupted
#: and killed after this long, then its lease is given back.
SHUTDOWN_KILL_SECONDS = 1.0


def child_depth(*, mean_duration: float | None, prefetch: int, children: int, lease_seconds: float) -> int:
    """How many jobs one child may hold at once: the one it runs and those it will start next.

    One until a body has run (``mean_duration`` None), or with ``prefetch``
    0; else as many more as it will start within ``CHILD_QUEUE_SECONDS``
    (and a tenth of the lease), at most its share of ``prefetch``. Every job a
    child holds has its run counted: a job waits in a child only as long as
    the child needs to reach it.
    """
    if not prefetch or mean_duration is None:
        return 1
    wait = min(CHILD_QUEUE_SECONDS, lease_seconds * CHILD_QUEUE_LEASE_SHARE)
    ahead = int(wait / max(mean_duration, 1e-6))
    return 1 + min(ahead, prefetch // max(1, children))


def work_left(estimate: float, running_for: float) -> tuple[float, int]:
    """A running body's estimated work left, and 1 if it should end within
    ``CHILD_QUEUE_SECONDS`` (else 0).

    Its time so far counts off its estimate (its task's measured mean) while
    it runs within it, or past it by less than ``CHILD_QUEUE_SECONDS`` (a
    mean is no bound: half the bodies run longer, and the job claimed for
    this one must still find room as it arrives); further past it, the body
    may run on for any time (a task that slowed down): its child has no room
    left, and nothing more is to wait behind it. So a child of 50 ms jobs gets its next one in the last
    20 ms of its body, not after a claim that its body's end set off.
    """
    left = estimate - running_for
    if left < -CHILD_QUEUE_SECONDS:
        return math.inf, 0
    left = max(left, 0.0)
    return left, int(left <= CHILD_QUEUE_SECONDS)


def child_budget(lease_seconds: float) -> float:
    """The most estimated work a child may hold besides an idle child's first job: 20 ms,
    and a tenth of the job's lease."""
    return min(CHILD_QUEUE_SECONDS, lease_seconds * CHILD_QUEUE_LEASE_SHARE)


def claim_room(outstanding: list[int], depth: int, *, claimed: int, max_jobs: int | None) -> int:
    """How many jobs to claim now for children holding ``outstanding`` jobs each (0: not yet).

    A claim fills every child up to ``depth``, once some child is idle or
    down to half of it: one statement for many rows, and no child waits for
    one. ``--max-jobs`` caps it.
    """
    room = sum(max(0, depth - n) for n in outstanding)
    due = any(n == 0 or n <= depth // 2 for n in outstanding)
    if max_jobs is not None:
        room = min(room, max_jobs - claimed)
    return room if due and room > 0 else 0


def watchdog_margin(lease_seconds: float) -> float:
    """How long before a lease's end the zygote kills a body that is still running under it.

    The lease a worker knows runs from just before its claim or heartbeat
    was sent, which is before the database stamped it; the margin covers the
    zygote's look every 50 ms and the kill itself.
    """
    return min(0.25, 0.1 * lease_seconds)


def stop_reason(flags: int) -> str:
    """Why a body is being stopped, from its slot's flags (``leasejobs.worker.slots``)."""
    if flags & 4:
        return "it ran past its timeout_seconds"
    if flags & 1:
        return "its lease was lost: another attempt may hold the job now"
    return "the worker is stopping and its grace period is over"


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
