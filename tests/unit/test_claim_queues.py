"""The claim across queues, against a one-line model of what it must take.

The best ``limit`` claimable jobs in claim order (priority, then the earliest
due, then the oldest id) across the queues the claim serves: queued jobs
that are due, and running jobs whose lease ran out (taken over); never jobs
scheduled later, running jobs still held, paused queues or limited queues
(``CLAIM_LIMITED``'s). The claim walks each priority only up to the jobs due
now (``sql.CLAIM``); any rewrite of it must keep passing this.
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasejobs.db import sql
from leasejobs.db.store import ClaimKey, claim_params, key_params
from leasejobs.models import Queue

QUEUES = ["a", "b", "c"]

#: One job: its queue, its priority, when it is due (seconds from now: negative is due),
#: and its state: queued, or running with its lease run out or still held (then it was due).
jobs_strategy = st.lists(
    st.tuples(
        st.sampled_from(QUEUES),
        st.sampled_from([-1, 0, 3, 5, 7]),
        st.sampled_from([-30, -20, -10, 60]),
        st.sampled_from(["queued", "queued", "expired", "held"]),
    ),
    max_size=12,
)


def _insert(queue: str, priority: int, due_in: int, state: str = "queued") -> int:
    """A job of a plain task, due ``due_in`` seconds from the transaction's start; its id.

    ``state``: ``queued``, or running since it was due with a lease that ran
    out a second ago (``expired``) or runs for a minute more (``held``).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, runs, max_attempts, run_at,
                lease_until, leased_by, cancel_requested, last_error, errors, worker_ids, created_at,
                snoozes
            )
            VALUES ('tests.claim', %(queue)s, %(priority)s, '[]', '{}',
                    CASE WHEN %(state)s = 'queued' THEN 'queued' ELSE 'running' END,
                    CASE WHEN %(state)s = 'queued' THEN 0 ELSE 1 END,
                    CASE WHEN %(state)s = 'queued' THEN 0 ELSE 1 END, 3,
                    now() + make_interval(secs => %(due_in)s),
                    CASE %(state)s WHEN 'expired' THEN now() - interval '1 second'
                                   WHEN 'held' THEN now() + interval '1 minute' END,
                    CASE WHEN %(state)s = 'queued' THEN '' ELSE 'another-worker' END,
                    false, '', '[]', '[]', now(), 0)
            RETURNING id
            """,
            {"queue": queue, "priority": priority, "due_in": due_in, "state": state},
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
    jobs: list[tuple[str, int, int, str]],
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
        # A running job was claimed when it was due: its run_at is in the past.
        jobs = [(q, p, d if state == "queued" else -abs(d), state) for q, p, d, state in jobs]
        rows = [(_insert(q, p, d, state), q, p, d, state) for q, p, d, state in jobs]
        eligible = [
            r
            for r in rows
            if r[3] < 0
            and r[4] != "held"
            and r[1] not in paused
            and r[1] not in limited
            and (served is None or r[1] in served)
        ]
        # Claim order: priority first, then the earliest due, then the oldest id.
        expected = [r[0] for r in sorted(eligible, key=lambda r: (-r[2], r[3], r[0]))][:limit]
        assert _claim_ids(served, limit) == expected
        transaction.set_rollback(True)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    jobs=jobs_strategy,
    # Per priority the walk starts after: (due, the n-th id inserted), or, when the last is
    # True, the n-th job of that priority's own key if it has one; a priority left out is not walked.
    keys=st.dictionaries(
        st.sampled_from([-1, 0, 5]),
        st.tuples(st.sampled_from([-30, -20, -10, 60]), st.integers(0, 12), st.booleans()),
    ),
    limit=st.integers(1, 6),
)
def test_a_claim_from_keys_takes_the_best_jobs_after_them(
    jobs: list[tuple[str, int, int, str]], keys: dict[int, tuple[int, int]], limit: int
) -> None:
    """``sql.CLAIM_AFTER``: the same model, restricted to the priorities given, each after its key."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now(), nextval(pg_get_serial_sequence('leasejobs_job', 'id'))")
            now, first_id = cursor.fetchone()
        jobs = [(q, p, d if state == "queued" else -abs(d), state) for q, p, d, state in jobs]
        rows = [(_insert(q, p, d, state), q, p, d, state) for q, p, d, state in jobs]
        starts: dict[int, tuple[int, int]] = {}
        for p, (d, n, on_a_job) in keys.items():
            own = [(r[3], r[0]) for r in rows if r[2] == p]
            starts[p] = own[n % len(own)] if on_a_job and own else (d, first_id + n)
        after = {p: ClaimKey(now + timedelta(seconds=d), i) for p, (d, i) in starts.items()}
        eligible = [
            r for r in rows if r[3] < 0 and r[4] != "held" and r[2] in starts and (r[3], r[0]) > starts[r[2]]
        ]
        expected = [r[0] for r in sorted(eligible, key=lambda r: (-r[2], r[3], r[0]))][:limit]
        params = claim_params(
            limit=limit,
            counted=limit,
            queues=None,
            lease_seconds=30,
            task_leases={},
            worker_id="w",
            after=after,
        )
        with connection.cursor() as cursor:
            cursor.execute(sql.CLAIM_AFTER, params)
            assert [row[0] for row in cursor.fetchall()] == expected
        transaction.set_rollback(True)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    jobs=jobs_strategy,
    paused=st.sets(st.sampled_from(QUEUES)),
    limited=st.sets(st.sampled_from(QUEUES)),
    served=st.one_of(st.none(), st.lists(st.sampled_from([*QUEUES, "d"]), min_size=1, max_size=4)),
    # Per priority, the key: (due, the n-th id inserted), or, when the last is True, the n-th
    # job of that priority; a priority left out has no key (the look takes its first job).
    keys=st.dictionaries(
        st.sampled_from([-1, 0, 5]),
        st.tuples(st.sampled_from([-30, -20, -10, 60]), st.integers(0, 12), st.booleans()),
    ),
)
def test_a_front_look_finds_the_first_job_a_claim_could_take_at_or_before_each_key(
    jobs: list[tuple[str, int, int, str]],
    paused: set[str],
    limited: set[str],
    served: list[str] | None,
    keys: dict[int, tuple[int, int, bool]],
) -> None:
    """``sql.FRONT_LOOK``: per priority, the first job of the claim's model at or before
    its key (any, without one), highest priority first."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now(), nextval(pg_get_serial_sequence('leasejobs_job', 'id'))")
            now, first_id = cursor.fetchone()
        for name in QUEUES:
            if name in paused or name in limited:
                Queue.objects.create(
                    name=name, paused=name in paused, concurrency=2 if name in limited else None
                )
        jobs = [(q, p, d if state == "queued" else -abs(d), state) for q, p, d, state in jobs]
        rows = [(_insert(q, p, d, state), q, p, d, state) for q, p, d, state in jobs]
        starts: dict[int, tuple[int, int]] = {}
        for p, (d, n, on_a_job) in keys.items():
            own = [(r[3], r[0]) for r in rows if r[2] == p]
            starts[p] = own[n % len(own)] if on_a_job and own else (d, first_id + n)
        after = {p: ClaimKey(now + timedelta(seconds=d), i) for p, (d, i) in starts.items()}
        eligible = sorted(
            (
                r
                for r in rows
                if r[3] < 0
                and r[4] != "held"
                and r[1] not in paused
                and r[1] not in limited
                and (served is None or r[1] in served)
                and (r[2] not in starts or (r[3], r[0]) <= starts[r[2]])
            ),
            key=lambda r: (-r[2], r[3], r[0]),
        )
        expected: dict[int, int] = {}
        for r in eligible:
            expected.setdefault(r[2], r[0])
        params = {**key_params(after), "queues": served, "job_id": None}
        with connection.cursor() as cursor:
            cursor.execute(sql.FRONT_LOOK, params)
            found = [(priority, job_id) for priority, _, job_id in cursor.fetchall()]
        assert found == list(expected.items())
        transaction.set_rollback(True)
