"""Every call leasejobs makes on Django's connection, one function each.

Enqueue and the side-effect fence run here so that they join the caller's
transaction (a rolled-back transaction leaves no job and no side effect);
the admin, bulk changes, pruning, queue controls, the charts and the
figures run here because Django's connection is the one those callers
have. Each function keeps the transaction its caller had: ``atomic`` where
the statements must commit together, autocommit (or the caller's
transaction) where one statement is its own. The worker's own connections
are ``leasejobs.db.store``'s; the statements' texts are ``leasejobs.db.sql``'s.

Functions named ``*_transaction`` open a transaction and yield its cursor,
for callers whose own logic runs between the statements (the side-effect
block, the charts' stored points); the functions that take a ``cursor`` run
in it.
"""

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from django.db import connections, transaction

from leasejobs.conf import db_alias
from leasejobs.db import sql
from leasejobs.db.sql import connections as conn_sql
from leasejobs.db.sql import prune, queues, steps, workers
from leasejobs.db.sql import workflows as workflow_sql
from leasejobs.db.sql.fragments import front_payload, queue_payload

Row = tuple[Any, ...]


def _cursor() -> Any:
    return connections[db_alias()].cursor()


def _atomic() -> Any:
    return transaction.atomic(using=db_alias())


# -- workflows (the caller's transaction) ---------------------------------------


def create_workflow(name: str) -> int:
    """Insert a workflow row; its id."""
    return int(_rows(workflow_sql.CREATE_WORKFLOW, {"name": name})[0][0])


def add_node(params: Mapping[str, Any]) -> Row | None:
    """Make a job just enqueued a workflow node (``ADD_NODE``); (id, run_at), or None if refused."""
    rows = _rows(workflow_sql.ADD_NODE, params)
    return rows[0] if rows else None


def parent_results(job_id: int) -> list[Row]:
    """(parent id, result as JSON text or None) for each parent of ``job_id``."""
    return _rows(workflow_sql.PARENT_RESULTS, {"id": job_id})


def workflow_graph(workflow_id: int) -> tuple[list[Row], list[Row]]:
    """A workflow's nodes and edges (``WORKFLOW_NODES``, ``WORKFLOW_EDGES``)."""
    params = {"workflow_id": workflow_id}
    return _rows(workflow_sql.WORKFLOW_NODES, params), _rows(workflow_sql.WORKFLOW_EDGES, params)


# -- enqueue (the caller's transaction) -----------------------------------------


def _key_transaction(key: tuple[str, int] | None) -> contextlib.AbstractContextManager[Any]:
    """The job and its concurrency key's places in one transaction, even outside ``atomic()``.

    Autocommit would commit the job first: a process killed between the two
    statements would leave a job whose key has no places, never claimed.
    """
    if key is None:
        return contextlib.nullcontext()
    return transaction.atomic(using=db_alias(), savepoint=False)


def _key_places(cursor: Any, key: tuple[str, int] | None) -> None:
    if key is not None:
        cursor.execute(sql.KEY_PLACES, {"key": key[0], "limit": key[1]})


def enqueue(statement: str, params: Mapping[str, Any], key: tuple[str, int] | None) -> Row | None:
    """Insert one job (``ENQUEUE`` or ``ENQUEUE_PLAIN``) and the places of its concurrency
    ``key`` (name, limit); None when its idempotency key was used already."""
    with _key_transaction(key), _cursor() as cursor:
        cursor.execute(statement, params)
        row: Row | None = cursor.fetchone()
        _key_places(cursor, key)
    return row


def enqueue_many(params: Mapping[str, Any], key: tuple[str, int] | None) -> Row:
    """Insert many jobs in one statement (``BULK_ENQUEUE``), and their key's places."""
    with _key_transaction(key), _cursor() as cursor:
        cursor.execute(sql.BULK_ENQUEUE, params)
        row: Row = cursor.fetchone()
        _key_places(cursor, key)
    return row


# -- the side-effect fence (the job body's transaction) -------------------------


@contextlib.contextmanager
def side_effect_transaction() -> Iterator[Any]:
    """The transaction of one ``ctx.side_effect`` block (or durable step), and its cursor."""
    with _atomic(), _cursor() as cursor:
        yield cursor


