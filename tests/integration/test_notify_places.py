"""Jobs queued again announce their place: a lease released from the admin, a job
retried, a workflow's child made due (``leasejobs.db.sql.fragments.notify_places``).

Each of these jobs may lie before the workers' keys (``leasejobs.worker.claim_start``):
a released job keeps its old ``run_at``; a child is due at the clock of the finish
that settled it, and workers may claim later jobs before that finish commits. A bare
queue name left them to the next walk from the front, 10 s under a pinned horizon.
"""

import datetime as dt
import os
import signal
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

import leasejobs
from leasejobs import conf
from leasejobs.db import sql
from leasejobs.db.connection import connection_params
from leasejobs.models import Job
from leasejobs.worker.listener import parse_payload
from tests.helpers import wait_until
from tests.integration.test_claim_queues import _done, _front_look_hung
from tests.testapp.tasks import record, sleeper


@pytest.fixture
def listener() -> Iterator[psycopg.Connection]:
    conn = psycopg.connect(**connection_params(), autocommit=True)
    try:
        conn.execute(f"LISTEN {conf.get('NOTIFY_CHANNEL')}")
        yield conn
    finally:
        conn.close()


def _heard(listener: psycopg.Connection) -> list:
    return [parse_payload(n.payload) for n in listener.notifies(timeout=2, stop_after=1)]


@pytest.mark.django_db(transaction=True)
def test_a_workflow_child_made_due_is_announced_with_its_place(listener):
    """A parent's finish settles its edges (``leasejobs_settle_parents``, in FINISH's
    statement): the child made due is announced by its queue, priority, run_at and id."""
    with leasejobs.workflow("notify") as wf:
        parent = wf.add(record, args=(1,))
        child = wf.add(record, args=(2,), after=[parent], queue="reports", priority=3)
    list(listener.notifies(timeout=0.3))  # the parent's enqueue
    with transaction.atomic(), connection.cursor() as cursor:
        Job.objects.filter(id=parent.id).update(status="done", finished_at=Now())
        cursor.execute(
            "SELECT leasejobs_settle_parents(%s, %s, %s)", [[parent.id], ["done"], conf.get("NOTIFY_CHANNEL")]
        )
    [notice] = _heard(listener)
    child_row = Job.objects.get(id=child.id)
    assert (notice.queue, notice.place[0], notice.place[1].id) == ("reports", 3, child.id)
    assert dt.datetime.fromisoformat(str(notice.place[1].run_at)) == child_row.run_at


@pytest.mark.django_db(transaction=True)
def test_a_child_that_runs_anyway_made_due_by_an_admins_cancel_is_announced(listener):
    """The admin cancels a queued parent; its child asked to run whatever its parents'
    outcome: due at once, and announced (the cancel used to send no NOTIFY at all)."""
    with leasejobs.workflow("cancelled parent") as wf:
        parent = wf.add(record, args=(1,), delay=3600)
        child = wf.add(record, args=(2,), after=[parent], on_parent_failure="run")
    list(listener.notifies(timeout=0.3))
    with connection.cursor() as cursor:
        cursor.execute(
            sql.ADMIN_CANCEL,
            {
                "ids": [parent.id],
                "statuses": ["queued"],
                "attempts": [0],
                "channel": conf.get("NOTIFY_CHANNEL"),
            },
        )
    [notice] = _heard(listener)
    assert (notice.queue, notice.place[1].id) == ("default", child.id)


@pytest.mark.django_db(transaction=True)
def test_a_job_retried_from_the_admin_is_announced_with_its_place(listener):
    job = record.enqueue(1)
    Job.objects.filter(id=job.id).update(status="failed", finished_at=Now(), attempt=1, runs=1)
    list(listener.notifies(timeout=0.3))
    with connection.cursor() as cursor:
        cursor.execute(
            sql.ADMIN_RETRY,
            {"ids": [job.id], "statuses": ["failed"], "attempts": [1], "channel": conf.get("NOTIFY_CHANNEL")},
        )
    [notice] = _heard(listener)
    assert (notice.queue, notice.place[1].id) == ("default", job.id)


def test_a_lease_released_from_the_admin_is_claimed_again_without_a_walk(start_worker):
    """A job runs (attempt 1); later jobs are claimed and run, so the worker's key moves
    past it; then its lease is released from the admin. The job keeps its old ``run_at``:
    it lies behind the key. With the front look hung (as under a pinned horizon), what
    happened: the released job was claimed again only when the stuck look was walked
    past, about 10 s later. Its NOTIFY now carries its place, and the next claim
    starts before it."""
    worker, pid = _front_look_hung(start_worker, "release-late")
    try:
        held = sleeper.enqueue(30)
        wait_until(lambda: Job.objects.get(pk=held.pk).status == "running", timeout=20, what="it runs")
        time.sleep(0.3)
        jobs = [record.enqueue(n) for n in range(1, 11)]
        wait_until(lambda: _done(*jobs), timeout=30, what="the later jobs done")
        with connection.cursor() as cursor:
            cursor.execute(
                sql.ADMIN_RELEASE, {"ids": [held.pk], "attempts": [1], "channel": conf.get("NOTIFY_CHANNEL")}
            )
            assert cursor.rowcount == 1
        released = time.monotonic()
        wait_until(
            lambda: Job.objects.get(pk=held.pk).attempt == 2,
            timeout=30,
            what="the released job claimed again",
        )
        took = time.monotonic() - released
    finally:
        os.kill(pid, signal.SIGCONT)
    assert worker.proc.poll() is None
    assert took < 4, f"the released job was claimed again {took:.1f} s after the release: after a walk"
