"""Hostile review of the claim's row numbers and time order (091bfcf) and the
waiting finish (b9977d6), on real PostgreSQL, driving ``WorkerStore`` as the worker does.

Tests named ``test_break_*`` show a promise broken (they fail on the code they
were written against); the others pin down a subtle point the code gets right.
"""

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.db.store import Attempt, ClaimKey, Outcome, WorkerStore, claim_params
from leasejobs.models import Job
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store():
    stores: list[WorkerStore] = []

    def make(worker_id: str) -> WorkerStore:
        s = WorkerStore(worker_id, heartbeat_timeout=5)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


@pytest.fixture
def session_settings():
    """Settings every new session of the test database gets (``ALTER DATABASE ... SET``),
    as a server's postgresql.conf or a DBA's ``ALTER DATABASE`` would give them."""
    name = connection.settings_dict["NAME"]
    changed: list[str] = []

    def apply(**settings: str) -> None:
        with psycopg.connect(**connection_params(), autocommit=True) as conn:
            for key, value in settings.items():
                conn.execute(f'ALTER DATABASE "{name}" SET {key} = %s'.replace("%s", _quote(value)))
                changed.append(key)

    yield apply
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        for key in changed:
            conn.execute(f'ALTER DATABASE "{name}" RESET {key}')


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def claim(s: WorkerStore, limit: int = 10, counted: int | None = None, after=None):
    return s.claim(
        limit=limit,
        counted=limit if counted is None else counted,
        queues=None,
        lease_seconds=30,
        task_leases={},
        after=after,
    )


def _enqueue_at(run_ats: list[datetime], priority: int = 0) -> list[int]:
    ids = []
    for i, at in enumerate(run_ats):
        job = record.enqueue(i)
        Job.objects.filter(id=job.id).update(run_at=at, priority=priority)
        ids.append(job.id)
    return ids


# --- the claim's keys and order, in time zones that print oddly -------------------------


def test_claim_order_and_counted_rows_follow_time_in_the_repeated_hour_across_priorities(
    store, session_settings
):
    """Pins 091bfcf: in a zone that turns its clocks back (ISO DateStyle, America/New_York,
    2026-11-01 01:00-02:00 happens twice), rows come back in (priority desc, time, id)
    order, not text order; the first ``counted`` of them are the counted ones, also with a
    row over ``max_row_bytes`` and a ``max_bytes`` that cuts the claim; and
    ``CLAIM_AFTER`` from the returned keys goes on with exactly the rest."""
    session_settings(TimeZone="America/New_York")
    base = datetime(2026, 11, 1, 5, 10, tzinfo=UTC)  # 01:10 EDT
    # 01:40 EDT (05:40Z) sorts after 01:10 EST (06:10Z) as text, before it in time.
    times = [base + timedelta(minutes=m) for m in (60, 30, 0, 45, 30)]
    low = _enqueue_at(times, priority=0)
    high = _enqueue_at([base + timedelta(minutes=50), base + timedelta(minutes=20)], priority=5)
    Job.objects.filter(id__in=low[:2]).update(run_at=base + timedelta(minutes=30))  # equal run_at: id order
    expected = [high[1], high[0], *sorted(low, key=lambda i: (Job.objects.get(id=i).run_at, i))]
    s = store("a")
    rows = claim(s, limit=4, counted=3)
    assert [r.id for r in rows] == expected[:4]
    assert [r.counted for r in rows] == [True, True, True, False]
    assert [Job.objects.get(id=i).runs for i in expected[:4]] == [1, 1, 1, 0]
    keys = {}
    for r in rows:
        keys[r.priority] = ClaimKey(r.run_at, r.id)
    rest = claim(s, limit=10, after=keys)
    assert [r.id for r in rest] == expected[4:]


# --- the waiting finish ----------------------------------------------------------------


def _wait_until_blocked(pattern: str, deadline_s: float = 5.0) -> bool:
    deadline = time.monotonic() + deadline_s
    with psycopg.connect(**connection_params(), autocommit=True) as watcher:
        while time.monotonic() < deadline:
            if watcher.execute(
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                [pattern],
            ).fetchone()[0]:
                return True
            time.sleep(0.005)
    return False


