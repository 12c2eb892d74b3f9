"""leasejobs as a backend of Django's Tasks framework (``django.tasks``, Django 6+).

``TASKS = {"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend"}}``
makes ``@django.tasks.task`` functions enqueue into leasejobs' table, and
``manage.py runworker`` runs them with leases, heartbeats, fencing and
retries. Django's reference database backend (django-tasks-db) has no lease:
a worker killed mid-task leaves the task RUNNING forever
(https://github.com/RealOrangeOne/django-tasks/issues/46); here the lease runs
out and another worker takes the task over.

Django instantiates the backend when a module using ``@task`` is imported,
possibly before the app registry is ready, so nothing here imports models at
import time: the modules that do (``Job``, leasejobs' enqueue and registry)
are imported inside the methods that use them.

On Django 5.2 (no ``django.tasks``) importing this module raises
``ImproperlyConfigured``; the rest of leasejobs works without it.
"""

import dataclasses
from typing import Any

import django
from django.core.exceptions import ImproperlyConfigured

try:
    from django.tasks.backends.base import BaseTaskBackend
except ImportError as exc:  # Django 5.2
    raise ImproperlyConfigured(
        "leasejobs.backend.LeaseJobsBackend needs Django 6.0 or newer (django.tasks); this is "
        f"Django {django.get_version()}. Upgrade Django (which needs Python 3.12+), or remove "
        "leasejobs.backend.LeaseJobsBackend from TASKS and use leasejobs' own @task."
    ) from exc

from django.apps import apps
from django.core import checks
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json

#: Job.status -> the TaskResultStatus Django shows. A job waiting for a retry
#: is READY ("ready to be executed again", as Django's enum puts it).
STATUS = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}

#: OPTIONS the backend reads: defaults for the tasks of this backend that do
#: not set the field of the same name (lower case) on their Task.
OPTION_NAMES = ("LEASE_SECONDS", "MAX_ATTEMPTS", "TIMEOUT_SECONDS")


class JobFailed(Exception):
    """Stands for a failure that raised nothing in the task body.

    A ``TaskResult`` lists one ``TaskError`` per failed attempt; a job can
    also end without an exception of its own (its last attempt's worker
    stopped heartbeating, no worker knows its task, it was cancelled). Such an
    ending gets a ``TaskError`` of this class whose traceback is the reason.
    """


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaseJobsTask(Task):
    """A Django Task with leasejobs' per-task options (``@task(lease_seconds=60)``).

    Django 6.1 passes extra ``@task`` keyword arguments to the backend's
    ``task_class``; on 6.0 the backend's OPTIONS are the only way to set them.
    ``None`` means: the backend's OPTIONS, else the LEASEJOBS setting (or the
    worker's ``--lease``).
    """

    max_attempts: int | None = None
    lease_seconds: float | None = None
    timeout_seconds: float | None = None