def fence_check(cursor: Any, job_id: int) -> Row | None:
    """Lock the job row and read its token, state, holder and places (``FENCE_CHECK``)."""
    cursor.execute(sql.FENCE_CHECK, {"job_id": job_id})
    row: Row | None = cursor.fetchone()
    return row


def record_side_effect(cursor: Any, job_id: int, key: str, token: int, data_json: str | None) -> bool:
    """Record the side effect unless its key exists; whether this call recorded it."""
    cursor.execute(
        sql.RECORD_SIDE_EFFECT, {"job_id": job_id, "key": key, "fencing_token": token, "data": data_json}
    )
    return cursor.fetchone() is not None


def renew_lease(cursor: Any, fence: Mapping[str, Any], lease_seconds: float) -> Row | None:
    """Renew the lease and places as the block ends: (jobs renewed, places renewed)."""
    cursor.execute(sql.RENEW_LEASE, {**fence, "lease_seconds": lease_seconds})
    row: Row | None = cursor.fetchone()
    return row


# -- durable steps and events (the body's fenced transaction, the sender's) -----


def read_steps(job_id: int) -> list[Row]:
    """Every step row of a job: (name, kind, attempt, result text, event key, done)."""
    return _rows(steps.STEPS, {"job_id": job_id})


def record_step(cursor: Any, params: Mapping[str, Any]) -> str:
    """Store a completed step's JSON result (``RECORD_STEP``); the result as ``jsonb`` keeps
    it, which every later attempt reads back."""
    cursor.execute(steps.RECORD_STEP, params)
    text: str = cursor.fetchone()[0]
    return text


def record_sleep(cursor: Any, params: Mapping[str, Any]) -> None:
    """Record a sleep and make the job due when it ends (``SLEEP``)."""
    cursor.execute(steps.SLEEP, params)


def lock_event_key(cursor: Any, key: str) -> None:
    """Serialise with every wait and send of this event key until the transaction ends."""
    cursor.execute(steps.LOCK_EVENT_KEY, {"key": key})


def look_event(cursor: Any, params: Mapping[str, Any]) -> Row:
    """(event id or None, payload text, database clock) of the event a job's wait gets: its
    key's, unless sent after that wait's deadline (``LOOK_EVENT``)."""
    cursor.execute(steps.LOOK_EVENT, params)
    row: Row = cursor.fetchone()
    return row


def receive_event(cursor: Any, params: Mapping[str, Any]) -> None:
    """Store a received event as its wait's result (``RECEIVE``)."""
    cursor.execute(steps.RECEIVE, params)


def time_out_wait(cursor: Any, params: Mapping[str, Any]) -> bool:
    """Mark a wait past its deadline timed out; whether it was."""
    cursor.execute(steps.TIME_OUT, params)
    return bool(cursor.rowcount)


def wait_event(cursor: Any, params: Mapping[str, Any]) -> None:
    """Record a wait and make the job due at its deadline, or never (``WAIT``)."""
    cursor.execute(steps.WAIT, params)


def send_event(key: str, payload_json: str | None, channel: str) -> Row:
    """Insert an event and make its waiting jobs due, in the caller's transaction (or one
    of its own): (1 if stored, 0 if the key was sent before; jobs made due)."""
    with transaction.atomic(using=db_alias(), savepoint=False), _cursor() as cursor:
        cursor.execute(steps.LOCK_EVENT_KEY, {"key": key})
        cursor.execute(steps.SEND_EVENT, {"key": key, "payload": payload_json, "channel": channel})
        row: Row = cursor.fetchone()
    return row


def job_steps(job_id: int) -> list[Row]:
    """A job's steps for its admin page, oldest first."""
    return _rows(steps.JOB_STEPS, {"job_id": job_id})


def prune_events(cutoff: dt.datetime, limit: int) -> int:
    """Delete up to ``limit`` events sent before the cutoff; how many."""
    with _cursor() as cursor:
        cursor.execute(steps.PRUNE_EVENTS, {"cutoff": cutoff, "limit": limit})
        count: int = cursor.rowcount
    return count


# -- fenced changes: the admin's actions and bulk retry or cancel ---------------


def admin_change(statement: str, params: Mapping[str, Any]) -> list[Row]:
    """Run one fenced admin statement; its rows are (id, attempt, worker, ...) per changed job."""
    return _rows(statement, params)


