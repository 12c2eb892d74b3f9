"""A job seen as Django's ``TaskResult``: status, errors, attempts and return value."""

import dataclasses
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError

from leasejobs.db.rows import qualified_name, read_entries

#: Job.status -> the TaskResultStatus Django shows. A job waiting for a retry
#: is READY ("ready to be executed again", as Django's enum puts it).
STATUS = {
    "queued": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


class JobFailed(Exception):
    """Stands for a failure that raised nothing in the task body.

    A ``TaskResult`` lists one ``TaskError`` per failed attempt; a job can
    also end without an exception of its own (its last attempt's worker
    stopped heartbeating, no worker knows its task, it was cancelled). Such an
    ending gets a ``TaskError`` of this class whose traceback is the reason.
    """


def task_result(task: Task, job: Any, alias: str) -> TaskResult:
    """A Job seen as Django's TaskResult.

    ``errors`` has one entry per failed attempt (exception class path and
    traceback), plus a ``JobFailed`` entry when the job ended without an
    exception of its own; ``worker_ids`` one per claim (``Job.attempt_workers``), so ``attempts`` is
    the job's attempt. ``last_attempted_at`` is the latest claim's start.

    ``task.run_after`` is the job's ``run_at`` when that differs from its
    ``created_at`` (both are the enqueue statement's time for a job due at
    once), else None: what ``enqueue`` returned, read back from the row alone.
    A retry moves ``run_at``, so a retried job shows when its retry was due.
    """
    run_after = job.run_at if job.run_at != job.created_at else None
    if (task.priority, task.queue_name, task.run_after) != (job.priority, job.queue, run_after):
        # ``Task.using`` cannot set run_after back to None; ``replace`` validates the same way.
        task = dataclasses.replace(task, priority=job.priority, queue_name=job.queue, run_after=run_after)
    entries = read_entries(job.errors)
    errors = [TaskError(exception_class_path=e["exception_class"], traceback=e["traceback"]) for e in entries]
    status = STATUS[job.status]
    if status == TaskResultStatus.FAILED and not any(e["attempt"] == job.attempt for e in entries):
        errors.append(
            TaskError(
                exception_class_path=qualified_name(JobFailed),
                traceback=job.last_error or f"the job was {job.status}",
            )
        )
    result: TaskResult = TaskResult(
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
        worker_ids=job.attempt_workers,
    )
    # Frozen dataclass: Django's own backends set the return value this way.
    object.__setattr__(result, "_return_value", job.result if status == TaskResultStatus.SUCCESSFUL else None)
    return result