def test_a_cancel_requested_while_the_finish_waits_turns_its_retry_into_a_cancel(store):
    """Pins b9977d6: the ``CASE ... j.cancel_requested`` of the waiting UPDATE reads the
    version the admin's cancel committed while the finish waited, not its snapshot's:
    a retry becomes ``cancelled``, reported as such, with its run_at left alone."""
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    before = Job.objects.get(id=job.id).run_at
    admin = psycopg.connect(**connection_params())
    admin.execute(
        sql.ADMIN_CANCEL,
        {"ids": [job.id], "statuses": ["running"], "attempts": [row.attempt], "channel": "leasejobs"},
    )
    result: list = []
    finishing = threading.Thread(
        target=lambda: result.append(
            s.finish([(Attempt(row.id, row.attempt), Outcome(status="queued", retry_delay=60.0), False)])
        )
    )
    finishing.start()
    try:
        waited = _wait_until_blocked("%waiting AS (%")
        admin.commit()
    finally:
        admin.close()
        finishing.join(10)
    assert waited, "the finish never waited for the row"
    assert [(r.id, r.written, r.status) for r in result[0]] == [(job.id, True, "cancelled")]
    job.refresh_from_db()
    assert (job.status, job.run_at, job.finished_at is not None) == ("cancelled", before, True)


def test_the_waiting_finish_gives_way_after_its_moment_also_in_a_generic_plan(store, session_settings):
    """Pins b9977d6: ``lock_timeout`` is set before the first row is waited for also when
    PostgreSQL runs the prepared statement with a generic plan (``plan_cache_mode =
    force_generic_plan``, after several executions), and it does not stay for the
    fallback ``FINISH`` or later statements of the connection."""
    session_settings(plan_cache_mode="force_generic_plan")
    jobs = [record.enqueue(i) for i in range(8)]
    s = store("a")
    rows = claim(s)
    for r in rows[:6]:  # the same statement, prepared and run six times
        s.finish([(Attempt(r.id, r.attempt), Outcome(status="done"), False)])
    held = jobs[6].id
    locker = psycopg.connect(**connection_params())
    locker.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR SHARE", [held])
    try:
        began = time.monotonic()
        written = {
            (r.id, r.written)
            for r in s.finish([(Attempt(r.id, r.attempt), Outcome("done"), False) for r in rows[6:]])
        }
        took = time.monotonic() - began
        lock_timeout = s._finish.execute("SHOW lock_timeout")[0][0]
    finally:
        locker.close()
    assert written == {(held, False), (jobs[7].id, True)}
    assert sql.leases.FINISH_WAIT_MS / 1000 <= took < 3.0
    assert lock_timeout != f"{sql.leases.FINISH_WAIT_MS}ms"


# --- the claim against a simple model ------------------------------------------------------

