"""Django Tasks (``django.tasks``, Django 6+) run by leasejobs' worker.

The worker stays generic: it runs whatever ``registry.get(task_name)``
returns. ``registry.autodiscover()`` hands the modules it imported to
``register_from``, which registers each Django Task of a ``LeaseJobsBackend``
found in them as a leasejobs task named by the Task's ``module_path`` (what
the backend's enqueue stores as ``task_name``). The registered function is an
adapter: it builds Django's ``TaskResult``/``TaskContext``, sends
``task_started``, calls the Task, and sends ``task_finished``; on failure it
re-raises, so the worker's retry and fencing rules apply unchanged.

Only Task objects found in those modules run: a row naming anything else
fails as an unknown task, and nothing is imported by a name from a row.
django-tasks-db resolves the stored path with ``import_string`` instead.

On Django 5.2 there is no ``django.tasks``: ``register_from`` does nothing.
"""

import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from leasejobs import registry
from leasejobs.context import JobContext
from leasejobs.enqueue import db_alias
from leasejobs.exceptions import LeaseLost
from leasejobs.models import Job

try:
    from django.tasks import Task as DjangoTask
except ImportError:  # Django 5.2
    DjangoTask = None
else:
    from django.tasks import TaskContext, TaskResultStatus
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTaskBackend
    from django.tasks.signals import task_finished, task_started
    from django.utils.json import normalize_json

    from leasejobs.backend import LeaseJobsBackend, task_result

if TYPE_CHECKING:
    from django.tasks import Task, TaskResult

logger = logging.getLogger("leasejobs.worker")

#: The Django Tasks the worker may run, by module path; filled by register_from.
_tasks: dict[str, "Task"] = {}
_discovered = False
# Reentrant: a tasks module imported by discovery may itself enqueue.
_lock = threading.RLock()


def register_from(modules: Iterable[ModuleType]) -> None:
    """Register the Django Tasks of a LeaseJobsBackend defined in ``modules``.

    Called by ``registry.autodiscover()`` with the modules it imported. A Task
    re-exported under another name (or a ``.using()`` copy) is registered
    once, as the object its module path names.
    """
    global _discovered
    if DjangoTask is None:
        return
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, DjangoTask):
                continue
            task = _canonical(value)
            try:
                backend = task.get_backend()
            except InvalidTaskBackend:
                continue
            if not isinstance(backend, LeaseJobsBackend):
                continue
            registry.register(
                registry.Task(
                    func=_adapter(task),
                    name=task.module_path,
                    queue=task.queue_name,
                    priority=task.priority,
                    max_attempts=backend.task_option(task, "max_attempts"),
                    lease_seconds=backend.task_option(task, "lease_seconds"),
                    timeout_seconds=backend.task_option(task, "timeout_seconds"),
                    takes_context=True,
                )
            )
            _tasks[task.module_path] = task
            logger.debug("registered Django task %s backend=%s", task.module_path, task.backend)
    _discovered = True


def _canonical(task: "Task") -> "Task":
    """The Task object bound to the name its module path gives, if it is one
    for the same function (the module is loaded already: it defined it)."""
    module = sys.modules.get(task.func.__module__)
    named = getattr(module, task.func.__qualname__, None) if module is not None else None
    return named if isinstance(named, DjangoTask) and named.func is task.func else task


def find(module_path: str, func: Callable[..., Any] | None = None) -> "Task | None":
    """The Django Task the worker knows by ``module_path`` (for ``func``, if given), or None.

    The first call in a process that has not discovered tasks yet (a web
    process) runs ``registry.autodiscover()``, the same imports a worker does.
    """
    if not _discovered:
        with _lock:
            if not _discovered:
                registry.autodiscover()
    task = _tasks.get(module_path)
    if task is None or (func is not None and task.func is not func):
        return None
    return task


def _adapter(task: "Task") -> Callable[..., Any]:
    def run(ctx: JobContext, *args: Any, **kwargs: Any) -> Any:
        return _run(task, ctx, args, kwargs)

    # The registry names the function in a clash of task names: name the Task's.
    run.__module__ = task.func.__module__
    run.__qualname__ = task.func.__qualname__
    return run


def _run(task: "Task", ctx: JobContext, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """One attempt of a Django Task, with Django's signals around it.

    The TaskResult comes from the job row as this claim left it (RUNNING,
    this worker last in ``worker_ids``, so ``TaskContext.attempt`` is the
    fencing token). ``task_finished`` carries the status ``get_result`` will
    show once the worker writes the outcome: SUCCESSFUL, FAILED, or READY
    when a retry follows. A ``LeaseLost`` escaping the body ends nothing (the
    attempt that holds the job owns the outcome), so no signal is sent.
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
    except LeaseLost:
        raise
    except BaseException as exc:
        final = ctx.cancel_requested or ctx.attempt >= job.max_attempts
        result.errors.append(
            TaskError(
                exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
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


def _finish(backend: Any, result: "TaskResult", status: str, value: Any = None) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", None if status == TaskResultStatus.READY else timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(backend), task_result=result)
