"""Pieces of SQL that several statements share, written once.

The statements embed them with f-strings when the module is loaded: the text
the database receives is the same as when each was spelled out
(tests/unit/test_statements.py holds it to a snapshot)."""

#: Free the concurrency and key places (not rate places, which run out on
#: their own) of the attempts a statement wrote: the start of the UPDATE,
#: followed by the FROM and WHERE that name them.
FREE_PLACES = "UPDATE leasejobs_slot AS s SET job_id = NULL, attempt = NULL, held_until = NULL"


def held_places(source: str, alias: str) -> str:
    """The concurrency and key places the attempts of ``source`` (a CTE with ``id`` and
    ``attempt``) hold, as ``alias``: the source's columns and each place version's ``tid``,
    for an UPDATE of the places ``WHERE s.ctid = alias.tid``; nothing unless ``slotted``.

    One probe of the holder index per attempt; ``OFFSET 0`` keeps the planner from
    folding it into a join, which, while the places table's statistics said it was
    empty, read every place of a limit for each attempt (a finish of 20 jobs under a
    limit of 100,000 places: 386 ms instead of 1; docs/performance.md)."""
    return f"""(
        SELECT {alias}.*, p.tid FROM {source} AS {alias}
        CROSS JOIN LATERAL (
            SELECT s.ctid AS tid FROM leasejobs_slot AS s
            WHERE s.job_id = {alias}.id AND s.attempt = {alias}.attempt AND s.kind <> 'rate'
            OFFSET 0
        ) AS p
        WHERE %(slotted)s
    ) AS {alias}"""


def fence(alias: str, depth: int) -> str:
    """The fencing predicate: the job row ``j`` is still the attempt ``alias`` holds.

    It matches on id AND attempt AND holder AND running, so once another claim
    has bumped ``attempt`` (or the job left ``running``, or another worker holds
    it) a stale attempt matches nothing. ``depth``: the indent of the line the
    predicate starts on, for its second line.
    """
    return (
        f"WHERE j.id = {alias}.id AND j.attempt = {alias}.attempt AND j.leased_by = %(worker_id)s\n"
        f"{' ' * (depth + 2)}AND j.status = 'running'"
    )


def seconds_waited(run_at: str) -> str:
    """Seconds from ``run_at`` to this statement's time, as ``float8``; 0 for a
    ``run_at`` that is not finite (``'-infinity'``, written by SQL), whose
    difference PostgreSQL refuses: such a row must not fail the claim of every
    job beside it, nor put an endless wait into the queue-time metric."""
    return (
        f"CASE WHEN isfinite({run_at}) "
        f"THEN extract(epoch FROM statement_timestamp() - {run_at})::float8 ELSE 0 END"
    )


def notify_queues(source: str) -> str:
    """Wake the workers of each queue of the rows of ``source`` (a CTE with a ``queue``
    column), once per queue, when the transaction commits (``queue_payload``)."""
    return f"SELECT pg_notify(%(channel)s, queue || chr(31)) FROM (SELECT DISTINCT queue FROM {source}) AS q"


#: What separates a NOTIFY payload's fields: the ASCII unit separator. Every
#: payload leasejobs sends is a queue name, whatever it holds, then one of:
#: an empty field (news of the queue: ``queue_payload``); ``FRONT``
#: (``front_payload``); a job's priority, ``run_at`` and id, and ``LATER`` if
#: it is not due yet (``keyed_payload``). Read from the right
#: (``leasejobs.worker.listener.parse_payload``), the last field says which, so
#: a queue name holding the separator, or ending as a tag does, is read whole.
PAYLOAD_SEPARATOR = "\x1f"
#: The last field of a keyed payload whose job was not due at its INSERT: its
#: workers move a key back to it, and claim only if one moved.
LATER = "later"
#: A job due within this many seconds of its INSERT is announced though not due
#: yet (``keyed_payload``); one due later is found by the poll when due. Why a
#: bound: a NOTIFY costs its commit the notification queue's lock, which
#: producers committing at once wait for (docs/performance.md, "Figures behind
#: the code's choices"), and a request's transaction outlasts a short delay,
#: seldom a long one.
ANNOUNCED_LATER_SECONDS = 10

#: The one field after the queue name that asks its workers to walk from the
#: front (a queue resumed, its limits raised: its jobs may lie behind the keys).
FRONT = "front"