_ROW = st.fixed_dictionaries(
    {
        "priority": st.sampled_from([-2, 0, 0, 7]),
        "at": st.integers(0, 3),  # seconds after a base in the past: equal run_at are common
        "size": st.sampled_from([1, 10, 30, 80]),  # 80: over max_row_bytes below
        "kind": st.sampled_from(["queued", "queued", "expired", "expired_last", "cancel", "held", "done"]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    rows=st.lists(_ROW, max_size=12),
    limit=st.integers(1, 8),
    counted_less=st.integers(0, 8),
    max_bytes=st.sampled_from([1, 25, 60, 2**62]),
)
def _claim_matches_the_model(conn, template, rows, limit, counted_less, max_bytes):
    counted = max(0, limit - counted_less)
    max_row = 60
    with conn.transaction(force_rollback=True):
        conn.execute(
            "UPDATE leasejobs_job SET finished_at = now(), status = 'done' WHERE id = %s", [template]
        )
        ids = []
        for r in rows:
            status = {"expired": "running", "expired_last": "running", "held": "running", "done": "done"}.get(
                r["kind"], "queued"
            )
            (new_id,) = conn.execute(
                f"INSERT INTO leasejobs_job ({COLUMNS}) SELECT {COLUMNS} FROM leasejobs_job"
                " WHERE id = %s RETURNING id",
                [template],
            ).fetchone()
            conn.execute(
                """UPDATE leasejobs_job SET priority = %s,
                   run_at = now() - interval '1 hour' + make_interval(secs => %s),
                   args = jsonb_build_array(repeat('x', %s)), kwargs = '{}', status = %s,
                   finished_at = CASE WHEN %s = 'done' THEN now() END,
                   lease_until = CASE %s WHEN 'running' THEN now() + CASE WHEN %s = 'held'
                                 THEN interval '1 hour' ELSE interval '-1 hour' END END,
                   leased_by = CASE WHEN %s = 'running' THEN 'old' ELSE '' END,
                   attempt = CASE WHEN %s = 'running' THEN 1 ELSE 0 END,
                   runs = CASE WHEN %s = 'expired_last' THEN max_attempts
                               WHEN %s = 'running' THEN 1 ELSE 0 END,
                   cancel_requested = %s
                   WHERE id = %s""",
                [
                    r["priority"],
                    r["at"],
                    r["size"],
                    status,
                    status,
                    status,
                    r["kind"],
                    status,
                    status,
                    r["kind"],
                    status,
                    r["kind"] == "cancel",
                    new_id,
                ],
            )
            ids.append(new_id)
        info = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, priority, run_at, octet_length(args::text) + octet_length(kwargs::text), runs,"
                " max_attempts FROM leasejobs_job WHERE id = ANY(%s)",
                [ids],
            )
        }
        claimable = [i for i, r in zip(ids, rows, strict=True) if r["kind"] not in ("held", "done")]
        order = sorted(claimable, key=lambda i: (-info[i][0], info[i][1], i))[:limit]
        kept, upto = [], 0
        for i in order:
            if kept and upto >= max_bytes:
                break
            kept.append(i)
            upto += 0 if info[i][2] > max_row else info[i][2]
        params = claim_params(
            limit=limit,
            counted=counted,
            queues=None,
            lease_seconds=30,
            task_leases={},
            worker_id="w",
            max_bytes=max_bytes,
        )
        params["max_row_bytes"] = max_row
        got = conn.execute(sql.CLAIM, params).fetchall()
        assert [g[0] for g in got] == kept
        kind = dict(zip(ids, (r["kind"] for r in rows), strict=True))
        runs_now = dict(
            conn.execute("SELECT id, runs FROM leasejobs_job WHERE id = ANY(%s)", [ids]).fetchall()
        )
        for n, g in enumerate(got):
            i = g[0]
            assert g[10] == (n < counted), (n, counted, g)
            ended = kind[i] in ("expired_last", "cancel")
            assert (g[8] is not None) == ended
            assert (g[2] is None) == (info[i][2] > max_row)
            assert runs_now[i] == info[i][3] + (1 if n < counted and not ended else 0)


COLUMNS = ""


def test_the_claim_keeps_counts_and_orders_rows_as_a_simple_model_says():
    """Pins 091bfcf: ``row_number() OVER w <= counted`` counts exactly the first ``counted``
    kept rows, with rows over ``max_row_bytes`` (sent without arguments), ``max_bytes``
    cutting the claim, ended rows (failed, cancelled) and several priorities with equal
    ``run_at``, against a model: claim order (priority desc, run_at, id), the first
    ``limit``, kept while the bytes before a row are under ``max_bytes``."""
    global COLUMNS
    template = record.enqueue(0).id
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        cols = [
            c
            for (c,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'leasejobs_job'"
                " AND column_name <> 'id' ORDER BY ordinal_position"
            )
        ]
        COLUMNS = ", ".join(f'"{c}"' for c in cols)
        _claim_matches_the_model(conn, template)


# --- real workers finishing beside an operator -------------------------------------------


