"""leasejobs: a PostgreSQL job queue for Django with leases, heartbeats,
fencing tokens and idempotent side effects.

``from leasejobs import task, periodic, LeaseLost, Snooze, Discard,
RetryPolicy, current_job``; for durable steps ``send_event`` and
``WaitTimeout``. The names that need models are loaded on first use, so
importing the package (as Django does for INSTALLED_APPS, before models are
ready) has no side effects.
"""

from typing import Any

from leasejobs.exceptions import Discard, LeaseLost, Snooze, WaitTimeout

__all__ = [
    "Discard",
    "JobContext",
    "LeaseLost",
    "RetryPolicy",
    "Snooze",
    "Task",
    "WaitTimeout",
    "Workflow",
    "cancel_workflow",
    "current_job",
    "pause_queue",
    "periodic",
    "resume_queue",
    "send_event",
    "set_limits",
    "task",
    "workflow",
]

_LAZY = {
    "task": "leasejobs.jobs.registry",
    "Task": "leasejobs.jobs.registry",
    "current_job": "leasejobs.jobs.context",
    "JobContext": "leasejobs.jobs.context",
    "pause_queue": "leasejobs.queues.controls",
    "resume_queue": "leasejobs.queues.controls",
    "set_limits": "leasejobs.queues.controls",
    "RetryPolicy": "leasejobs.jobs.retry",
    "workflow": "leasejobs.operations.workflows",
    "Workflow": "leasejobs.operations.workflows",
    "cancel_workflow": "leasejobs.operations.workflows",
    "send_event": "leasejobs.jobs.steps",
}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name == "periodic":
        # The subpackage, which is callable as the decorator (see leasejobs.periodic).
        return import_module("leasejobs.periodic")
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leasejobs' has no attribute {name!r}")
