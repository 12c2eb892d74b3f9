"""The bench's tasks, registered only in the bench's own processes.

Their names keep the ``leasejobs.bench.`` prefix they have always had in the
rows the bench writes.
"""

import time
from typing import Any

from django.core.management import execute_from_command_line

from leasejobs.jobs import registry
from leasejobs.jobs.registry import found_by_workers, task

QUEUE = "leasejobs-bench"
HISTORY_QUEUE = "leasejobs-bench-history"
#: The queue of ``--other-queue-jobs``: never served by the bench's workers (paused with ``--all-queues``).
OTHER_QUEUE = "leasejobs-bench-other"
NOOP = "leasejobs.bench.noop"
STAMP = "leasejobs.bench.stamp"
SLEEP = "leasejobs.bench.sleep"
SPIN = "leasejobs.bench.spin"
PAUSE = "leasejobs.bench.pause"
STEPS = "leasejobs.bench.steps"
CHAIN = "leasejobs.bench.chain"
#: Steps of each ``STEPS`` job: the figure compares one such job with this many no-op jobs.
STEPS_PER_JOB = 10


def _noop() -> None:
    """Does nothing: the benchmark measures the queue, not the job."""


def _stamp(enqueued_at: float) -> float:
    """Seconds from the start of the enqueue call to the start of this body."""
    return time.time() - enqueued_at


def _sleep(seconds: float) -> None:
    """Waits as a job that waits on I/O does: the thread holds no GIL meanwhile."""
    time.sleep(seconds)


def _pause(seconds: float, payload: str) -> float:
    """Waits ``seconds`` as ``_sleep`` does; returns when the body started (epoch seconds).

    ``payload`` is carried in the job's arguments and not read: what a job's
    data costs the queue. The start, kept as the job's result, tells how long
    the job waited for a body, claim and any wait inside the worker included
    (``--offered-load``).
    """
    started = time.time()
    time.sleep(seconds)
    return started


def _spin(seconds: float) -> None:
    """Spends ``seconds`` of this thread's CPU time in pure Python: a CPU-bound job.

    Measured on the thread's own clock, so a job costs the same CPU however
    many threads share the process; what a worker adds shows as jobs/s below
    one core's worth.
    """
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(50))


def _steps(ctx: Any) -> None:
    """``STEPS_PER_JOB`` durable steps that do nothing: what a step costs beside a job."""
    for n in range(STEPS_PER_JOB):
        ctx.step(f"s{n}", _noop)


def _chain(left: int) -> None:
    """One link of a chain of no-op jobs, each enqueued by the one before: the shape steps replace."""
    if left > 1:
        link = registry.get(CHAIN)
        assert link is not None
        link.enqueue(left - 1)


def register_tasks() -> dict[str, Any]:
    """Register the bench tasks (idempotent) and return them by short name.

    No tasks module defines them, so they are declared found by workers:
    the bench's worker processes register them too (``worker_main``), and
    enqueue would otherwise refuse them as tasks no worker runs.
    """
    tasks = {
        "noop": task(name=NOOP, queue=QUEUE, max_attempts=1)(_noop),
        "stamp": task(name=STAMP, queue=QUEUE, max_attempts=1)(_stamp),
        "sleep": task(name=SLEEP, queue=QUEUE, max_attempts=1)(_sleep),
        "pause": task(name=PAUSE, queue=QUEUE, max_attempts=1)(_pause),
        "spin": task(name=SPIN, queue=QUEUE, max_attempts=1)(_spin),
        "steps": task(name=STEPS, queue=QUEUE, max_attempts=1, takes_context=True)(_steps),
        "chain": task(name=CHAIN, queue=QUEUE, max_attempts=1)(_chain),
    }
    found_by_workers(*tasks.values())
    return tasks


def worker_main(argv: list[str]) -> None:
    """A ``runworker`` process that also knows the bench tasks (Django is set up)."""
    register_tasks()
    execute_from_command_line(["manage.py", "runworker", *argv])
