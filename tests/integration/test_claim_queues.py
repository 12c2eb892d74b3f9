"""The integration half of tests/unit/test_claim_queues.py: its tests that start workers or commit."""

import json
from typing import Any

import psycopg
import pytest
from django.db import connection

from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.db.store import CLAIM_SETTINGS, claim_params
from tests.unit.test_claim_queues import _claim_ids, _insert


def _buffers(statement: str, params: dict[str, Any]) -> int:
    """Shared buffers the statement touched, run as the worker's claim connection runs it (rolled back)."""
    options = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())
    with psycopg.connect(**connection_params(), options=options) as conn:
        [(plan,)] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchall()
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


@pytest.mark.django_db(transaction=True)
def test_a_claim_never_walks_the_jobs_scheduled_later() -> None:
    """50,000 jobs due tomorrow, at the priority of the due ones and above it.

    They sit in the claim index after the due jobs of their priority, and a
    worker that keeps up claims fewer due jobs than its limit: one walk of
    the whole index read every scheduled job at each such claim (about 2,900
    buffers here, 60 ms at 200,000). Each priority's walk stops at the jobs
    due now.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, max_attempts, run_at,
                leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
            )
            SELECT 'tests.claim', 'default', g % 2 * 5, '[]', '{}', 'queued', 0, 3,
                   now() + interval '1 day', '', false, '', '[]', '[]', now(), 0
            FROM generate_series(1, 50000) AS g
            """
        )
        due = [_insert("default", 0, -1) for _ in range(3)]
        cursor.execute("ANALYZE leasejobs_job")
    params = claim_params(limit=10, counted=10, queues=None, lease_seconds=30, task_leases={}, worker_id="w")
    assert _buffers(sql.CLAIM, params) < 300
    assert _claim_ids(None, 10) == due
