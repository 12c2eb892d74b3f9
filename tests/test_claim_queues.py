"""The claim across queues, against a one-line model of what it must take.

The best ``limit`` claimable jobs in claim order (priority, then the earliest
due, then the oldest id) across the queues the claim serves, leaving alone
jobs not yet due, paused queues and limited queues (``CLAIM_LIMITED``'s).
Any rewrite of the claim (one walk per queue, say) must keep passing it.
"""

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasejobs import sql
from leasejobs.models import Queue
from leasejobs.store import claim_params

QUEUES = ["a", "b", "c"]

#: One job: its queue, its priority, and when it is due (seconds from now: negative is due).
jobs_strategy = st.lists(
    st.tuples(st.sampled_from(QUEUES), st.sampled_from([-1, 0, 5]), st.sampled_from([-30, -20, -10, 60])),
    max_size=12,
)


def _insert(queue: str, priority: int, due_in: int) -> int:
    """A queued job of a plain task, due ``due_in`` seconds from the transaction's start; its id."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, max_attempts, run_at,
                leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
            )
            VALUES ('tests.claim', %s, %s, '[]', '{}', 'queued', 0, 3, now() + make_interval(secs => %s),
                    '', false, '', '[]', '[]', now(), 0)
            RETURNING id
            """,
            [queue, priority, due_in],
        )
        return int(cursor.fetchone()[0])


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
    # Repeated names included: a worker given --queue a --queue a takes as much as with one.
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
        rows = [(_insert(q, p, d), q, p, d) for q, p, d in jobs]
        eligible = [
            r
            for r in rows
            if r[3] < 0 and r[1] not in paused and r[1] not in limited and (served is None or r[1] in served)
        ]
        # Claim order: priority first, then the earliest due, then the oldest id.
        expected = [r[0] for r in sorted(eligible, key=lambda r: (-r[2], r[3], r[0]))][:limit]
        assert _claim_ids(served, limit) == expected
        transaction.set_rollback(True)
