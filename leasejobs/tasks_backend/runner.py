"""One attempt of a Django Task in leasejobs' worker, with Django's signals around it.

The worker stays generic: it calls ``registry.get(task_name).func(ctx, ...)``.
For a Django Task that function is a ``DjangoTaskRunner``: it builds Django's
``TaskResult``/``TaskContext``, sends ``task_started``, calls the Task, and
sends ``task_finished``; on failure it re-raises, so the worker's retry and
fencing rules apply unchanged. The runner also tells the backend which Django
Task a registered name stands for (``runner.task``).

Imported only where ``django.tasks`` exists (Django 6+).
"""

from collections.abc import Sequence
from typing import Any

from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from leasejobs.conf import db_alias
from leasejobs.db.rows import exception_entry
from leasejobs.exceptions import LeaseLost, Suspended
from leasejobs.jobs import retry
from leasejobs.jobs.context import JobContext
from leasejobs.models import Job
from leasejobs.tasks_backend.results import task_result


class DjangoTaskRunner:
    """The function the registry holds for a Django Task: ``runner(ctx, *args, **kwargs)``.

    It carries the module and qualified name of the Task's function, which
    the registry names in a clash of task names.
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.__module__ = task.func.__module__
        self.__qualname__ = task.func.__qualname__

    def __call__(self, ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        return run(self.task, ctx, args, kwargs)


def run(task: Task, ctx: JobContext, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """One attempt of a Django Task.

    The TaskResult comes from the job row as this claim left it (RUNNING,
    this worker last in its ``worker_ids``, so ``TaskContext.attempt`` is the
    fencing token). ``task_finished`` carries the status ``get_result`` will
    show once the worker writes the outcome: SUCCESSFUL, FAILED, or READY
    when a retry follows. A ``LeaseLost`` escaping the body ends nothing (the
    attempt that holds the job owns the outcome), so no signal is sent; nor
    for a durable sleep or wait (``leasejobs.current_job().sleep``), which
    ends the attempt without finishing the task.
    """
    backend = task.get_backend()
    job = Job.objects.using(db_alias()).get(pk=ctx.job_id)
    result = task_result(task, job, backend.alias)
    task_started.send(type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)  # Django's rule; a TypeError fails the attempt
    except (LeaseLost, Suspended):  # no outcome of its own / a durable sleep or wait: not finished
        raise
    except BaseException as exc:
        # The worker's own decision (leasejobs.jobs.retry), so the signal says what it will write.
        policy = retry.policy_for(None, job.retry_policy)
        decision = retry.decide(policy, exc, ctx.runs, job.max_attempts, job.snoozes)
        final = ctx.cancel_requested or decision.action in ("fail", "discard")
        entry = exception_entry(ctx.attempt, ctx.worker_id, exc)
        result.errors.append(
            TaskError(exception_class_path=entry["exception_class"], traceback=entry["traceback"])
        )
        _finish(backend, result, TaskResultStatus.FAILED if final else TaskResultStatus.READY)
        raise  # sent inside the except block: Django's receiver logs the traceback
    _finish(
        backend,
        result,
        TaskResultStatus.FAILED if ctx.cancel_requested else TaskResultStatus.SUCCESSFUL,
        value,
    )
    return value


def _finish(backend: Any, result: TaskResult, status: str, value: Any = None) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", None if status == TaskResultStatus.READY else timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(backend), task_result=result)
