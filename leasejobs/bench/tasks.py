"""The bench's tasks, registered only in the bench's own processes.

Their names keep the ``leasejobs.bench.`` prefix they have always had in the
rows the bench writes.
"""

import time
from typing import Any

from django.core.management import execute_from_command_line

from leasejobs.registry import task

QUEUE = "leasejobs-bench"
HISTORY_QUEUE = "leasejobs-bench-history"
NOOP = "leasejobs.bench.noop"
STAMP = "leasejobs.bench.stamp"
SLEEP = "leasejobs.bench.sleep"


def _noop() -> None:
    """Does nothing: the benchmark measures the queue, not the job."""


def _stamp(enqueued_at: float) -> float:
    """Seconds from the start of the enqueue call to the start of this body."""
    return time.time() - enqueued_at


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def register_tasks() -> dict[str, Any]:
    """Register the bench tasks (idempotent) and return them by short name."""
    return {
        "noop": task(name=NOOP, queue=QUEUE, max_attempts=1)(_noop),
        "stamp": task(name=STAMP, queue=QUEUE, max_attempts=1)(_stamp),
        "sleep": task(name=SLEEP, queue=QUEUE, max_attempts=1)(_sleep),
    }


def worker_main(argv: list[str]) -> None:
    """A ``runworker`` process that also knows the bench tasks (Django is set up)."""
    register_tasks()
    execute_from_command_line(["manage.py", "runworker", *argv])
