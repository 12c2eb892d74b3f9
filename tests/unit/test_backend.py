"""leasejobs as Django's Tasks backend (Django 6+; skipped on Django 5.2, which has no django.tasks).

In-process tests follow what Django's own backend tests check
(tests/tasks/test_dummy_backend.py, test_immediate_backend.py, test_tasks.py
in django/django) where it applies to a backend with a separate worker; the
worker tests run real ``runworker`` processes, including the failure
django-tasks-db has (a worker SIGKILLed mid-task leaves the task RUNNING
forever, django-tasks issue #46) reproduced against leasejobs.
"""

import dataclasses
import datetime as dt

import pytest

pytest.importorskip("django.tasks")

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued
from django.test import override_settings
from django.utils import timezone

from leasejobs.backend import JobFailed, LeaseJobsBackend, LeaseJobsTask
from leasejobs.models import Job
from tests.testapp import django_tasks as dtasks
from tests.testapp.tasks import add

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


@task
def not_in_a_tasks_module():
    """A valid Task the worker would never know: this module is no tasks module."""


# -- the backend, in process ---------------------------------------------------


def test_the_default_backend_is_leasejobs():
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], LeaseJobsBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {"MAX_ATTEMPTS": 2}
    assert all(
        getattr(LeaseJobsBackend, f"supports_{flag}")
        for flag in ("defer", "async_task", "get_result", "priority")
    )
    assert isinstance(dtasks.slow_receipt, LeaseJobsTask) and dtasks.slow_receipt.lease_seconds == 2
    assert default_task_backend.check() == []


@pytest.mark.parametrize("django_task", [dtasks.noop, dtasks.noop_async], ids=["sync", "async"])
def test_enqueue_returns_a_ready_result_and_inserts_a_job(db, django_task):
    result = django_task.enqueue(1, two=3)

    assert result.status == READY and result.is_finished is False
    assert (result.started_at, result.last_attempted_at, result.finished_at) == (None, None, None)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == django_task
    assert (result.args, result.kwargs, result.attempts, result.errors) == ([1], {"two": 3}, 0, [])
    job = Job.objects.get(pk=int(result.id))
    assert (job.task_name, job.queue, job.status, job.args, job.kwargs) == (
        django_task.module_path,
        "default",
        "queued",
        [1],
        {"two": 3},
    )
    assert result.enqueued_at == job.created_at


def test_aenqueue_and_aget_result(db):
    async def scenario():
        result = await dtasks.noop_async.aenqueue()
        return (
            result,
            await default_task_backend.aget_result(result.id),
            await dtasks.noop_async.aget_result(result.id),
        )

    result, fetched, through_task = async_to_sync(scenario)()
    assert result.status == READY and (result.args, result.kwargs) == ([], {})
    assert fetched == result == through_task


def test_get_result_and_refresh_give_the_enqueued_result_back(db):
    result = default_task_backend.enqueue(dtasks.meaning_of_life, (), {})
    assert default_task_backend.get_result(result.id) == result
    assert dtasks.meaning_of_life.get_result(result.id) == result

    before = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == before
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == before


@pytest.mark.parametrize("hours", [1, -1])
def test_get_result_gives_run_after_back_as_enqueue_returned_it(db, hours):
    when = timezone.now() + dt.timedelta(hours=hours)
    result = dtasks.noop.using(run_after=when).enqueue()
    assert result.task.run_after == when
    fetched = default_task_backend.get_result(result.id)
    assert fetched.task.run_after == when
    assert fetched == result == dtasks.noop.get_result(result.id)


def test_get_result_of_a_task_due_at_once_has_no_run_after(db):
    with transaction.atomic():  # run_at and created_at: the enqueue statement's time, not the transaction's
        result = dtasks.noop.enqueue()
    assert result.task.run_after is None
    assert default_task_backend.get_result(result.id) == result


@pytest.mark.parametrize("result_id", ["123456789", "abc", "", "-1", "0", "9" * 30, 123456789])
def test_get_result_of_no_job_raises(db, result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)(result_id)


def test_get_result_of_a_leasejobs_job_raises(db):
    job = add.enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist, match=f"{job.id}: .*tests.testapp.tasks.add"):
        default_task_backend.get_result(str(job.id))


def test_get_result_through_another_task_is_a_mismatch(db):
    result = dtasks.noop_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        dtasks.noop.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(dtasks.noop.aget_result)(result.id)


def test_enqueue_options_reach_the_job(db):
    later = timezone.now() + dt.timedelta(hours=1)
    result = dtasks.noop.using(priority=-7, run_after=later).enqueue()
    job = Job.objects.get(pk=int(result.id))
    assert (job.priority, job.run_at, job.max_attempts) == (-7, later, 2)  # OPTIONS["MAX_ATTEMPTS"]
    assert default_task_backend.get_result(result.id).task.priority == -7

    flaky = Job.objects.get(pk=int(dtasks.flaky.enqueue(1).id))
    assert flaky.max_attempts == 3  # the task's own field wins over OPTIONS