def announced(row: str = "") -> str:
    """Whether a job's NOTIFY is sent: it is due, or due soon (``ANNOUNCED_LATER_SECONDS``)."""
    r = f"{row}." if row else ""
    return f"{r}run_at <= statement_timestamp() + interval '{ANNOUNCED_LATER_SECONDS} s'"


def queue_payload(queue: str) -> str:
    """The NOTIFY payload of news of ``queue`` alone (a place freed, the queue paused)."""
    return f"{queue}{PAYLOAD_SEPARATOR}"


def front_payload(queue: str) -> str:
    """The NOTIFY payload that wakes ``queue``'s workers for a walk from the front.

    Why: while a queue is paused or at its limits, claims pass over its jobs and
    the keys move on past them; once it may run them again, only the front shows
    them (a walk due in milliseconds on a healthy database, 10 s under a pinned
    horizon)."""
    return f"{queue}{PAYLOAD_SEPARATOR}{FRONT}"


def keyed_payload(queue: str, row: str = "", *, due: bool = False) -> str:
    """The NOTIFY payload of a due job: its queue, then its place in claim order
    (priority, ``run_at`` with its zone, id), each after a unit separator.

    Why the place: a worker claims on from the last job it kept
    (``leasejobs.worker.claim_start``), so a job whose transaction commits after
    later jobs were claimed (a Django request that enqueues, then works on for
    30 ms) lies behind every worker's key, where only a walk from the front
    finds it: within 20 walks' time on a healthy database, 10 s under a pinned
    xmin horizon (docs/performance.md, "Jobs that commit late"). The payload
    arrives when the job is visible; the listener moves the key back to just
    before it. ``row``: the alias of the job's row (empty: its bare columns).

    One ``concat_ws``, the time as the session prints a ``timestamptz`` (ISO,
    with its offset): a chain of ``||`` over the same values, the time through
    ``to_char``, cost a single enqueue 74 µs more to parse and run than a bare
    queue name did, ``concat_ws`` 8 µs (pgbench, the variants interleaved).

    A job not due at its statement ends its payload with ``LATER``
    (``concat_ws`` skips the NULL of a due one): committed only once it was due,
    after later jobs were claimed, it lies behind the keys as a job committed
    late does; committed before it is due, it moves no key and wakes no claim.
    ``due``: the statement's jobs are all due (no field to decide). The
    statement sends the payload only for a job due within
    ``ANNOUNCED_LATER_SECONDS`` (``announced``)."""
    r = f"{row}." if row else ""
    later = "" if due else f", CASE WHEN {r}run_at > statement_timestamp() THEN '{LATER}' END"
    return f"concat_ws(chr(31), {queue}, {r}priority, {r}run_at, {r}id{later})"


def notify_places(source: str, channel: str = "%(channel)s") -> str:
    """Wake the workers of each queue of the due rows of ``source`` (a CTE with ``queue``,
    ``priority``, ``run_at`` and ``id``), with the place of its earliest row of each
    priority (``keyed_payload``), when the transaction commits.

    Why the place: these rows are jobs queued again (a lease released, a job
    retried or woken, a workflow's child made due) whose ``run_at`` may lie
    before the workers' keys; the place moves the keys back to them, where a
    bare queue name left them to the next walk from the front (10 s under a
    pinned horizon). One NOTIFY per queue and priority, not per row."""
    return (
        f"SELECT pg_notify({channel}, {keyed_payload('queue', due=True)}) FROM ("
        f"SELECT DISTINCT ON (queue, priority) queue, priority, run_at, id FROM {source} "
        "WHERE run_at <= clock_timestamp() ORDER BY queue, priority, run_at, id) AS q"
    )


#: The largest value of an ``integer`` column, less one: a row whose attempt or
#: run counter has reached it (written by hand, or by SQL) is neither claimed
#: nor retried again, since their ``+ 1`` would fail the whole statement.
COUNTER_END = 2**31 - 2

#: Never due: the ``run_at`` of a job waiting for its parents (a workflow's)
#: or for an event with no timeout (a durable wait). A finite timestamp, not
#: ``'infinity'``, which Python's datetime cannot hold (the admin and the ORM
#: read ``run_at``).
NEVER = "9999-01-01 00:00:00+00"
