"""The worker's statements cost what their rows cost, whatever the table's statistics say.

A VACUUM of the job table while it holds no live row (a drained queue whose
history was pruned, the bench between runs, the worker's own vacuum thread)
leaves ``reltuples`` at 0 over pages that are still there, and PostgreSQL
then estimates every scan of the table at one row until the next ANALYZE:
up to a minute with autovacuum, indefinitely without it. A burst enqueued
then met claims that joined their rows back to the table by reading all of
it, once per claimed row: 25 s for a claim of 1,000 jobs, and two workers
that drained 40,000 jobs in 2 s took minutes (5 December). Each statement
now writes the very row version it found and locked (``ctid``), which no
estimate can turn into a scan of the table.

Each test sets that state up, runs the statement as the worker does (its
connection's settings, its parameters) under ``EXPLAIN ANALYZE``, rolled
back, and bounds the rows its plan handled (each loop counted, filtered
rows too) by the rows it claims or writes, not by the table: buffers would
not tell, a table read in key order touches each page once.
"""

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.db.store import (
    CLAIM_SETTINGS,
    FINISH_SETTINGS,
    Attempt,
    ClaimKey,
    Outcome,
    claim_params,
    finish_params,
    heartbeat_settings,
)
from leasejobs.queues.controls import set_limits
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db(transaction=True)

#: Jobs in the burst, and in the history deleted before it (the pages VACUUM leaves).
BURST = 6000
#: Rows each statement handles.
ROWS = 100
#: Plan rows a statement may handle per row it claims or writes (the walk, the
#: lock, the arguments' sizes, the update, what it returns), plus its fixed part.
#: A statement that joined its rows back to the table by reading it handled
#: 6,800 to 3,600,000 here.
PER_ROW = 25
FIXED = 400
#: A claim under limits takes jobs for idle children only (tens), and handles
#: several times more per row: the places of each limit, matched to its rows
#: pairwise, fine at that size.
LIMITED_ROWS = 20
LIMITED_FACTOR = 5


@pytest.fixture
def stale() -> Iterator[psycopg.Connection[Any]]:
    """A burst of ``BURST`` queued jobs on a table VACUUM last saw empty, and a connection."""
    record.bulk_enqueue([((i,), {}) for i in range(BURST)])
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        conn.execute("DELETE FROM leasejobs_job")
        conn.execute("VACUUM (TRUNCATE false) leasejobs_job")
        pages, tuples = conn.execute(
            "SELECT relpages, reltuples FROM pg_class WHERE relname = 'leasejobs_job'"
        ).fetchone()
        assert pages > 0 and tuples == 0, "the table is not in the state this test is about"
        record.bulk_enqueue([((i,), {}) for i in range(BURST)])
        yield conn


def rows_handled(conn: psycopg.Connection[Any], settings: dict[str, str], statement: str, params: Any) -> int:
    """Rows that passed through the statement's plan nodes, counting each loop and the rows
    its filters removed, run with the worker connection's ``settings``, rolled back."""
    with conn.transaction(force_rollback=True):
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, true)", [name, value])
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()[0]
    return _handled((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])


def _handled(node: dict[str, Any]) -> int:
    keys = ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
    here = sum(int(node.get(key, 0)) for key in keys)
    return here * int(node.get("Actual Loops", 1)) + sum(_handled(child) for child in node.get("Plans", []))


def claim(rows: int = ROWS, **more: Any) -> dict[str, Any]:
    return claim_params(
        limit=rows, counted=rows, queues=None, lease_seconds=30, task_leases={}, worker_id="w", **more
    )


def held(conn: psycopg.Connection[Any]) -> list[int]:
    """Claim ``ROWS`` jobs for worker ``w`` (committed), as its heartbeat and finish find them."""
    rows = conn.execute(sql.CLAIM, claim()).fetchall()
    assert len(rows) == ROWS
    return [row[0] for row in rows]


def bound(rows: int = ROWS) -> int:
    return rows * PER_ROW + FIXED


def test_a_claim_from_the_front_reads_its_rows_not_the_table(stale):
    assert rows_handled(stale, CLAIM_SETTINGS, sql.CLAIM, claim()) < bound()


def test_a_claim_from_the_keys_reads_its_rows_not_the_table(stale):
    run_at, first = stale.execute("SELECT min(run_at)::text, min(id) FROM leasejobs_job").fetchone()
    params = claim(after={0: ClaimKey(run_at, first - 1)})
    assert rows_handled(stale, CLAIM_SETTINGS, sql.CLAIM_AFTER, params) < bound()


def test_a_claim_under_limits_reads_its_rows_not_the_table(stale):
    stale.execute("UPDATE leasejobs_job SET concurrency_key = 'k', concurrency_limit = %s", [BURST])
    stale.execute(
        "INSERT INTO leasejobs_slot (kind, name, n, held_until, job_id, attempt)"
        " SELECT 'key', 'k', n, NULL, NULL, NULL FROM generate_series(1, %s) AS n",
        [BURST],
    )
    stale.execute("ANALYZE leasejobs_slot")
    params = {**claim(LIMITED_ROWS), "scan": LIMITED_ROWS}
    handled = rows_handled(stale, CLAIM_SETTINGS, sql.CLAIM_LIMITED, params)
    assert handled < bound(LIMITED_ROWS) * LIMITED_FACTOR


