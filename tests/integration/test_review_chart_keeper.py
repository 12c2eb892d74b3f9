"""Hostile review of the chart keeper (commits 74e3010..2902b0b).

Real ``runworker`` processes against the real server. Each test states the
promise it checks.
"""

import datetime as dt
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from leasejobs.db import chartpoints
from leasejobs.models import ChartPoint, Job
from tests.chaos.helpers import SETTINGS
from tests.chaos.tasks import side_effect_only
from tests.helpers import database_url, wait_until
from tests.integration import test_least_privilege

worker_role = test_least_privilege.worker_role

#: Dead row versions that make the test workers vacuum.
THRESHOLD = "200"


def _stat(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_stat_get_{name}(to_regclass('leasejobs_job'))")
        return int(cursor.fetchone()[0])


@pytest.fixture(autouse=True)
def no_autovacuum(transactional_db: None) -> Iterator[None]:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE leasejobs_job RESET (autovacuum_enabled)")


def _make_dead_rows(n: int) -> None:
    """``n`` dead row versions in leasejobs_job: rows inserted, then deleted."""
    Job.objects.bulk_create(
        [Job(task_name="x", queue="dead", status="queued", attempt=0, run_at=Now()) for _ in range(n)]
    )
    Job.objects.filter(queue="dead").delete()


@pytest.mark.parametrize("locked", [False, True], ids=["control-unlocked", "chartpoint-locked"])
def test_a_locked_chartpoint_table_does_not_wedge_the_vacuum_of_the_job_table(start_worker, locked):
    """Promise (docs/worker.md, vacuum.py): the vacuum thread VACUUMs leasejobs_job when dead
    rows pile up; the keeper is "a cheap step a minute". A session holding a lock on
    leasejobs_chartpoint (a migration, a TRUNCATE, a VACUUM FULL, a pg_repack) must not stop
    the job table's VACUUM: the keeper's statements run with statement_timeout 0 and no
    lock_timeout on the vacuum thread's own connection, so it waits as long as the lock is held."""
    holder = psycopg.connect(database_url())
    try:
        if locked:
            holder.execute("LOCK TABLE leasejobs_chartpoint IN ACCESS EXCLUSIVE MODE")
        before = _stat("vacuum_count")
        worker = start_worker(
            "-v", "2", "--queue", "nothing-here", env={"LEASEJOBS_TEST_VACUUM_THRESHOLD": THRESHOLD}
        )
        if locked:
            # The keeper's first look (about a second after start) now waits on the lock.
            wait_until(
                _waiting_on_chartpoint, 20, interval=0.2, what="the keeper waiting on leasejobs_chartpoint"
            )
        else:
            worker.wait_for_log(r"stored \d+ closed buckets", 30)
        _make_dead_rows(2000)
        # The statistics show them within 10 s; a VACUUM follows within a second or two
        # (CHECK_SECONDS = 1): 40 s is plenty.
        try:
            try:
                wait_until(lambda: _stat("vacuum_count") > before, 40, interval=0.5, what="a VACUUM")
            except AssertionError as exc:
                raise AssertionError(
                    f"no VACUUM of leasejobs_job in 40 s; {_stat('dead_tuples')} dead rows reported; "
                    f"keeper waiting on leasejobs_chartpoint: {_waiting_on_chartpoint()}; "
                    f"its backend_xmin (pins dead rows for every VACUUM): {_keeper_xmin()}"
                ) from exc
        finally:
            # The other promise: SIGTERM still ends the worker promptly.
            worker.signal(signal.SIGTERM)
            began = time.monotonic()
            code = worker.wait(timeout=30)
            assert time.monotonic() - began < 10, worker.log()[-3000:]
            assert code == 0, worker.log()[-3000:]
    finally:
        holder.rollback()
        holder.close()


def _waiting_on_chartpoint() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
            " WHERE NOT l.granted AND l.relation = to_regclass('leasejobs_chartpoint')"
            " AND a.application_name LIKE 'leasejobs vacuum %%' AND a.datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


def _keeper_xmin() -> object:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT backend_xmin, state, wait_event_type FROM pg_stat_activity"
            " WHERE application_name LIKE 'leasejobs vacuum %%' AND datname = current_database()"
        )
        return cursor.fetchall()