def bulk_change(statement: str, params: Mapping[str, Any]) -> list[Row]:
    """One batch of a fenced bulk retry or cancel, in a transaction of its own."""
    with _atomic():
        return _rows(statement, params)


# -- pruning --------------------------------------------------------------------


def prune_cutoff(older_than: float) -> dt.datetime:
    """The database clock less ``older_than`` seconds."""
    with _cursor() as cursor:
        cursor.execute(prune.PRUNE_CUTOFF, [older_than])
        cutoff: dt.datetime = cursor.fetchone()[0]
    return cutoff


def prune_batch(cutoff: dt.datetime, limit: int, side_effects: bool) -> tuple[int, int, int]:
    """Delete the next batch in one transaction: (jobs picked, jobs deleted, side effects deleted)."""
    effects = 0
    with _atomic(), _cursor() as cursor:
        cursor.execute(prune.PRUNE_PICK, {"cutoff": cutoff, "limit": limit})
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0, 0, 0
        if side_effects:
            cursor.execute(prune.PRUNE_SIDE_EFFECTS, {"ids": ids})
            effects = cursor.rowcount
        cursor.execute(prune.PRUNE_JOBS, {"ids": ids})
        return len(ids), cursor.rowcount, effects


def prune_orphans(cutoff: dt.datetime, limit: int) -> int:
    """Delete up to ``limit`` unlinked side effects older than the cutoff; how many."""
    with _cursor() as cursor:
        cursor.execute(prune.PRUNE_ORPHAN_SIDE_EFFECTS, {"cutoff": cutoff, "limit": limit})
        count: int = cursor.rowcount
    return count


# -- queue controls -------------------------------------------------------------


def queue_limits() -> tuple[list[Row], int]:
    """Every queue row's (name, concurrency, rate count, rate seconds, from settings),
    and how many places are missing (read only)."""
    with _cursor() as cursor:
        cursor.execute(queues.QUEUE_LIMITS)
        rows: list[Row] = cursor.fetchall()
        cursor.execute(queues.MISSING_PLACES)
        (missing,) = cursor.fetchone()
    return rows, missing


def sync_queues(columns: Mapping[str, Mapping[str, Any]]) -> None:
    """Write the settings' queues (name: columns) and every queue's places, in one transaction."""
    with _atomic(), _cursor() as cursor:
        for name, values in sorted(columns.items()):
            cursor.execute(queues.SYNC_ROW, {"name": name, **values})
        cursor.execute(queues.DROP_UNSET, {"names": sorted(columns)})
        cursor.execute(queues.QUEUE_NAMES)
        for (name,) in cursor.fetchall():
            cursor.execute(queues.QUEUE_PLACES, {"name": name})


def set_paused(name: str, paused: bool, channel: str) -> None:
    """Pause or resume a queue and wake its workers, in one transaction."""
    with _atomic(), _cursor() as cursor:
        cursor.execute(queues.SET_PAUSED, {"name": name, "paused": paused})
        cursor.execute(queues.NOTIFY_QUEUE, [channel, queue_payload(name) if paused else front_payload(name)])


def set_limits(name: str, values: Mapping[str, Any], channel: str) -> None:
    """Write a queue's limits and places and wake its workers, in one transaction."""
    with _atomic(), _cursor() as cursor:
        cursor.execute(queues.SET_LIMITS, {"name": name, **values})
        cursor.execute(queues.QUEUE_PLACES, {"name": name})
        cursor.execute(queues.NOTIFY_QUEUE, [channel, front_payload(name)])


def make_places(name: str, channel: str) -> None:
    """Bring a queue's places in line with its row and wake its workers, in one transaction."""
    with _atomic(), _cursor() as cursor:
        cursor.execute(queues.QUEUE_PLACES, {"name": name})
        cursor.execute(queues.NOTIFY_QUEUE, [channel, front_payload(name)])


def queue_states() -> list[Row]:
    """Every controlled queue with its places in use, rate used and queued jobs."""
    return _rows(queues.STATES)


def queue_controls() -> list[Row]:
    """The admin's queue page: every controlled queue without its count of queued jobs."""
    return _rows(queues.CONTROLS)


def queue_stats_rows() -> list[Row]:
    """The queue-wide figures of the metrics view and the health probe:
    (queue, status, jobs, oldest, expired, live workers) rows."""
    return _rows(queues.STATS)


