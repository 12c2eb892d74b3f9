"""leasejobs: a PostgreSQL job queue for Django with leases, heartbeats,
fencing tokens and idempotent side effects.

``from leasejobs import task, periodic, LeaseLost, Snooze, Discard,
RetryPolicy, current_job``. The names that need models are loaded on first
use, so importing the package (as Django does for INSTALLED_APPS, before
models are ready) has no side effects.
"""

from typing import Any

from leasejobs.exceptions import Discard, LeaseLost, Snooze

__all__ = [
    "Discard",
    "JobContext",
    "LeaseLost",
    "RetryPolicy",
    "Snooze",
    "Task",
    "current_job",
    "pause_queue",
    "periodic",
    "resume_queue",
    "set_limits",
    "task",
]

_LAZY = {
    "task": "leasejobs.registry",
    "Task": "leasejobs.registry",
    "current_job": "leasejobs.context",
    "JobContext": "leasejobs.context",
    "pause_queue": "leasejobs.controls",
    "resume_queue": "leasejobs.controls",
    "set_limits": "leasejobs.controls",
    "RetryPolicy": "leasejobs.retry",
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name == "periodic":
        # The subpackage, which is callable as the decorator (see leasejobs.periodic).
        return import_module("leasejobs.periodic")
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leasejobs' has no attribute {name!r}")