def test_sigterm_while_the_keeper_waits_on_a_lock_ends_the_worker_promptly(start_worker):
    """Promise: SIGTERM stops the worker promptly whatever housekeeping does."""
    holder = psycopg.connect(database_url())
    try:
        holder.execute("LOCK TABLE leasejobs_chartpoint IN ACCESS EXCLUSIVE MODE")
        worker = start_worker("-v", "2", "--queue", "nothing-here")
        wait_until(
            _waiting_on_chartpoint, 20, interval=0.2, what="the keeper waiting on leasejobs_chartpoint"
        )
        worker.signal(signal.SIGTERM)
        began = time.monotonic()
        code = worker.wait(timeout=30)
        assert time.monotonic() - began < 10, worker.log()[-3000:]
        assert code == 0, worker.log()[-3000:]
    finally:
        holder.rollback()
        holder.close()


def _db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _keep() -> int | None:
    with transaction.atomic(), connection.cursor() as cursor:
        return chartpoints.keep(cursor, dt.timedelta(0))


def _stored_backlog(minute: dt.datetime) -> set[tuple[str, float | None]]:
    points = ChartPoint.objects.filter(chart="backlog", step_seconds=60, t=minute)
    return {(p.series, p.value) for p in points if p.series}


def test_a_job_enqueued_in_a_transaction_open_over_a_minute_end_is_in_the_stored_backlog():
    """Promise (db/chartpoints.py): a stored closed bucket is what a page computing it would
    show. The backlog counts a job from ``created_at``, its enqueuing transaction's start
    (enqueue is transactional): a request that enqueues at :58 and commits after the minute
    has closed adds a job to that closed minute. ``keep`` stores no bucket ending after the
    start of a transaction still open on the database, so the stored minute has the job.
    (The review found the minute stored 5 s after its end without it, for good.)"""
    wait_until(lambda: 57 <= _db_now().second < 59, 70, interval=0.1, what="second 57 of a minute")
    with psycopg.connect(database_url()) as request:
        inserted = request.execute(
            "INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, runs,"
            " snoozes, max_attempts, run_at, leased_by, cancel_requested, last_error, created_at,"
            " pending_parents) VALUES ('tests.slow_request', 'default', 0, '[]', '{}', 'queued', 0, 0, 0,"
            " 3, now(), '', false, '', now(), 0) RETURNING date_bin('1 minute', now(), TIMESTAMPTZ"
            " '2000-01-01')"
        )
        minute = inserted.fetchone()[0]
        wait_until(lambda: _db_now() >= minute + dt.timedelta(seconds=61), 10, what="the minute closed")
        _keep()
        assert not ChartPoint.objects.filter(chart="backlog", step_seconds=60, t=minute).exists(), (
            "a minute was stored while a transaction begun inside it was still open"
        )
        request.commit()
    _keep()
    assert ChartPoint.objects.filter(chart="backlog", step_seconds=60, t=minute).exists()
    with transaction.atomic(), connection.cursor() as cursor:
        fresh = {
            (series, v)
            for t, series, v in chartpoints.run(cursor, "backlog", dt.timedelta(minutes=1), minute)
            if t == minute
        }
    assert ("default", 1.0) in fresh
    assert _stored_backlog(minute) == fresh


def test_a_role_without_chartpoint_grants_says_so_once_and_keeps_working(start_worker, worker_role):
    """Promise (docs/least-privilege.md): without grants on leasejobs_chartpoint the worker says
    so once at INFO, no retry storm, no warning, and goes on claiming."""
    jobs = side_effect_only.bulk_enqueue([((f"rev-keeper:{i}",), {}) for i in range(5)])
    worker = start_worker("-v", "2", env={"DATABASE_URL": worker_role, "DJANGO_SETTINGS_MODULE": SETTINGS})
    wait_until(
        lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 5,
        60,
        what="the jobs done",
    )
    worker.wait_for_log(r"does not store the overview charts' closed buckets", 20)
    time.sleep(4)  # a few more of the vacuum thread's one-second looks
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.log()[-3000:]
    log = worker.log()
    assert log.count("does not store the overview charts' closed buckets") == 1, log[-3000:]
    assert "cannot store the overview charts" not in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
