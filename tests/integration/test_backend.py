"""The integration half of tests/unit/test_backend.py: its tests that start workers or commit."""

import asyncio
import re
import signal

import pytest

pytest.importorskip("django.tasks")

from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist

from leasejobs.jobs import enqueue
from leasejobs.models import Job
from tests.helpers import wait_until
from tests.testapp import django_tasks as dtasks
from tests.testapp.models import BodyRun, Sent

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def result_when(result_id, *statuses, timeout=20.0):
    """The TaskResult once its status is one of ``statuses`` (bounded wait)."""

    def ready():
        found = default_task_backend.get_result(result_id)
        return found if found.status in statuses else None

    return wait_until(ready, timeout, what=f"result {result_id} in {statuses}")


def task_log(worker, result_id, state):
    """Lines Django's own task_started / task_finished receivers logged in the worker."""
    return re.findall(rf"Task id={result_id} path=\S+ state={state}\b", worker.log())


# -- the backend, in process ---------------------------------------------------


# -- the worker runs Django Tasks ----------------------------------------------


def test_worker_runs_tasks_and_sends_started_and_finished(start_worker):
    meaning = dtasks.meaning_of_life.enqueue()
    own_id = dtasks.task_id.enqueue()
    noop = dtasks.noop.enqueue(1, two=3)
    worker = start_worker("--worker-id", "w-run")

    for result, value in ((meaning, 42), (own_id, own_id.id), (noop, None)):
        done = result_when(result.id, SUCCESSFUL, FAILED)
        assert (done.status, done.return_value, done.worker_ids, done.errors) == (
            SUCCESSFUL,
            value,
            ["w-run"],
            [],
        )
        assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
        result.refresh()
        assert result.status == SUCCESSFUL and result.attempts == 1
        worker.wait_for_log(rf"Task id={result.id} path=\S+ state=SUCCESSFUL")
        assert len(task_log(worker, result.id, "RUNNING")) == 1
        assert len(task_log(worker, result.id, "SUCCESSFUL")) == 1


def test_sigkill_mid_task_is_recovered_after_the_lease(start_worker):
    """django-tasks-db leaves this task RUNNING forever; here it ends SUCCESSFUL on attempt 2.

    slow_receipt has a 2 s lease of its own (the workers' default is 30 s), so
    the second worker takes it over within seconds of the kill.
    """
    result = dtasks.slow_receipt.enqueue("o-1", 60)
    assert default_task_backend.get_result(result.id).status == READY  # before

    first = start_worker("--worker-id", "w1")
    running = result_when(result.id, RUNNING)  # during
    assert (running.worker_ids, running.attempts, running.finished_at) == (["w1"], 1, None)
    assert running.started_at is not None
    wait_until(lambda: BodyRun.objects.filter(job_id=int(result.id)).exists(), what="the first body to start")

    first.signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    assert default_task_backend.get_result(result.id).status == RUNNING  # what django-tasks-db stays at

    second = start_worker("--worker-id", "w2")
    done = result_when(result.id, SUCCESSFUL, FAILED, timeout=15)  # after
    assert (done.status, done.attempts, done.worker_ids) == (SUCCESSFUL, 2, ["w1", "w2"])
    assert done.return_value == {"attempt": 2, "worker_id": "w2"}
    assert done.errors == []
    assert BodyRun.objects.filter(job_id=int(result.id)).count() == 2
    assert list(Sent.objects.filter(job_id=int(result.id)).values_list("attempt", flat=True)) == [2]
    second.wait_for_log(rf"Task id={result.id} path=\S+ state=SUCCESSFUL")


def test_retries_then_success_and_final_failures(start_worker):
    flaky = dtasks.flaky.enqueue(2)  # max_attempts=3 on the task
    failing = dtasks.always_fails.enqueue()  # OPTIONS["MAX_ATTEMPTS"] = 2
    bad_value = dtasks.returns_a_set.enqueue()
    worker = start_worker("--worker-id", "w-retry")

    done = result_when(flaky.id, SUCCESSFUL, FAILED)
    assert (done.status, done.return_value, done.attempts) == (SUCCESSFUL, 3, 3)
    assert [e.exception_class for e in done.errors] == [ValueError, ValueError]
    assert done.errors[0].traceback.startswith("Traceback (most recent call last):")
    assert done.errors[0].traceback.endswith("ValueError: failure 1 of 2\n")
    assert done.errors[1].traceback.endswith("ValueError: failure 2 of 2\n")

    failed = result_when(failing.id, FAILED)
    assert (failed.attempts, failed.is_finished, failed.worker_ids) == (2, True, ["w-retry", "w-retry"])
    assert [e.exception_class for e in failed.errors] == [RuntimeError, RuntimeError]
    assert failed.errors[-1].traceback.endswith("RuntimeError: always fails\n")
    assert failed.finished_at >= failed.started_at
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018

    unsupported = result_when(bad_value.id, FAILED)
    assert unsupported.errors[0].exception_class is TypeError
    assert "Unsupported type" in unsupported.errors[0].traceback

    # task_finished after every attempt, with the status get_result then shows;
    # sent from inside the except block, so Django's receiver logs the traceback.
    worker.wait_for_log(rf"Task id={failing.id} path=\S+ state=FAILED")
    assert len(task_log(worker, flaky.id, "RUNNING")) == 3
    assert len(task_log(worker, flaky.id, "READY")) == 2
    assert len(task_log(worker, flaky.id, "SUCCESSFUL")) == 1
    assert len(task_log(worker, failing.id, "READY")) == 1
    log = worker.log()
    after_failure = log[
        log.index(f"Task id={failing.id} path=tests.testapp.django_tasks.always_fails state=FAILED") :
    ]
    assert re.match(
        r"[^\n]*\nTraceback \(most recent call last\):\n(.*\n)*?RuntimeError: always fails\n", after_failure
    )


def test_async_tasks_run_with_the_fencing_context(start_worker):
    receipt = async_to_sync(dtasks.async_receipt.aenqueue)("o-async")
    noop = dtasks.noop_async.enqueue()
    start_worker("--worker-id", "w-async")

    done = async_to_sync(_aresult_when)(receipt.id)
    assert done.return_value == {"created": True, "job_id": int(receipt.id), "result_id": receipt.id}
    assert list(Sent.objects.filter(job_id=int(receipt.id)).values_list("key", "attempt")) == [
        ("django-async:o-async", 1)
    ]
    assert result_when(noop.id, SUCCESSFUL, FAILED).status == SUCCESSFUL


async def _aresult_when(result_id):
    for _ in range(400):
        result = await default_task_backend.aget_result(result_id)
        if result.is_finished:
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"result {result_id} did not finish in 20 s")


def test_a_row_naming_anything_else_fails_as_unknown_and_imports_nothing(start_worker):
    """Only Task objects found in the tasks modules run: ``this`` (whose import
    prints the Zen of Python) is never imported, a helper of a tasks module never called."""
    rows = [
        enqueue.insert(enqueue.build(name, [], {}, queue="default", priority=0, max_attempts=1))
        for name in (
            "this.s",
            "tests.testapp.django_tasks._send_once",
            "tests.testapp.django_tasks.time.sleep",
        )
    ]
    marker = dtasks.noop.enqueue()
    worker = start_worker("--worker-id", "w-unknown")
    result_when(marker.id, SUCCESSFUL)
    for job in rows:
        job = wait_until(lambda job=job: Job.objects.filter(pk=job.id, status="failed").first())
        assert job.last_error == f"unknown task {job.task_name!r}"
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(str(job.id))
    assert "Beautiful is better than ugly" not in worker.log()
    assert not Sent.objects.exists()