def test_a_worker_finishing_beside_an_operator_holding_and_cancelling_its_running_rows(start_worker):
    """Pins b9977d6 with real ``runworker`` processes: while two workers run 80 short jobs,
    an operator's transactions keep locking a few running rows (``FOR UPDATE``, as an admin
    page's edit does) or sending ``ADMIN_CANCEL`` for them, held 0-400 ms (around the
    finish's 200 ms wait) before they commit. Every body runs once, every job ends done
    with its own result, or cancelled where a cancel was sent (legitimately: before its
    body started, or seen by its body), no attempt is reported stale, no deadlock is
    reported by a worker or by the operator."""
    import random

    from tests.helpers import wait_until
    from tests.testapp.models import BodyRun
    from tests.testapp.tasks import sleeper

    rng = random.Random(33)
    jobs = [sleeper.enqueue(round(rng.uniform(0.02, 0.3), 3)) for _ in range(80)]
    workers = [
        start_worker("--burst", "--concurrency", "3", "--worker-id", name, "-v", "2") for name in ("a", "b")
    ]
    deadlocks, cancels, locks = 0, 0, 0
    requested: set[int] = set()
    deadline = time.monotonic() + 60
    with psycopg.connect(**connection_params()) as op:
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in workers):
            try:
                running = op.execute(
                    "SELECT id, status, attempt FROM leasejobs_job WHERE status = 'running'"
                    " ORDER BY random() LIMIT 3"
                ).fetchall()
                if running and rng.random() < 0.5:
                    changed = op.execute(
                        sql.ADMIN_CANCEL,
                        {
                            "ids": [r[0] for r in running],
                            "statuses": [r[1] for r in running],
                            "attempts": [r[2] for r in running],
                            "channel": "leasejobs",
                        },
                    ).fetchall()
                    requested |= {c[0] for c in changed}
                    cancels += 1
                elif running:
                    op.execute(
                        "SELECT 1 FROM leasejobs_job WHERE id = ANY(%s) FOR UPDATE", [[r[0] for r in running]]
                    )
                    locks += 1
                time.sleep(rng.uniform(0, 0.4))
                op.commit()
            except psycopg.errors.DeadlockDetected:
                op.rollback()
                deadlocks += 1
            time.sleep(0.02)
    for w in workers:
        assert w.wait(timeout=30) == 0, w.log()[-3000:]
    logs = "".join(w.log() for w in workers)
    unended = Job.objects.exclude(status__in=["done", "cancelled"])
    try:
        wait_until(lambda: not unended.exists(), 40, what="every job ended")
    except AssertionError as exc:
        left = list(unended.values("id", "status", "attempt", "runs", "leased_by", "cancel_requested"))
        raise AssertionError(f"{exc}: {left}\n{logs}") from None
    assert deadlocks == 0
    assert "deadlock" not in logs.lower()
    assert "moved on" not in logs and logs.count("lost_leases=0") == 2, logs[-3000:]
    for job in jobs:
        job.refresh_from_db()
        runs = BodyRun.objects.filter(job_id=job.id).count()
        if job.status == "cancelled":  # a cancel it was sent: before its body, or seen by it
            assert job.id in requested and runs <= 1
        else:
            assert (job.status, job.result, runs) == ("done", job.args[0], 1)
    assert cancels and locks


def test_through_a_transaction_pooler_the_waiting_finish_gives_way_and_leaves_no_setting_behind(store):
    """Pins b9977d6 through a real PgBouncer in transaction mode (two server connections):
    ``WorkerConnection`` runs each statement in a transaction of its own after its
    ``set_config`` settings; the waiting finish gives way after its moment (not the 5 s
    of ``FINISH_SETTINGS``), the fallback ``FINISH`` writes around the held row, and
    neither the 200 ms ``lock_timeout`` nor an aborted transaction is left on the server
    connections the pooler lends next (to this connection and to another client)."""
    from psycopg.conninfo import conninfo_to_dict

    from leasejobs.db.connection import WorkerConnection, with_link_checks
    from leasejobs.db.store import FINISH_SETTINGS
    from tests.pgbouncer import PgBouncer

    s = connection.settings_dict
    bouncer = PgBouncer(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432), pool_size=2)
    try:
        params = with_link_checks(conninfo_to_dict(bouncer.url(s["NAME"])))
        jobs = [record.enqueue(i) for i in range(4)]
        w = store("a")
        w._finish = WorkerConnection("finish", "a", settings=FINISH_SETTINGS, pooled=True, params=params)
        rows = claim(w)
        locker = psycopg.connect(**connection_params())
        locker.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR SHARE", [jobs[1].id])
        try:
            began = time.monotonic()
            first = w.finish([(Attempt(r.id, r.attempt), Outcome("done"), False) for r in rows[:2]])
            took = time.monotonic() - began
            settings_after = [w._finish.execute("SHOW lock_timeout")[0][0] for _ in range(4)]
            with psycopg.connect(**params, autocommit=True) as other:
                seen = [other.execute("SHOW lock_timeout").fetchone()[0] for _ in range(4)]
                assert other.execute("SELECT 1").fetchone() == (1,)
        finally:
            locker.close()
        second = w.finish([(Attempt(r.id, r.attempt), Outcome("done"), False) for r in rows[1:]])
    finally:
        w._finish.close()
        bouncer.remove()
    assert {(r.id, r.written) for r in first} == {(jobs[0].id, True), (jobs[1].id, False)}
    assert sql.leases.FINISH_WAIT_MS / 1000 <= took < 3.0
    assert f"{sql.leases.FINISH_WAIT_MS}ms" not in settings_after + seen
    assert {(r.id, r.written) for r in second} == {(j.id, True) for j in jobs[1:]}
    assert set(Job.objects.values_list("status", flat=True)) == {"done"}