def test_enqueue_belongs_to_the_callers_transaction(db):
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = dtasks.noop.enqueue()
        assert default_task_backend.get_result(result.id).status == READY
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)


def test_enqueue_validates_and_inserts_nothing_when_invalid(db):
    with pytest.raises(InvalidTask, match="Queue 'nope' is not valid for backend"):
        dtasks.noop.using(queue_name="nope")
    with override_settings(
        TASKS={"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend", "QUEUES": ["q1"]}}
    ):
        with pytest.raises(InvalidTask, match="Queue 'default' is not valid for backend"):
            dtasks.noop.enqueue()
        with pytest.raises(InvalidTask, match="Queue 'default' is not valid for backend"):
            async_to_sync(dtasks.noop.aenqueue)()
    with pytest.raises(TypeError, match="Unsupported type"):
        dtasks.noop.enqueue(dt.datetime.now())
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        dtasks.noop.using(run_after=dt.datetime.now())
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        dtasks.noop.using(priority=101)
    with pytest.raises(InvalidTask, match="is in no module runworker searches for Django Tasks"):
        not_in_a_tasks_module.enqueue()
    assert not Job.objects.exists()


def test_per_task_options_and_backend_options_are_checked():
    for bad in ({"lease_seconds": 0}, {"timeout_seconds": -1}, {"max_attempts": 0}, {"max_attempts": 1.5}):
        with pytest.raises(InvalidTask, match=f"{next(iter(bad))} of task .* must be"):
            task(**bad)(not_in_a_tasks_module.func)
    backend = "leasejobs.backend.LeaseJobsBackend"
    for options, error in (
        ({"LEASE": 3}, r"Unknown OPTIONS \['LEASE'\]"),
        ({"LEASE_SECONDS": "3"}, r"'LEASE_SECONDS'.* must be a number of seconds, at least 1"),
        ({"LEASE_SECONDS": 0.5}, r"'LEASE_SECONDS'.* must be a number of seconds, at least 1 .*not 0\.5"),
        ({"MAX_ATTEMPTS": 0}, r"'MAX_ATTEMPTS'.* must be a whole number"),
    ):
        settings = {"default": {"BACKEND": backend, "OPTIONS": options}}
        with override_settings(TASKS=settings), pytest.raises(ImproperlyConfigured, match=error):
            task_backends["default"]


def test_enqueue_sends_task_enqueued_and_django_logs_it(db, caplog):
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        with caplog.at_level("DEBUG", logger="django.tasks"):
            result = dtasks.noop.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert received == [(LeaseJobsBackend, result)]
    assert [r.getMessage() for r in caplog.records if r.name == "django.tasks"] == [
        f"Task id={result.id} path=tests.testapp.django_tasks.noop enqueued backend=default"
    ]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("queued", READY),
        ("running", RUNNING),
        ("done", SUCCESSFUL),
        ("failed", FAILED),
        ("cancelled", FAILED),
    ],
)
def test_job_states_map_to_task_result_states(db, status, expected):
    started = timezone.now()
    entry = {"attempt": 1, "worker_id": "w1", "exception_class": "builtins.ValueError", "traceback": "tb 1"}
    job = Job.objects.create(
        task_name=dtasks.meaning_of_life.module_path,
        status=status,
        attempt=2,
        max_attempts=2,
        run_at=started,
        started_at=started,
        finished_at=started if expected in (SUCCESSFUL, FAILED) else None,
        worker_ids=["w1", "w2"],
        errors=[entry],
        result=42 if status == "done" else None,
        last_error="lease expired on the last attempt (2 of 2): worker w2 stopped heartbeating",
    )
    result = default_task_backend.get_result(str(job.id))

    assert (result.status, result.worker_ids, result.attempts) == (expected, ["w1", "w2"], 2)
    assert (result.enqueued_at, result.started_at, result.last_attempted_at) == (
        job.created_at,
        started,
        started,
    )
    assert result.errors[0].exception_class is ValueError and result.errors[0].traceback == "tb 1"
    if expected == SUCCESSFUL:
        assert result.return_value == 42
    if expected == FAILED:
        # The second attempt ended without an exception: it is still listed.
        assert [e.exception_class for e in result.errors] == [ValueError, JobFailed]
        assert result.errors[1].traceback == job.last_error
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
    else:
        assert len(result.errors) == 1


# -- the worker runs Django Tasks ----------------------------------------------


def test_a_first_lookup_under_a_tests_settings_does_not_hide_the_projects_tasks(db, monkeypatch):
    """Discovery runs once a process; a first lookup made under a test's LEASEJOBS (no
    TASK_MODULES) must not stay the answer once the project's settings are back."""
    from leasejobs.jobs import registry
    from leasejobs.tasks_backend import backend

    monkeypatch.setattr(backend, "_discovered", False)
    monkeypatch.setattr(registry, "_registry", {})  # a process that has discovered nothing yet
    with override_settings(LEASEJOBS={"TASK_MODULES": []}):
        backend.find(dtasks.noop.module_path)
    assert backend.find(dtasks.noop.module_path, dtasks.noop.func) is not None
    assert dtasks.noop.enqueue().id
