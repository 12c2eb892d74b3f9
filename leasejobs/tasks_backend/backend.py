"""leasejobs as a backend of Django's Tasks framework (``django.tasks``, Django 6+).

``TASKS = {"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend"}}``
makes ``@django.tasks.task`` functions enqueue into leasejobs' table, and
``manage.py runworker`` runs them with leases, heartbeats, fencing and
retries. Django's reference database backend (django-tasks-db) has no lease:
a worker killed mid-task leaves the task RUNNING forever
(https://github.com/RealOrangeOne/django-tasks/issues/46); here the lease runs
out and another worker takes the task over.

The public path is ``leasejobs.backend.LeaseJobsBackend``, which re-exports
this module's classes. Django instantiates the backend when a module using
``@task`` is imported, possibly before the app registry is ready, so nothing
here imports models at import time: the modules that do (``Job``, leasejobs'
enqueue and registry, the runner) are imported inside the functions that use
them. None of them imports this module back.

The worker registers the Django Tasks it may run with ``register_from`` (see
``leasejobs.tasks_backend``); the backend asks the registry which Django Task
a name stands for (``find``).

On Django 5.2 (no ``django.tasks``) importing this module raises
``ImproperlyConfigured``; the rest of leasejobs works without it.
"""

import dataclasses
import logging
import sys
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any, cast

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
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.tasks import Task, TaskResult
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json

from leasejobs.conf import db_alias
from leasejobs.db.rows import TASK_OPTIONS, validate_task_options
from leasejobs.tasks_backend.results import JobFailed, task_result

__all__ = ["JobFailed", "LeaseJobsBackend", "LeaseJobsTask", "find", "register_from"]

logger = logging.getLogger("leasejobs.worker")

#: OPTIONS the backend reads: defaults for the tasks of this backend that do
#: not set the field of the same name (lower case) on their Task.
OPTION_NAMES = ("LEASE_SECONDS", "MAX_ATTEMPTS", "TIMEOUT_SECONDS")


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
            value = self.options.get(name)
            if value is not None:
                try:
                    TASK_OPTIONS[name.lower()](value, f"OPTIONS[{name!r}] of task backend {alias!r}")
                except ValueError as exc:
                    raise ImproperlyConfigured(str(exc)) from None

    def validate_task(self, task: Task) -> None:
        """Django's rules, then leasejobs' per-task options.

        Runs when a task is decorated, maybe before apps are ready: no models.
        """
        super().validate_task(task)
        try:
            validate_task_options(
                {name: getattr(task, name, None) for name in TASK_OPTIONS}, f"of task {task.module_path}"
            )
        except ValueError as exc:
            raise InvalidTask(str(exc)) from None

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
        from leasejobs.jobs import binding
        from leasejobs.jobs import enqueue as jobs

        self.validate_task(task)
        if find(task.module_path, task.func) is None:
            module, name = task.func.__module__, task.func.__qualname__
            app = apps.get_containing_app_config(module)
            where = f"{app.name}.tasks" if app is not None else "the tasks module of an installed app"
            raise InvalidTask(
                f"Task {task.module_path} is in no module runworker searches for Django Tasks, so no "
                f"worker would run it: define it in {where} or import it there by name (from {module} "
                f"import {name}), or add {module!r} to LEASEJOBS['TASK_MODULES']."
            )
        # The same rules as leasejobs' own tasks: arguments that fit, JSON that stays as given.
        binding.check(task.module_path, task.func, task.takes_context, args, kwargs)
        spec = jobs.build(
            task.module_path,
            # Django's rules: tuples become lists, bytes text.
            cast(list[Any], normalize_json(list(args))),
            cast(dict[str, Any], normalize_json(dict(kwargs))),
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
        from leasejobs.models import Job

        try:
            job_id = int(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(db_alias()).filter(pk=job_id).first() if 0 < job_id < 2**63 else None
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        task = find(job.task_name)
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


# -- the Django Tasks the worker runs ----------------------------------------------

_discovered = False
# Reentrant: a tasks module imported by discovery may itself enqueue.
_lock = threading.RLock()


@receiver(setting_changed)
def _rediscover(*, setting: str, **kwargs: Any) -> None:
    """Settings that decide which modules are searched changed (a test's
    ``override_settings``): the next ``find`` discovers again under them, so a
    first lookup made under a test's settings does not hide the project's tasks."""
    global _discovered
    if setting in ("LEASEJOBS", "TASKS", "INSTALLED_APPS"):
        _discovered = False


def register_from(modules: Iterable[ModuleType]) -> None:
    """Register the Django Tasks of a LeaseJobsBackend defined in ``modules``.

    Each becomes a leasejobs task named by the Task's ``module_path`` (what
    ``enqueue`` stores as ``task_name``) whose function is a
    ``DjangoTaskRunner``. A Task re-exported under another name (or a
    ``.using()`` copy) is registered once, as the object its module path
    names. Only Task objects found in these modules run: a row naming anything
    else fails as an unknown task, and nothing is imported by a name from a
    row (django-tasks-db resolves the stored path with ``import_string``).
    """
    from leasejobs.jobs import registry
    from leasejobs.tasks_backend.runner import DjangoTaskRunner

    global _discovered
    for module in modules:
        for value in list(vars(module).values()):
            if not isinstance(value, Task):
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
                    func=DjangoTaskRunner(task),
                    name=task.module_path,
                    queue=task.queue_name,
                    priority=task.priority,
                    max_attempts=backend.task_option(task, "max_attempts"),
                    lease_seconds=backend.task_option(task, "lease_seconds"),
                    timeout_seconds=backend.task_option(task, "timeout_seconds"),
                    takes_context=True,
                )
            )
            logger.debug("registered Django task %s backend=%s", task.module_path, task.backend)
    _discovered = True


def _canonical(task: Task) -> Task:
    """The Task object bound to the name its module path gives, if it is one
    for the same function (the module is loaded already: it defined it)."""
    module = sys.modules.get(task.func.__module__)
    named = getattr(module, task.func.__qualname__, None) if module is not None else None
    return named if isinstance(named, Task) and named.func is task.func else task


def find(module_path: str, func: Any = None) -> Task | None:
    """The Django Task the worker knows by ``module_path`` (for ``func``, if given), or None.

    Asks the registry. The first call in a process that has not discovered
    tasks yet (a web process) runs the discovery a worker runs at start:
    ``registry.autodiscover()``, then ``register_from`` its modules
    (``leasejobs.jobs.discovery.discover``).
    """
    from leasejobs.jobs import registry
    from leasejobs.tasks_backend.runner import DjangoTaskRunner

    if not _discovered:
        with _lock:
            if not _discovered:
                register_from(registry.autodiscover())
    known = registry.get(module_path)
    runner = known.func if known is not None else None
    if not isinstance(runner, DjangoTaskRunner) or (func is not None and runner.task.func is not func):
        return None
    return runner.task
