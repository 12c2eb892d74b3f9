"""The claim across queues: the same jobs as one walk in claim order, without walking other queues' jobs.

The claim walks each queue it may take from on its own range of the claim
index (``sql._LIVE_QUEUES``). Two things can go wrong with that, and each
has its test here: the jobs it takes must still be the best ``limit`` of all
the claimable ones, in claim order across queues (a property test against a
one-line model); and a backlog the claim leaves alone (another worker's
queue, a paused queue, a limited one) must not be walked at all, which the
claim's own buffer count shows.
"""

import json
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasejobs import sql
from leasejobs.connection import connection_params
from leasejobs.models import Queue
from leasejobs.store import CLAIM_SETTINGS, LIMITED_SCAN_MIN, claim_params

QUEUES = ["a", "b", "c"]

#: One job: its queue, its priority, and when it is due (seconds from now: negative is due).
jobs_strategy = st.lists(
    st.tuples(st.sampled_from(QUEUES), st.sampled_from([-1, 0, 5]), st.sampled_from([-30, -20, -10, 60])),
    max_size=12,
)


def _insert(queue: str, priority: int, due_in: int, *, key: str | None = None, count: int = 1) -> list[int]:
    """``count`` queued jobs of a plain task, due ``due_in`` seconds from the transaction's start."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, max_attempts, run_at,
                leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes,
                concurrency_key, concurrency_limit
            )
            SELECT 'tests.claim', %s, %s, '[]', '{}', 'queued', 0, 3, now() + make_interval(secs => %s),
                   '', false, '', '[]', '[]', now(), 0, %s, CASE WHEN %s::text IS NULL THEN NULL ELSE 1 END
            FROM generate_series(1, %s)
            RETURNING id
            """,
            [queue, priority, due_in, key, key, count],
        )
        return [row[0] for row in cursor.fetchall()]


def _claim_ids(queues: list[str] | None, limit: int) -> list[int]:
    """The ids ``sql.CLAIM`` takes, in the order it returns them, on Django's connection."""
    params = claim_params(
        limit=limit, counted=limit, queues=queues, lease_seconds=30, task_leases={}, worker_id="claim-test"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM, params)
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    jobs=jobs_strategy,
    paused=st.sets(st.sampled_from(QUEUES)),
    limited=st.sets(st.sampled_from(QUEUES)),
    served=st.one_of(st.none(), st.lists(st.sampled_from([*QUEUES, "d"]), min_size=1, max_size=4)),
    limit=st.integers(1, 6),
)
def test_a_claim_takes_the_best_jobs_of_its_queues_in_claim_order(
    jobs: list[tuple[str, int, int]],
    paused: set[str],
    limited: set[str],
    served: list[str] | None,
    limit: int,
) -> None:
    with transaction.atomic():
        for name in QUEUES:
            if name in paused or name in limited:
                Queue.objects.create(
                    name=name, paused=name in paused, concurrency=2 if name in limited else None
                )
        rows = [(_insert(q, p, d)[0], q, p, d) for q, p, d in jobs]
        eligible = [
            r
            for r in rows
            if r[3] < 0 and r[1] not in paused and r[1] not in limited and (served is None or r[1] in served)
        ]
        # Claim order: priority first, then the earliest due, then the oldest id.
        expected = [r[0] for r in sorted(eligible, key=lambda r: (-r[2], r[3], r[0]))][:limit]
        assert _claim_ids(served, limit) == expected
        transaction.set_rollback(True)


def _buffers(statement: str, params: dict[str, Any]) -> int:
    """Shared buffers the statement touched, run as the worker's claim connection runs it (rolled back)."""
    options = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())
    with psycopg.connect(**connection_params(), options=options) as conn:
        [(plan,)] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).fetchall()
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


#: Jobs of the backlog the claim must leave alone, older than the jobs it takes.
BACKLOG = 50_000
#: The claim's own cost, whatever the backlog: a few index and heap pages per queue.
FEW_BUFFERS = 300


@pytest.mark.django_db(transaction=True)
def test_a_claim_never_walks_the_backlog_of_a_queue_it_leaves_alone() -> None:
    """Another worker's queue, a paused queue and a limited queue, each with 50,000 older due jobs.

    With the claim index in claim order across queues, each of these claims
    walked past every job of the backlog (about 1,500 buffers here, and
    8 times slower drains with a million); by queue, it touches a few pages.
    """
    _insert("backlog", 0, -60, count=BACKLOG)
    mine = _insert("mine", 0, -1, count=5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leasejobs_job")
    base = {"lease_seconds": 30, "task_leases": {}, "worker_id": "claim-test"}
    served = claim_params(limit=5, counted=5, queues=["mine"], **base)
    everything = claim_params(limit=5, counted=5, queues=None, **base)
    limited = {**everything, "scan": LIMITED_SCAN_MIN}

    assert _buffers(sql.CLAIM, served) < FEW_BUFFERS  # another worker's queue
    Queue.objects.create(name="backlog", paused=True)
    assert _buffers(sql.CLAIM, everything) < FEW_BUFFERS
    assert _buffers(sql.CLAIM_LIMITED, limited) < FEW_BUFFERS
    Queue.objects.filter(name="backlog").update(paused=False, concurrency=0)  # a full limited queue
    assert _buffers(sql.CLAIM, everything) < FEW_BUFFERS
    assert _buffers(sql.CLAIM_LIMITED, limited) < FEW_BUFFERS
    # And the claim still takes the jobs it may: the plain ones of "mine".
    assert sorted(_claim_ids(None, 10)) == mine
