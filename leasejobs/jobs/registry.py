"""The ``@task`` decorator and the registry of tasks a worker may run.

The worker never imports a module or calls a callable named by a row: at
start it imports the ``tasks`` module of every installed app (and the modules
in ``LEASEJOBS["TASK_MODULES"]``); decorating a function registers it by name,
and a row is run only if its ``task_name`` is in this registry.

So a task the worker will not import cannot run, and its arguments must fit
its function: ``enqueue`` refuses both mistakes where they are made, in one
sentence (``leasejobs.jobs.roots``, ``leasejobs.jobs.binding``), instead of leaving the
worker to fail the job later as ``unknown task`` or with a ``TypeError``.
"""

import datetime as dt
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import import_module
from types import ModuleType
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from leasejobs import conf
from leasejobs.db.rows import (
    qualified_name,
    validate_concurrency_limit,
    validate_priority,
    validate_queue,
    validate_task_options,
)
from leasejobs.jobs import binding, enqueue, roots
from leasejobs.jobs.retry import RetryPolicy
from leasejobs.models import Job

_registry: dict[str, "Task"] = {}
_lock = threading.Lock()
#: Names of the tasks a worker registers too (see ``_found_by_workers``).
_found: set[str] = set()


@dataclass(frozen=True)
class Task:
    """A function that can be run as a job; ``task.enqueue(...)`` queues it.

    Calling the task calls the function directly (no queue involved).
    ``using(...)`` returns a copy with other enqueue options.
    """

    func: Callable[..., Any]
    name: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    lease_seconds: float | None = None
    timeout_seconds: float | None = None
    takes_context: bool = False
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    idempotency_key: str | None = None
    #: How failures are retried (None: every exception, backoff from LEASEJOBS).
    retry: RetryPolicy | None = None
    #: A policy given to ``using``: stored on each job this copy enqueues
    #: (the worker only knows the registered task, so the row carries it).
    retry_override: RetryPolicy | None = None
    #: At most this many jobs with one ``concurrency_key`` run at once.
    concurrency_limit: int | None = None
    concurrency_key: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: dt.datetime | None = None,
        delay: float | dt.timedelta | None = None,
        idempotency_key: str | None = None,
        retry: RetryPolicy | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> "Task":
        """A copy of this task that enqueues with these options.

        ``retry`` replaces the task's policy for the jobs this copy enqueues.
        ``concurrency_key``: at most ``concurrency_limit`` (the task's, unless
        given here) jobs with this key run at once, across all workers.
        """
        changes: dict[str, Any] = {
            "retry_override": _checked_policy(retry, self.name),
            "queue": queue,
            "priority": priority,
            "run_at": run_at,
            "delay": delay,
            "idempotency_key": idempotency_key,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
        }
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def _options(self) -> dict[str, Any]:
        """The enqueue options this task (or this ``using`` copy) carries."""
        return {
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "run_at": self.run_at,
            "delay": self.delay,
            "idempotency_key": self.idempotency_key,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": self.concurrency_limit,
            "retry_policy": None if self.retry_override is None else self.retry_override.to_json(),
        }

    def enqueue(self, *args: Any, **kwargs: Any) -> Job:
        """Insert a job for this task in the caller's transaction; return it.

        With an ``idempotency_key`` (see ``using``) already used by a job,
        that job is returned and nothing is inserted. Refused with a
        ``TypeError`` when the arguments do not fit the function, and with
        ``ImproperlyConfigured`` when ``runworker`` would not find the task.
        """
        if self.name not in _found:
            require_found(self)
        binding.check(self.name, self.func, self.takes_context, args, kwargs)
        return enqueue.insert(enqueue.build(self.name, args, kwargs, **self._options()))

    def bulk_enqueue(self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
        """Insert one job per ``(args, kwargs)`` pair in one round trip."""
        return enqueue.insert_many(
            *enqueue.build_many(self.name, calls, bind=self._bind(), **self._options())
        )

    def bulk_enqueue_ids(self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[int]:
        """``bulk_enqueue`` returning the new jobs' ids (in input order) instead of ``Job``s.

        The same insert, checks and NOTIFY; it skips building a model instance
        per job, most of a bulk enqueue's time in Python.
        """
        return enqueue.insert_many_ids(
            *enqueue.build_many(self.name, calls, bind=self._bind(), **self._options())
        )

    def _bind(self) -> "Callable[[list[Any], dict[str, Any], int], None]":
        """The check of one call of a bulk enqueue (after the task itself was found)."""
        if self.name not in _found:
            require_found(self)
        fits = binding.binder(self.func, self.takes_context).fits

        def bind(args: list[Any], kwargs: dict[str, Any], call: int) -> None:
            if fits(args, kwargs) is not None:
                binding.check(self.name, self.func, self.takes_context, args, kwargs, call)

        return bind


def register(task: Task) -> Task:
    """Add a task to the registry; two different functions may not share a name."""
    found = _found_by_workers(task, sys._getframe(1))
    with _lock:
        known = _registry.get(task.name)
        if known is not None and qualified_name(known.func) != qualified_name(task.func):
            raise ImproperlyConfigured(
                f"Two tasks are named {task.name!r}: {qualified_name(known.func)} and "
                f"{qualified_name(task.func)}; give one of them @task(name=...)."
            )
        _registry[task.name] = task
        if found:
            _found.add(task.name)
    return task


def _found_by_workers(task: Task, caller: Any) -> bool:
    """Whether ``runworker`` registers this task too, judged as it is registered.

    Yes if it is registered while Django sets up (settings, models and
    ``AppConfig.ready()`` run in the worker as well), in a discovery root, or
    while a root's body runs in this thread (imported by a tasks module).
    Otherwise ``require_found`` looks further at its first enqueue.
    """
    if not apps.ready:
        return True
    names = roots.root_names()
    return task.func.__module__ in names or roots.registered_in_root(names, caller)


def found_by_workers(*tasks: Task) -> None:
    """Declare tasks that workers register in code of their own before ``runworker`` starts.

    For tasks registered by a call rather than at import (the bench's, whose
    worker processes register them before they run ``runworker``): their
    enqueue is then not refused.
    """
    with _lock:
        _found.update(task.name for task in tasks)


def require_found(task: Task) -> None:
    """Refuse, in one sentence, to enqueue a task that ``runworker`` would not register.

    The roots are imported first (what a worker does at start, once per
    process); then a root that names the task, or whose source imports its
    module, counts as finding it (see ``leasejobs.jobs.roots``).
    """
    module = task.func.__module__
    loaded = [found.__name__ for found in autodiscover()]
    registered = _registry.get(task.name, task)
    if (
        task.name in _found
        or roots.named_by_roots(loaded, registered)
        or roots.imported_by_roots(loaded, module)
    ):
        with _lock:
            _found.add(task.name)
        return
    app = apps.get_containing_app_config(module)
    where = f"{app.name}.tasks" if app is not None else "the tasks module of an installed app"
    if module == "__main__":
        fix = f"define it in {where}"
    else:
        fix = f"define it in {where} or import {module} there, or add {module!r} to LEASEJOBS['TASK_MODULES']"
    raise ImproperlyConfigured(
        f"Task {task.name} is defined in {module}, which runworker does not import, so no worker "
        f"would run it: {fix}."
    )


def _checked_policy(policy: object, task_name: str) -> RetryPolicy | None:
    if policy is not None and not isinstance(policy, RetryPolicy):
        raise ValueError(f"retry of task {task_name} must be a leasejobs.RetryPolicy, not {policy!r}.")
    return policy


def task(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int | None = None,
    lease_seconds: float | None = None,
    timeout_seconds: float | None = None,
    takes_context: bool = False,
    concurrency_limit: int | None = None,
    retry: RetryPolicy | None = None,
) -> Any:
    """Make a function a task: ``@task`` or ``@task(queue="receipts", ...)``.

    The default name is the function's dotted path. With
    ``takes_context=True`` the function's first argument is the job context.
    ``retry`` is the task's ``RetryPolicy`` (see ``leasejobs.jobs.retry``).
    ``concurrency_limit=N``: at most N jobs of one ``using(concurrency_key=...)``
    run at once, across all workers.
    """

    def decorate(f: Callable[..., Any]) -> Task:
        # Fail at import, not at enqueue or in the worker, on an option that is no good.
        where = f"of task {qualified_name(f)}"
        binding.binder(f, takes_context)  # refuses takes_context without a parameter for it
        validate_queue(queue, f"queue {where}")
        validate_priority(priority, f"priority {where}")
        validate_task_options(
            {
                "max_attempts": max_attempts,
                "lease_seconds": lease_seconds,
                "timeout_seconds": timeout_seconds,
            },
            where,
        )
        if concurrency_limit is not None:
            validate_concurrency_limit(concurrency_limit, f"concurrency_limit {where}")
        return register(
            Task(
                func=f,
                name=name or qualified_name(f),
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                lease_seconds=lease_seconds,
                timeout_seconds=timeout_seconds,
                takes_context=takes_context,
                retry=_checked_policy(retry, qualified_name(f)),
                concurrency_limit=concurrency_limit,
            )
        )

    return decorate(func) if func is not None else decorate


def get(name: str) -> Task | None:
    """The registered task with this name, or None. Never imports anything."""
    return _registry.get(name)


def all_tasks() -> dict[str, Task]:
    return dict(_registry)


def autodiscover() -> list[ModuleType]:
    """Import every installed app's ``tasks`` module and LEASEJOBS["TASK_MODULES"]; return them.

    Importing them runs their ``@task`` decorators, which register the
    tasks. The modules are returned so that other kinds of task found in them
    can be registered too: a worker hands them to
    ``leasejobs.tasks_backend.register_from`` for Django Tasks.
    """
    autodiscover_modules("tasks")
    names = [f"{app.name}.tasks" for app in apps.get_app_configs()]
    modules = [sys.modules[name] for name in names if name in sys.modules]
    return modules + [import_module(module) for module in conf.task_modules()]