class LeaseJobsBackend(BaseTaskBackend):
    """Enqueues Django Tasks as leasejobs jobs; ``runworker`` runs them.

    The result id is the job's id. ``OPTIONS``: ``LEASE_SECONDS``,
    ``MAX_ATTEMPTS``, ``TIMEOUT_SECONDS``, defaults for the tasks of this
    backend (a task's own field wins; an OPTIONS lease wins over ``--lease``).
    """

    task_class = LeaseJobsTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = set(self.options) - set(OPTION_NAMES)
        if unknown:
            raise ImproperlyConfigured(
                f"Unknown OPTIONS {sorted(unknown)} for the leasejobs task backend {alias!r}; "
                f"known: {list(OPTION_NAMES)}."
            )
        for name in OPTION_NAMES:
            problem = _option_problem(name.lower(), self.options.get(name))
            if problem:
                raise ImproperlyConfigured(f"OPTIONS[{name!r}] of task backend {alias!r} {problem}")

    def validate_task(self, task: Task) -> None:
        """Django's rules, then leasejobs' per-task options.

        Runs when a task is decorated, maybe before apps are ready: no models.
        """
        super().validate_task(task)
        for name in ("max_attempts", "lease_seconds", "timeout_seconds"):
            problem = _option_problem(name, getattr(task, name, None))
            if problem:
                raise InvalidTask(f"{name} of task {task.module_path} {problem}")

    def task_option(self, task: Task, name: str) -> Any:
        """The task's own ``name`` field, else this backend's OPTIONS, else None."""
        value = getattr(task, name, None)
        return value if value is not None else self.options.get(name.upper())

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert a job through leasejobs' enqueue, in the caller's transaction.

        A rolled back transaction leaves no job; workers are woken by a NOTIFY
        on commit. A task no worker would know (defined outside the tasks
        modules the worker imports) is refused here, not failed later.
        """
        from leasejobs import django_tasks
        from leasejobs import enqueue as jobs

        self.validate_task(task)
        if django_tasks.find(task.module_path, task.func) is None:
            raise InvalidTask(
                f"Task {task.module_path} is not one the leasejobs worker runs: define it, for a "
                "LeaseJobsBackend, in the tasks module of an installed app or in a module listed in "
                "LEASEJOBS['TASK_MODULES']."
            )
        spec = jobs.build(
            task.module_path,
            normalize_json(list(args)),  # Django's rules: tuples become lists, bytes text
            normalize_json(dict(kwargs)),
            queue=task.queue_name,
            priority=task.priority,
            max_attempts=self.task_option(task, "max_attempts"),
            run_at=task.run_after,
        )
        result = task_result(task, jobs.insert(spec), self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> TaskResult:
        """The TaskResult of job ``result_id``, read from the database.

        Raises ``TaskResultDoesNotExist`` for an id that is no job, or a job of
        no Django Task this project defines (a leasejobs task's job, say).
        """
        from leasejobs import django_tasks
        from leasejobs.enqueue import db_alias
        from leasejobs.models import Job

        try:
            job_id = int(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(db_alias()).filter(pk=job_id).first() if 0 < job_id < 2**63 else None
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        task = django_tasks.find(job.task_name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: job {job.id} runs {job.task_name!r}, which is no Django Task of this project"
            )
        return task_result(task, job, self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        if apps.is_installed("leasejobs"):
            return []
        return [
            checks.Error(
                f"The task backend {self.alias!r} is leasejobs.backend.LeaseJobsBackend, but "
                "'leasejobs' is not in INSTALLED_APPS.",
                hint="Add 'leasejobs' to INSTALLED_APPS and run migrate: its table holds the tasks.",
                id="leasejobs.E001",
            )
        ]


def _option_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is no valid ``name`` (max_attempts, lease_seconds...), or None."""
    if value is None:
        return None
    if name == "max_attempts":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return "must be a whole number of at least 1."
    elif isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return "must be a positive number of seconds."
    return None


def task_result(task: Task, job: Any, alias: str) -> TaskResult:
    """A Job seen as Django's TaskResult.

    ``errors`` has one entry per failed attempt (exception class path and
    traceback), plus a ``JobFailed`` entry when the job ended without an
    exception of its own; ``worker_ids`` one per claim, so ``attempts`` is
    the job's attempt. ``last_attempted_at`` is the latest claim's start.
    """
    if (task.priority, task.queue_name) != (job.priority, job.queue):
        task = task.using(priority=job.priority, queue_name=job.queue)
    errors = [
        TaskError(exception_class_path=e["exception_class"], traceback=e["traceback"]) for e in job.errors
    ]
    status = STATUS[job.status]
    if status == TaskResultStatus.FAILED and not any(e.get("attempt") == job.attempt for e in job.errors):
        errors.append(
            TaskError(
                exception_class_path=f"{JobFailed.__module__}.{JobFailed.__qualname__}",
                traceback=job.last_error or f"the job was {job.status}",
            )
        )
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=job.args,
        kwargs=job.kwargs,
        backend=alias,
        errors=errors,
        worker_ids=list(job.worker_ids),
    )
    # Frozen dataclass: Django's own backends set the return value this way.
    object.__setattr__(result, "_return_value", job.result if status == TaskResultStatus.SUCCESSFUL else None)
    return result