def test_a_heartbeat_reads_its_rows_not_the_table(stale):
    ids = held(stale)
    params = {
        "ids": ids,
        "attempts": [1] * ROWS,
        "lease_seconds": [30.0] * ROWS,
        "slots": [0] * ROWS,
        "slotted": False,
        "worker_id": "w",
    }
    assert rows_handled(stale, heartbeat_settings(5), sql.HEARTBEAT, params) < bound()


@pytest.mark.parametrize("statement", ["FINISH", "FINISH_WAITING"])
def test_a_finish_reads_its_rows_not_the_table(stale, statement):
    ids = held(stale)
    params = finish_params([(Attempt(i, 1), Outcome(status="done"), 0) for i in ids], "w")
    assert rows_handled(stale, FINISH_SETTINGS, getattr(sql, statement), params) < bound()


def test_a_release_reads_its_rows_not_the_table(stale):
    ids = held(stale)
    params = {
        "ids": ids,
        "attempts": [1] * ROWS,
        "refunds": [1] * ROWS,
        "worker_id": "w",
        "channel": "leasejobs",
        "slotted": False,
    }
    assert rows_handled(stale, FINISH_SETTINGS, sql.RELEASE, params) < bound()


#: Places of the rate limit in the last test: a daily API quota.
QUOTA = 20000


def stale_places(conn: psycopg.Connection[Any], **limits: Any) -> None:
    """Give the queue ``default`` these limits, with the places table's statistics stale:
    its columns analyzed, then the places deleted, VACUUMed without truncation (``reltuples``
    0 over its pages) and put back."""
    set_limits("default", **limits)
    conn.execute("ANALYZE leasejobs_slot")  # its columns' statistics, as autovacuum keeps them
    conn.execute("CREATE TEMPORARY TABLE places AS SELECT * FROM leasejobs_slot")
    conn.execute("DELETE FROM leasejobs_slot")
    conn.execute("VACUUM (TRUNCATE false) leasejobs_slot")
    conn.execute("INSERT INTO leasejobs_slot SELECT * FROM places")
    pages, tuples, places = conn.execute(
        "SELECT relpages, reltuples, (SELECT count(*) FROM leasejobs_slot)"
        " FROM pg_class WHERE relname = 'leasejobs_slot'"
    ).fetchone()
    assert pages > 0 and tuples == 0 and places == QUOTA, "the places are not in the state this test is about"


def test_a_claim_under_a_large_limit_reads_its_rows_not_the_limits_places(stale):
    """The free-place probes read the first free places, not every place of the limit."""
    stale_places(stale, rate=f"{QUOTA}/d")
    params = {**claim(LIMITED_ROWS), "scan": LIMITED_ROWS}
    handled = rows_handled(stale, CLAIM_SETTINGS, sql.CLAIM_LIMITED, params)
    assert handled < bound(LIMITED_ROWS) * LIMITED_FACTOR


def test_the_places_of_held_jobs_are_renewed_and_freed_by_their_own_rows(stale):
    """A heartbeat and a finish of jobs holding places find each attempt's places by its job,
    not by reading every place of the limit."""
    stale_places(stale, concurrency=QUOTA)
    with stale.transaction():
        for name, value in CLAIM_SETTINGS.items():
            stale.execute("SELECT set_config(%s, %s, true)", [name, value])
        rows = stale.execute(sql.CLAIM_LIMITED, {**claim(LIMITED_ROWS), "scan": LIMITED_ROWS}).fetchall()
    assert len(rows) == LIMITED_ROWS
    held = [(row[0], row[4], row[16]) for row in rows]  # id, attempt, places
    assert all(places == 1 for _, _, places in held)
    beat = {
        "ids": [i for i, _, _ in held],
        "attempts": [a for _, a, _ in held],
        "lease_seconds": [30.0] * len(held),
        "slots": [p for _, _, p in held],
        "slotted": True,
        "worker_id": "w",
    }
    assert rows_handled(stale, heartbeat_settings(5), sql.HEARTBEAT, beat) < bound(LIMITED_ROWS)
    outcomes = finish_params(
        [(Attempt(i, a), Outcome(status="done"), 0) for i, a, _ in held], "w", slotted=True
    )
    for statement in ("FINISH", "FINISH_WAITING"):
        handled = rows_handled(stale, FINISH_SETTINGS, getattr(sql, statement), outcomes)
        assert handled < bound(LIMITED_ROWS), statement
    # A body's side-effect block renews its lease and places on Django's connection.
    job_id, attempt, _ = held[0]
    renew = {"job_id": job_id, "attempt": attempt, "worker_id": "w", "lease_seconds": 30.0}
    assert rows_handled(stale, {}, sql.RENEW_LEASE, renew) < FIXED