# -- workers, the clock, estimates ----------------------------------------------


def worker_rows(alias: str) -> list[Row]:
    """The admin overview's workers (``workers.OVERVIEW``), from the database ``alias``."""
    with connections[alias].cursor() as cursor:
        cursor.execute(workers.OVERVIEW)
        rows: list[Row] = cursor.fetchall()
    return rows


def newest_worker(worker_id: str | None, hostname: str) -> Row | None:
    """The health probe's worker: this host's newest, or the one named."""
    with _cursor() as cursor:
        cursor.execute(workers.HEALTH_WORKER, {"worker_id": worker_id, "hostname": hostname})
        row: Row | None = cursor.fetchone()
    return row


def database_now() -> dt.datetime:
    """The database clock (``now()``: the transaction's start)."""
    return _clock(conn_sql.NOW)


def statement_now() -> dt.datetime:
    """The database clock at this statement (inside a test's transaction ``now()`` stands still)."""
    return _clock(conn_sql.STATEMENT_NOW)


def table_estimate(alias: str, table: str) -> Row | None:
    """``pg_class.reltuples`` of ``table`` in the database ``alias`` (the admin's paginator)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(conn_sql.TABLE_ESTIMATE, [table])
        row: Row | None = cursor.fetchone()
    return row


def common_values(alias: str, table: str, column: str) -> list[str]:
    """The most common values of ``table.column`` in ``alias``, as ANALYZE last sampled them."""
    with connections[alias].cursor() as cursor:
        cursor.execute(conn_sql.COMMON_VALUES, [table, column])
        return [value for (value,) in cursor.fetchall()]


def periodic(statement: str, params: Mapping[str, Any]) -> list[Row]:
    """One statement of the periodic scheduler (``sql.periodic``), in autocommit."""
    return _rows(statement, params)


# -- the charts -----------------------------------------------------------------


@contextlib.contextmanager
def chart_transaction() -> Iterator[Any]:
    """The transaction that reads and stores a chart's points, and its cursor
    (``leasejobs.db.chartpoints`` runs the statements)."""
    with _atomic(), _cursor() as cursor:
        yield cursor


# -- leasejobs.testing: the worker's claim and finish on Django's connection ---


def testing_claim(params: Mapping[str, Any], limited: Callable[[int], Mapping[str, Any] | None]) -> list[Row]:
    """``CLAIM``, then ``CLAIM_LIMITED`` with ``limited(rows claimed)`` unless that is None,
    JIT off meanwhile."""
    with _cursor() as cursor, _without_jit(cursor):
        cursor.execute(sql.CLAIM, params)
        rows: list[Row] = cursor.fetchall()
        more = limited(len(rows))
        if more is not None:
            cursor.execute(sql.CLAIM_LIMITED, more)
            rows += cursor.fetchall()
        return rows


@contextlib.contextmanager
def _without_jit(cursor: Any) -> Iterator[None]:
    """The claims with JIT off, as on the worker's claim connection.

    On Django's connection JIT is on, and the claim's estimate (its skip scan
    of priorities is priced at about a hundred of them) passes JIT's
    threshold once a few thousand jobs are queued: compiling took longer
    than the claim (docs/performance.md). Inside the caller's transaction
    the setting ends with it; in autocommit it is put back at once.
    """
    if connections[db_alias()].in_atomic_block:
        cursor.execute(conn_sql.JIT_OFF_LOCAL)
        yield
        return
    cursor.execute(conn_sql.JIT_OFF_SESSION)
    previous = cursor.fetchone()[0]
    try:
        yield
    finally:
        cursor.execute(conn_sql.JIT_BACK, [previous])


def testing_finish(params: Mapping[str, Any]) -> list[Row]:
    """The worker's ``FINISH`` for ``leasejobs.testing``."""
    return _rows(sql.FINISH, params)


def _rows(statement: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> list[Row]:
    with _cursor() as cursor:
        cursor.execute(statement, params)
        rows: list[Row] = cursor.fetchall()
    return rows


def _clock(statement: str) -> dt.datetime:
    with _cursor() as cursor:
        cursor.execute(statement)
        now: dt.datetime = cursor.fetchone()[0]
    return now
