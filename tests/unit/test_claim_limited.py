"""The limited claim (``sql.CLAIM_LIMITED``) as one statement: which jobs it takes, and what it costs.

A Hypothesis model says which jobs a claim under queue and key limits must
take, given the places of each limit (held, free, or run out); and a claim
under a large limit (a ``100000/d`` daily quota) must lock and write only
the places it takes (issue 28, item 8: it locked every free place, 2 s and
5.4 MB of WAL per claim). The real-worker side is in test_queue_controls.py.
"""

from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasejobs.db import sql
from leasejobs.db.store import LIMITED_SCAN_FACTOR, LIMITED_SCAN_MIN, claim_params
from leasejobs.models import Queue, Slot
from leasejobs.queues import controls
from tests.testapp.tasks import add

QUEUES = ["a", "b", "c"]
KEYS = {"k1": 1, "k2": 2}  # each key's concurrency limit
#: A place's state: free (never held), held (for a minute more), or run out (a second ago).
PLACE_STATES = st.sampled_from(["free", "held", "ran-out"])


def limited_params(limit: int) -> dict[str, Any]:
    params = claim_params(
        limit=limit, counted=limit, queues=None, lease_seconds=30, task_leases={}, worker_id="limited-test"
    )
    params["scan"] = max(limit * LIMITED_SCAN_FACTOR, LIMITED_SCAN_MIN)
    return params


# -- the model ------------------------------------------------------------------------------------


@dataclass
class Limit:
    kind: str
    name: str
    lim: int
    #: The state of places 1..lim, then of places above a lowered limit (never to be taken).
    places: list[str]

    def free(self) -> int:
        return sum(1 for s in self.places[: self.lim] if s != "held")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], list[Limit], list[tuple], int]:
    queues = {}
    limits = []
    for name in QUEUES:
        paused = draw(st.booleans()) and draw(st.booleans())
        concurrency = draw(st.sampled_from([None, 1, 2, 3]))
        rate = draw(st.sampled_from([None, 1, 2, 3]))
        queues[name] = {"paused": paused, "concurrency": concurrency, "rate": rate}
        for kind, lim in (("concurrency", concurrency), ("rate", rate)):
            if lim is not None:
                places = draw(st.lists(PLACE_STATES, min_size=lim, max_size=lim + 1))
                limits.append(Limit(kind, name, lim, places))
    for key, lim in KEYS.items():
        limits.append(Limit("key", key, lim, draw(st.lists(PLACE_STATES, min_size=lim, max_size=lim))))
    jobs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(QUEUES),
                st.sampled_from([0, 5]),
                st.sampled_from([-30, -20, -10, 60]),  # due in seconds: later ones are not claimable
                st.sampled_from([None, None, "k1", "k2"]),
            ),
            max_size=12,
        )
    )
    return queues, limits, jobs, draw(st.integers(1, 6))


def expected_claim(
    queues: dict[str, dict[str, Any]], limits: list[Limit], jobs: list[tuple[int, str, int, int, str | None]]
) -> list[int]:
    """What CLAIM_LIMITED must take: see its docstring, in Python."""
    by = {(lim.kind, lim.name): lim for lim in limits}
    ctl = {q for q, o in queues.items() if not o["paused"] and (o["concurrency"] or o["rate"])}

    def queue_limits(q: str) -> list[Limit]:
        return [by[(k, q)] for k in ("concurrency", "rate") if (k, q) in by and q in ctl]

    open_queues = {q for q in ctl if all(lim.free() for lim in queue_limits(q))}
    candidates = [
        j
        for j in sorted(jobs, key=lambda j: (-j[2], j[3], j[0]))
        if j[3] < 0
        and (j[1] in open_queues or (j[4] is not None and j[1] not in ctl and not queues[j[1]]["paused"]))
        and (j[4] is None or by[("key", j[4])].free())
    ]
    # Key places first: the k-th candidate of a key gets a place if the key has k free.
    seen: dict[str, int] = {}
    keyed_ok = []
    for j in candidates:
        if j[4] is not None:
            seen[j[4]] = seen.get(j[4], 0) + 1
            if seen[j[4]] > by[("key", j[4])].free():
                continue
        keyed_ok.append(j)
    # Then each queue limit, among those, up to its free places.
    granted = []
    for lim in [lim for q in ctl for lim in queue_limits(q)]:
        ranked = [j for j in keyed_ok if j[1] == lim.name]
        lim.winners = {j[0] for j in ranked[: lim.free()]}  # type: ignore[attr-defined]
    for j in keyed_ok:
        if all(j[0] in lim.winners for lim in queue_limits(j[1])):  # type: ignore[attr-defined]
            granted.append(j[0])
    return granted


