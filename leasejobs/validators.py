"""The rules of a job's options, one function each, and the lease a job runs under.

``@task``, ``enqueue``, the Django Tasks backend and ``runworker`` all check
queue names, priorities, attempts, leases and timeouts; each rule is written
once here. A validator returns the value it accepted or raises a ``ValueError`` of one sentence that starts
with ``what``, the name the caller knows the option by (``"queue"``,
``"--queue"``, ``"lease_seconds of task app.tasks.send"``), so every caller
can re-raise it as its own error type without rewording it.
"""

import math
from collections.abc import Mapping
from typing import Any

from leasejobs.limits import KEY_MAX_LENGTH, PRIORITY_RANGE, QUEUE_MAX_LENGTH, WORKER_ID_MAX_LENGTH


def validate_queue(value: Any, what: str = "queue") -> str:
    """A queue name: 1 to ``QUEUE_MAX_LENGTH`` characters."""
    if not isinstance(value, str) or not value or len(value) > QUEUE_MAX_LENGTH:
        raise ValueError(f"{what} must be a name of 1 to {QUEUE_MAX_LENGTH} characters, not {value!r}.")
    return value


def validate_priority(value: Any, what: str = "priority") -> int:
    """A whole number within ``PRIORITY_RANGE`` (higher runs first)."""
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be a whole number between {low} and {high}.")
    return value


def validate_max_attempts(value: Any, what: str = "max_attempts") -> int:
    """How many claims a job may have: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1.")
    return value


def validate_concurrency_limit(value: Any, what: str = "concurrency_limit") -> int:
    """Most jobs of one concurrency key running at once: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1.")
    return value


def _positive_seconds(value: Any, what: str) -> float:
    # nan fails every comparison and inf never runs out: neither is a duration.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a positive number of seconds (finite), not {value!r}.")
    return value


def validate_lease_seconds(value: Any, what: str = "lease_seconds") -> float:
    """A lease: finite seconds greater than 0."""
    return _positive_seconds(value, what)


def validate_timeout_seconds(value: Any, what: str = "timeout_seconds") -> float:
    """A timeout of one attempt: finite seconds greater than 0."""
    return _positive_seconds(value, what)


def validate_key(value: Any, what: str = "idempotency_key") -> str:
    """An idempotency or side-effect key: 1 to ``KEY_MAX_LENGTH`` characters."""
    if not isinstance(value, str) or not value or len(value) > KEY_MAX_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of at most {KEY_MAX_LENGTH} characters.")
    return value


def validate_worker_id(value: Any, what: str = "worker_id") -> str:
    """A worker id: 1 to ``WORKER_ID_MAX_LENGTH`` characters, not blank."""
    if not isinstance(value, str) or not value.strip() or len(value) > WORKER_ID_MAX_LENGTH:
        raise ValueError(f"{what} must be 1 to {WORKER_ID_MAX_LENGTH} characters, not blank.")
    return value


#: The optional per-task options and the rule of each (None: not set).
TASK_OPTIONS = {
    "max_attempts": validate_max_attempts,
    "lease_seconds": validate_lease_seconds,
    "timeout_seconds": validate_timeout_seconds,
}


def validate_task_options(options: Mapping[str, Any], where: str) -> None:
    """Check the ``TASK_OPTIONS`` set in ``options``; ``where`` says whose they are ("of task x")."""
    for name, value in options.items():
        if value is not None:
            TASK_OPTIONS[name](value, f"{name} {where}")


def effective_lease(task_lease: float | None, worker_lease: float) -> float:
    """The lease a job runs under: its task's own ``lease_seconds``, else the worker's.

    The claim statement computes the same in SQL (``COALESCE`` of the task's
    lease and the worker's) to stamp ``lease_until``; this is the figure the
    worker heartbeats and times prefetch by.
    """
    return float(task_lease if task_lease else worker_lease)
