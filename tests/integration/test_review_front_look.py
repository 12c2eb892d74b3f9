"""A hostile review of the front look beside the claims (leasejobs.worker.front_look), 4 December:
what it broke in the first version (a look on the vacuum thread's connection), and what held."""

import datetime as dt
import os
import signal
import time

import psycopg
import pytest
from django.utils import timezone

from leasejobs.models import Job
from tests.helpers import database_url, wait_until
from tests.integration.test_claim_queues import _backend, _stop_while_idle
from tests.testapp.tasks import record, slow_first

#: Every walk from the front goes to the front look's thread, as under a pinned horizon.
LOOKS = {"LEASEJOBS_TEST_FRONT_WALK_INLINE_MS": "0"}


def test_sigterm_while_a_look_hangs_exits_0_within_the_grace(start_worker):
    """The front look's backend is SIGSTOPped between two statements, so the next look
    hangs (claims go on: jobs run). SIGTERM ends the worker with 0 within its grace and a
    second: a stopping worker waits for no look, and no thread dies. (On the vacuum
    thread's connection, the first version took 6.1 s.)"""
    worker = start_worker("--worker-id", "rev-hang", "--concurrency", "2", "--grace", "2", env=LOOKS)
    first = record.enqueue(0)
    wait_until(lambda: Job.objects.get(pk=first.pk).status == "done", timeout=20, what="first done")
    pid = _stop_while_idle("leasejobs front rev-hang")
    try:
        jobs = [record.enqueue(n) for n in range(1, 6)]
        wait_until(
            lambda: Job.objects.filter(pk__in=[j.pk for j in jobs], status="done").count() == 5,
            timeout=30,
            what="jobs done while the look hangs",
        )
        time.sleep(1.0)  # a look is asked for and hangs
        stopped_at = time.monotonic()
        worker.signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        took = time.monotonic() - stopped_at
    finally:
        os.kill(pid, signal.SIGCONT)
    log = worker.log()
    assert "thread died" not in log, log[-3000:]
    assert code == 0, log[-3000:]
    assert took < 3.5, f"stop took {took:.1f} s"


def _late_job_runs_within(seconds: float) -> float:
    """Enqueue a job due an hour ago (before every key: only a front look finds it);
    how long it took to be done, failing past ``seconds``."""
    late = record.using(run_at=timezone.now() - dt.timedelta(hours=1)).enqueue(99)
    began = time.monotonic()
    wait_until(
        lambda: Job.objects.get(pk=late.pk).status == "done", timeout=seconds, what="the late job done"
    )
    return time.monotonic() - began


def _busy(n: int = 5) -> None:
    jobs = [record.enqueue(i) for i in range(n)]
    wait_until(
        lambda: Job.objects.filter(pk__in=[j.pk for j in jobs], status="done").count() == n,
        timeout=30,
        what="jobs done",
    )


@pytest.fixture(scope="module")
def review_bouncer():
    from django.db import connection

    from tests.pgbouncer import PgBouncer

    s = connection.settings_dict
    bouncer = PgBouncer(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432), pool_size=8)
    yield bouncer
    bouncer.remove()


def test_through_pgbouncer_the_look_finds_a_job_before_the_keys(start_worker, review_bouncer):
    """Through a transaction pooler (no startup options, no prepared statements) the look
    runs without a failure and a job due before the keys runs within seconds."""
    from tests.integration.test_worker_pgbouncer import through

    worker = start_worker(
        "--worker-id", "rev-bounce", env=through(review_bouncer, LEASEJOBS_LISTEN_URL=database_url(), **LOOKS)
    )
    _busy()
    time.sleep(1)
    _busy()
    _late_job_runs_within(12)
    log = worker.log()
    assert "front look failed" not in log and "thread died" not in log, log[-3000:]
    assert "pooler=transaction" in log


def test_a_killed_front_connection_gives_the_next_walk_to_the_claimer(start_worker):
    """pg_terminate_backend on the look's connection: the next look fails ("front look
    failed"), the claimer walks from the front itself next, and a job due before the keys
    runs within seconds (the first version waited 10 s after a failed look)."""
    worker = start_worker("--worker-id", "rev-kfront", "--concurrency", "2", env=LOOKS)
    _busy()
    wait_until(lambda: _backend("leasejobs front rev-kfront"), timeout=20, what="the front connection")
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            ["leasejobs front rev-kfront"],
        )
    _busy()
    took = _late_job_runs_within(8)
    assert worker.proc.poll() is None
    assert "thread died" not in worker.log()
    assert took < 8


def test_a_job_given_back_by_a_stopping_worker_is_found_by_a_busy_one(start_worker):
    """Worker b is busy (its keys lie past every job enqueued so far); worker a holds a
    slow job and is stopped past its grace: the job goes back to the queue, before b's
    keys. b's look finds it within seconds."""
    job = slow_first.enqueue(30)
    a = start_worker("--grace", "0.5", "--worker-id", "rev-a", "--concurrency", "1")
    wait_until(lambda: Job.objects.get(pk=job.pk).status == "running", timeout=20, what="a runs the job")
    b = start_worker("--worker-id", "rev-b", "--concurrency", "2")
    _busy()
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=15) == 0
    began = time.monotonic()
    wait_until(
        lambda: Job.objects.get(pk=job.pk).status == "done", timeout=12, what="b runs the given-back job"
    )
    assert Job.objects.get(pk=job.pk).attempt == 2
    assert "thread died" not in b.log()
    assert time.monotonic() - began < 12
