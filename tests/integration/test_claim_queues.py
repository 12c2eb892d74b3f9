"""The integration half of tests/unit/test_claim_queues.py: its tests that start workers or commit."""

import datetime as dt
import json
import os
import signal
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.db.store import CLAIM_SETTINGS, ClaimKey, claim_params, key_params
from leasejobs.models import Job
from tests.helpers import wait_until
from tests.testapp.tasks import record
from tests.unit.test_claim_queues import _claim_ids, _insert

#: The first unfinished job in claim order: one walk from the claim index's front.
ONE_WALK = """
SELECT id FROM leasejobs_job WHERE finished_at IS NULL ORDER BY priority DESC, run_at, id LIMIT 1
"""


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


@pytest.mark.django_db(transaction=True)
def test_a_claim_from_its_keys_does_not_walk_the_jobs_finished_under_a_pinned_horizon() -> None:
    """A session holds an xid while 20,000 jobs are claimed and finished: none of their
    dead index entries can go, and they sit at the claim index's front. A claim from the
    front visits each (thousands of buffers, growing with the pressure's age); a claim
    from the last key a worker kept passes none of them, and takes the same jobs. The
    front look, which must walk them, walks them once: the priority of its key is not
    probed from the front first (it was, until 5 December: twice the buffers)."""
    due = [_insert("default", 0, -1) for _ in range(3)]
    with (
        psycopg.connect(**connection_params(), autocommit=True) as conn,
        psycopg.connect(**connection_params()) as pin,
    ):
        pin.execute("SELECT txid_current()")
        conn.execute(
            """
            INSERT INTO leasejobs_job (
                task_name, queue, priority, args, kwargs, status, attempt, runs, max_attempts, run_at,
                leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
            )
            SELECT 'tests.claim', 'default', 0, '[]', '{}', 'queued', 0, 0, 3,
                   now() - interval '1 hour' + g * interval '1 ms', '', false, '', '[]', '[]', now(), 0
            FROM generate_series(1, 20000) AS g
            """
        )
        for _ in range(4):  # as workers do: claimed, then finished, in batches
            conn.execute(
                """
                UPDATE leasejobs_job SET status = 'running', attempt = 1, runs = 1, leased_by = 'w',
                    lease_until = now() + interval '30 s'
                WHERE id IN (SELECT id FROM leasejobs_job
                             WHERE status = 'queued' AND run_at < now() - interval '1 minute'
                             ORDER BY run_at LIMIT 5000)
                """
            )
            conn.execute(
                """
                UPDATE leasejobs_job SET status = 'done', lease_until = NULL, finished_at = clock_timestamp()
                WHERE status = 'running' AND leased_by = 'w'
                """
            )
        run_at, last = conn.execute(
            "SELECT run_at, id FROM leasejobs_job WHERE status = 'done' ORDER BY run_at DESC, id DESC LIMIT 1"
        ).fetchone()
        front = claim_params(
            limit=10, counted=10, queues=None, lease_seconds=30, task_leases={}, worker_id="w"
        )
        after = claim_params(
            limit=10, counted=10, queues=None, lease_seconds=30, task_leases={}, worker_id="w",
            after={0: ClaimKey(run_at, last)},
        )  # fmt: skip
        front_buffers, after_buffers = _buffers(sql.CLAIM, front), _buffers(sql.CLAIM_AFTER, after)
        assert front_buffers > 5000, front_buffers
        assert after_buffers < 100, after_buffers
        one_walk = _buffers(ONE_WALK, {})
        look = {**key_params({0: ClaimKey(run_at, last)}), "queues": None, "job_id": None}
        look_buffers = _buffers(sql.FRONT_LOOK, look)
        assert one_walk > 5000, one_walk
        assert look_buffers < 1.2 * one_walk, (look_buffers, one_walk)
        options = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())
        with psycopg.connect(**connection_params(), options=options) as claim:
            assert [r[0] for r in claim.execute(sql.CLAIM_AFTER, after).fetchall()] == due
        pin.rollback()


def _backend(application_name: str) -> tuple[int, str] | None:
    """The pid and state of the connection of this name to the test's database, if it is open
    (a test run beside this one, on another database, may name its worker alike)."""
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid, state FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [application_name],
        ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def _stop_while_idle(application_name: str) -> int:
    """SIGSTOP a connection's backend between two statements (holding no lock); its pid."""
    for _ in range(500):
        pid, state = wait_until(lambda: _backend(application_name), timeout=20, what=application_name)
        if state == "idle":
            os.kill(pid, signal.SIGSTOP)
            # A stopped backend reports nothing more: idle still means between two statements.
            if _backend(application_name) == (pid, "idle"):
                return pid
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"{application_name} was never idle")