def test_a_fan_in_fires_once_while_an_operator_holds_its_parents_and_callbacks(start_worker):
    """Pins b9977d6 for workflows, real ``runworker`` processes: 60 parents of two callbacks
    on two workers while an operator's transactions lock, in id order, a few running parents
    and the waiting callbacks (``FOR UPDATE``) for 0-400 ms. The
    waiting finish waits for the parents, its settling waits (200 ms, then the fallback)
    for the callbacks: each callback still runs once, after the last parent's finish,
    seeing every parent's result, and no parent runs twice."""
    import random

    import leasejobs
    from tests.helpers import wait_until
    from tests.testapp.models import BodyRun
    from tests.testapp.workflow_tasks import gather, leaf

    rng = random.Random(34)
    with leasejobs.workflow("fan-in under an operator") as wf:
        parents = [wf.add(leaf, args=(i, round(rng.uniform(0.02, 0.25), 3))) for i in range(60)]
        callbacks = [wf.add(gather, after=parents) for _ in range(2)]
    workers = [start_worker("--concurrency", "3", "--worker-id", name, "-v", "2") for name in ("a", "b")]
    callback_ids = [c.id for c in callbacks]
    all_ids = [p.id for p in parents] + callback_ids
    deadlocks = 0
    deadline = time.monotonic() + 90
    try:
        with psycopg.connect(**connection_params()) as op:
            while time.monotonic() < deadline:
                if not Job.objects.filter(id__in=all_ids).exclude(status="done").exists():
                    break
                try:
                    running = op.execute(
                        "SELECT id, status, attempt FROM leasejobs_job WHERE status = 'running'"
                        " AND id <> ALL(%s) ORDER BY random() LIMIT 3",
                        [callback_ids],
                    ).fetchall()
                    ids = sorted({r[0] for r in running} | set(callback_ids))
                    op.execute("SELECT 1 FROM leasejobs_job WHERE id = ANY(%s) ORDER BY id FOR UPDATE", [ids])
                    time.sleep(rng.uniform(0, 0.4))
                    op.commit()
                except psycopg.errors.DeadlockDetected:
                    op.rollback()
                    deadlocks += 1
                time.sleep(0.02)
        wait_until(
            lambda: not Job.objects.filter(id__in=all_ids).exclude(status="done").exists(),
            30,
            what="every job done",
        )
    finally:
        for w in workers:
            w.stop()
    rows = {j.id: j for j in Job.objects.filter(id__in=all_ids)}
    last = max(rows[p.id].finished_at for p in parents)
    for c in callback_ids:
        assert rows[c].result == {"n": 60, "sum": sum(range(60)), "missing": []}
        assert rows[c].started_at >= last
        assert rows[c].pending_parents == 0
        assert BodyRun.objects.filter(job_id=c).count() == 1
    for p in parents:
        assert BodyRun.objects.filter(job_id=p.id).count() == 1
    assert deadlocks == 0
