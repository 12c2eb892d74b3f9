"""Declaring schedules: ``@periodic(...)`` and ``LEASEJOBS["PERIODIC"]``, checked into ``Schedule``s.

Declarations are only recorded here; ``load()`` turns them into checked
``Schedule`` objects once the tasks modules are imported, and is what the
system check, the worker's scheduler and ``leasejobs_periodic`` call. Every
problem becomes one sentence naming the schedule, so a bad expression, an
unknown zone or an unregistered task stops ``runworker`` at start, not at 7 a.m.
"""

import datetime as dt
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from leasejobs import conf
from leasejobs.db.rows import KEY_PREFIX, TICK_FORMAT
from leasejobs.jobs import binding, enqueue, registry
from leasejobs.periodic.ticks import ScheduleError, check_expression, zone

CATCH_UP_MODES = ("latest", "all", "none")
DEFAULT_MAX_CATCH_UP = 100
NAME_MAX_LENGTH = 200
#: The keys a ``LEASEJOBS["PERIODIC"]`` entry may have.
SETTING_KEYS = frozenset(
    {
        "task",
        "cron",
        "timezone",
        "args",
        "kwargs",
        "name",
        "catch_up",
        "max_catch_up",
        "overlap",
        "jitter_seconds",
    }
)


@dataclass(frozen=True)
class Schedule:
    """One checked schedule: which task to enqueue, when, and how to catch up."""

    name: str
    task_name: str
    cron: str
    timezone: str
    tz: ZoneInfo = field(compare=False)
    args: list[Any]
    kwargs: dict[str, Any]
    catch_up: str = "latest"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    overlap: bool = True
    jitter_seconds: float = 0.0

    @property
    def signature(self) -> str:
        """The definition ticks follow; a change of it starts the schedule afresh."""
        text = json.dumps([self.task_name, self.cron, self.timezone, self.args, self.kwargs], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def key(self, tick: dt.datetime) -> str:
        """The idempotency key of this schedule's job for ``tick``."""
        return f"{KEY_PREFIX}{self.name}:{tick.astimezone(dt.UTC).strftime(TICK_FORMAT)}"


_declared: list[dict[str, Any]] = []
_lock = threading.Lock()


def periodic(
    cron: str,
    *,
    timezone: str = "UTC",
    name: str | None = None,
    args: list[Any] | tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    catch_up: str = "latest",
    max_catch_up: int = DEFAULT_MAX_CATCH_UP,
    overlap: bool = True,
    jitter_seconds: float = 0,
) -> Any:
    """Run a task on a cron schedule: put ``@periodic("0 7 * * *", timezone=...)`` above ``@task``.

    ``cron`` has five fields, or six with seconds first. The schedule's name
    (stable: the database remembers its last tick under it) is the task's
    name unless ``name=`` is given; give one when a task has several
    schedules. Also accepts a Django Task (``@django.tasks.task`` of a
    LeaseJobsBackend), named by its module path. Checked at start by the
    system check, not here.
    """

    def decorate(target: Any) -> Any:
        # A leasejobs Task by its name; a Django Task by its module path.
        is_task = isinstance(target, registry.Task)
        task_name = target.name if is_task else getattr(target, "module_path", None)
        if not isinstance(task_name, str):
            raise TypeError(
                f"@periodic must decorate a task: put it above @task, not below ({target!r} is not a task)."
            )
        entry = {
            "task": task_name,
            "cron": cron,
            "timezone": timezone,
            "name": name or task_name,
            "args": list(args),
            "kwargs": dict(kwargs or {}),
            "catch_up": catch_up,
            "max_catch_up": max_catch_up,
            "overlap": overlap,
            "jitter_seconds": jitter_seconds,
        }
        with _lock:
            if entry not in _declared:
                _declared.append(entry)
        return target

    return decorate


def declarations() -> list[tuple[str, Any]]:
    """Every declared schedule as (where it was declared, the raw declaration)."""
    with _lock:
        found: list[tuple[str, Any]] = [("@periodic", dict(entry)) for entry in _declared]
    setting = conf.get("PERIODIC")
    if not isinstance(setting, list | tuple):
        raise ScheduleError(f"LEASEJOBS['PERIODIC'] must be a list of dicts, not {type(setting).__name__}")
    found += [(f"LEASEJOBS['PERIODIC'][{i}]", entry) for i, entry in enumerate(setting)]
    return found


def load() -> tuple[list[Schedule], list[str]]:
    """The checked schedules, and one sentence per declaration that cannot run.

    Needs the tasks registered (``discovery.discover()``): a
    schedule naming a task the worker would not know is an error.
    """
    schedules: list[Schedule] = []
    errors: list[str] = []
    try:
        found = declarations()
    except ScheduleError as exc:
        return [], [f"{exc}."]
    by_name: dict[str, Schedule] = {}
    for where, raw in found:
        try:
            schedule = _check(raw)
        except ScheduleError as exc:
            label = raw.get("name") or raw.get("task") if isinstance(raw, Mapping) else None
            errors.append(f"Periodic schedule {label or where!r} ({where}): {exc}.")
            continue
        known = by_name.get(schedule.name)
        if known is not None:
            if known != schedule:
                errors.append(
                    f"Two periodic schedules are named {schedule.name!r}; give one of them another name=."
                )
            continue
        by_name[schedule.name] = schedule
        schedules.append(schedule)
    return schedules, errors


def _check(raw: Any) -> Schedule:
    if not isinstance(raw, Mapping):
        raise ScheduleError(f"a schedule must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - SETTING_KEYS)
    if unknown:
        raise ScheduleError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(SETTING_KEYS))}")
    task_name = raw.get("task")
    if not isinstance(task_name, str) or not task_name:
        raise ScheduleError("'task' must name a task (a leasejobs task name or a Django Task's module path)")
    task = registry.get(task_name)
    if task is None:
        raise ScheduleError(
            f"no registered task is named {task_name!r} (tasks modules of INSTALLED_APPS and "
            "LEASEJOBS['TASK_MODULES'] are searched)"
        )
    name = raw.get("name") or task_name
    if not isinstance(name, str) or len(name) > NAME_MAX_LENGTH:
        raise ScheduleError(f"the name must be a string of at most {NAME_MAX_LENGTH} characters")
    cron = check_expression(raw.get("cron"))
    tz_name = raw.get("timezone", "UTC")
    tz = zone(tz_name)
    catch_up = raw.get("catch_up", "latest")
    if catch_up not in CATCH_UP_MODES:
        raise ScheduleError(f"catch_up must be one of {', '.join(CATCH_UP_MODES)}, not {catch_up!r}")
    max_catch_up = raw.get("max_catch_up", DEFAULT_MAX_CATCH_UP)
    if isinstance(max_catch_up, bool) or not isinstance(max_catch_up, int) or not 1 <= max_catch_up <= 10_000:
        raise ScheduleError("max_catch_up must be a whole number from 1 to 10000")
    overlap = raw.get("overlap", True)
    if not isinstance(overlap, bool):
        raise ScheduleError("overlap must be True or False")
    jitter_seconds = raw.get("jitter_seconds", 0)
    if (
        isinstance(jitter_seconds, bool)
        or not isinstance(jitter_seconds, int | float)
        or not 0 <= jitter_seconds <= 86400
    ):
        raise ScheduleError("jitter_seconds must be a number of seconds from 0 to 86400")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise ScheduleError("args must be a list and kwargs a dict")
    try:
        # The same checks an enqueue makes (JSON, size, the task's options, the function's parameters).
        enqueue.build(task.name, args, kwargs, **_job_options(task))
        binding.check(task.name, task.func, task.takes_context, args, kwargs)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(str(exc).rstrip(".")) from None
    return Schedule(
        name=name,
        task_name=task.name,
        cron=cron,
        timezone=tz_name,
        tz=tz,
        args=list(args),
        kwargs=dict(kwargs),
        catch_up=catch_up,
        max_catch_up=max_catch_up,
        overlap=overlap,
        jitter_seconds=float(jitter_seconds),
    )


def _job_options(task: registry.Task) -> dict[str, Any]:
    return {"queue": task.queue, "priority": task.priority, "max_attempts": task.max_attempts}


def job_options(schedule: Schedule) -> dict[str, Any]:
    """Queue, priority and max_attempts of the schedule's jobs, from its task."""
    task = registry.get(schedule.task_name)
    if task is None:  # load() refused such a schedule; a registry cleared since is a bug
        raise ScheduleError(f"no registered task is named {schedule.task_name!r}")
    options = _job_options(task)
    if options["max_attempts"] is None:
        options["max_attempts"] = conf.get("MAX_ATTEMPTS")
    return options