def _front_look_hung(start_worker: Any, worker_id: str) -> tuple[Any, int]:
    """A worker whose every walk from the front goes to the front look's thread (as under
    a pinned horizon, where walks are costly), with keys (its first job done), and the
    look's backend stopped (SIGSTOP) between two statements, so that its next look hangs
    and nothing but a claim from the keys runs a job; the worker and the backend's pid."""
    worker = start_worker(
        "--worker-id", worker_id, "--concurrency", "2", env={"LEASEJOBS_TEST_FRONT_WALK_INLINE_MS": "0"}
    )
    first = record.enqueue(0)
    wait_until(lambda: Job.objects.get(pk=first.pk).status == "done", timeout=20, what="the first job done")
    return worker, _stop_while_idle(f"leasejobs front {worker_id}")


def _done(*jobs: Job) -> bool:
    return Job.objects.filter(pk__in=[j.pk for j in jobs], status="done").count() == len(jobs)


def test_claims_go_on_while_a_front_look_hangs_and_its_finding_runs_once_it_ends(start_worker):
    """The front look hangs: the worker's claims from its keys go on, 40 jobs enqueued
    one by one all run. A job enqueued due an hour ago lies before every key, and runs at
    once all the same: its NOTIFY says where it lies. A job made due two hours ago by an
    UPDATE (nothing announces it, as nothing announces a job whose lease ran out) stays
    queued until the look, resumed (SIGCONT), finds it."""
    worker, pid = _front_look_hung(start_worker, "front-hang")
    try:
        jobs = [record.enqueue(n) for n in range(1, 41)]
        wait_until(lambda: _done(*jobs), timeout=30, what="the jobs enqueued while the look hangs done")
        announced = record.using(run_at=timezone.now() - dt.timedelta(hours=1)).enqueue(99)
        wait_until(lambda: _done(announced), timeout=10, what="the job enqueued behind every key done")
        silent = record.using(run_at=timezone.now() + dt.timedelta(hours=1)).enqueue(98)
        Job.objects.filter(pk=silent.pk).update(run_at=timezone.now() - dt.timedelta(hours=2))
        time.sleep(2)
        assert Job.objects.get(pk=silent.pk).status == "queued"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: _done(silent), timeout=20, what="the job only the look finds done")
    assert worker.proc.poll() is None
    assert "front look failed" not in worker.log()


def test_a_job_whose_transaction_commits_after_later_jobs_ran_runs_without_a_walk(start_worker):
    """A producer enqueues in a transaction that stays open (a Django request working on),
    while jobs enqueued after it are claimed and run: the worker's key moves past the
    open job's place. With the front look hung, only its NOTIFY, which carries that
    place, can bring the key back: the job runs within seconds of its commit."""
    worker, pid = _front_look_hung(start_worker, "front-late")
    opened, release = threading.Event(), threading.Event()
    late: list[Job] = []

    def producer() -> None:
        try:
            with transaction.atomic():
                late.append(record.enqueue(97))
                opened.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert opened.wait(10)
        jobs = [record.enqueue(n) for n in range(1, 11)]
        wait_until(lambda: _done(*jobs), timeout=30, what="the jobs enqueued after the open one done")
        release.set()
        thread.join(10)
        wait_until(lambda: _done(*late), timeout=10, what="the job committed late done")
    finally:
        release.set()
        os.kill(pid, signal.SIGCONT)
    assert worker.proc.poll() is None


def test_on_a_healthy_database_the_claimer_walks_from_the_front_itself(start_worker):
    """Walks from the front are cheap here (no pinned horizon): the claimer makes them,
    a job due before its keys runs all the same, and no front-look connection opens."""
    start_worker("--worker-id", "front-inline", "--concurrency", "2")
    jobs = [record.enqueue(n) for n in range(20)]
    wait_until(lambda: Job.objects.filter(status="done").count() == 20, timeout=20, what="the jobs done")
    late = record.using(run_at=timezone.now() - dt.timedelta(hours=1)).enqueue(99)
    wait_until(lambda: Job.objects.get(pk=late.pk).status == "done", timeout=20, what="the late job done")
    assert jobs and _backend("leasejobs front front-inline") is None