def _insert_job(queue: str, priority: int, due_in: int, key: str | None) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, runs, max_attempts, run_at,
                leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes,
                concurrency_key, concurrency_limit
            )
            VALUES ('tests.claim', %s, %s, '[]', '{}', 'queued', 0, 0, 3,
                    now() + make_interval(secs => %s), '', false, '', '[]', '[]', now(), 0, %s, %s)
            RETURNING id
            """,
            [queue, priority, due_in, key, KEYS.get(key) if key else None],
        )
        return int(cursor.fetchone()[0])


def _insert_places(limit: Limit) -> None:
    with connection.cursor() as cursor:
        for n, state in enumerate(limit.places, start=1):
            cursor.execute(
                """
                INSERT INTO leasejobs_slot (kind, name, n, job_id, attempt, held_until)
                VALUES (%s, %s, %s, NULL, NULL,
                        CASE %s WHEN 'held' THEN now() + interval '1 minute'
                                WHEN 'ran-out' THEN now() - interval '1 second' END)
                """,
                [limit.kind, limit.name, n, state],
            )


@pytest.mark.django_db
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=worlds())
def test_a_limited_claim_takes_what_the_model_says_and_only_free_places_within_the_limits(world) -> None:
    queues, limits, jobs, limit = world
    with transaction.atomic():
        for name, o in queues.items():
            Queue.objects.create(
                name=name,
                paused=o["paused"],
                concurrency=o["concurrency"],
                rate_count=o["rate"],
                rate_seconds=60.0 if o["rate"] else None,
            )
        for lim in limits:
            _insert_places(lim)
        rows = [(_insert_job(*job), *job) for job in jobs]
        before = {(s.kind, s.name, s.n): s.held_until for s in Slot.objects.all()}
        with connection.cursor() as cursor:
            cursor.execute(sql.CLAIM_LIMITED, limited_params(limit))
            claimed = [r[0] for r in cursor.fetchall()]
        assert claimed == expected_claim(queues, limits, rows)[:limit]
        # Each claimed job holds one place of each limit on it, taken from the free ones within it.
        by = {(lim.kind, lim.name): lim for lim in limits}
        held = {}
        for s in Slot.objects.filter(job_id__in=claimed):
            lim = by[(s.kind, s.name)]
            assert s.n <= lim.lim and lim.places[s.n - 1] != "held", (s.kind, s.name, s.n)
            held.setdefault(s.job_id, []).append((s.kind, s.name))
        for job_id, queue, _p, _d, key in rows:
            if job_id in claimed:
                wanted = [(k, queue) for k in ("concurrency", "rate") if (k, queue) in by]
                wanted += [("key", key)] if key else []
                assert sorted(held.get(job_id, [])) == sorted(wanted)
        untaken = {(s.kind, s.name, s.n): s.held_until for s in Slot.objects.exclude(job_id__in=claimed)}
        assert all(before[place] == held_until for place, held_until in untaken.items())
        transaction.set_rollback(True)


# -- the cost of a large limit -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_lowered_rate_drops_its_places_above_the_new_count_held_or_not() -> None:
    """Held rate places above a lowered count would otherwise sit, once run out, among the free
    places every claim reads first; held concurrency places stay (their jobs' heartbeats count them)."""
    controls.set_limits("quota", concurrency=4, rate="5/m")
    Slot.objects.filter(name="quota").update(held_until=now_plus_minute(), job_id=1, attempt=1)
    controls.set_limits("quota", concurrency=2, rate="2/m")
    places = sorted(Slot.objects.filter(name="quota").values_list("kind", "n"))
    assert places == [("concurrency", n) for n in (1, 2, 3, 4)] + [("rate", 1), ("rate", 2)]


def now_plus_minute() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now() + interval '1 minute'")
        return cursor.fetchone()[0]


@pytest.mark.django_db
@pytest.mark.parametrize("window", [controls.MAX_RATE_WINDOW_SECONDS, 99999999999 * 86400.0])
def test_a_claim_under_the_longest_window_or_a_longer_one_written_by_hand_holds_its_place_366_days(window):
    """The largest window PostgreSQL is asked to add to a timestamp is 366 days: set_limits
    refuses longer ones, and a longer one written into the table by hand is read as 366 days
    (99999999999 days overflowed the timestamp and failed every claim of every worker)."""
    controls.set_limits("quota", rate="2/366d")
    Queue.objects.filter(name="quota").update(rate_seconds=window)
    add.using(queue="quota").bulk_enqueue([((1, 2), {})] * 3)
    with connection.cursor() as cursor:
        cursor.execute(sql.CLAIM_LIMITED, limited_params(4))
        assert len(cursor.fetchall()) == 2
        cursor.execute(
            "SELECT DISTINCT extract(epoch FROM held_until - now())::bigint / 86400 FROM leasejobs_slot "
            "WHERE kind = 'rate' AND name = 'quota'"
        )
        assert cursor.fetchall() == [(366,)]
