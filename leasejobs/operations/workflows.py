"""Workflows: jobs that run after other jobs, each edge settled exactly once.

``with leasejobs.workflow("order") as wf:`` opens one transaction (the
caller's ``atomic`` block, or its own); each ``wf.add(task, ...)`` enqueues
its job at once, through the task's own enqueue (so every refusal of
``enqueue`` applies), then makes it a node of the workflow: a job with
parents is never due until its last parent's finish makes it so, in that
finish's fenced transaction (``leasejobs_settle_parents``, see
``leasejobs.db.sql.workflows``). ``cancel_workflow`` cancels the workflow's
unfinished jobs through the admin's fenced cancel.
"""

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from django.db import transaction

from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.models import Job
from leasejobs.models import Workflow as WorkflowRow
from leasejobs.operations import bulk

logger = logging.getLogger("leasejobs.workflows")

#: ``run_at`` of a job waiting for its parents (``leasejobs.db.sql.workflows.NEVER``).
NEVER = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)

#: What ``on_parent_failure`` accepts: the child is cancelled (the default),
#: or it runs all the same once every parent has ended.
ON_PARENT_FAILURE = ("cancel", "run")

#: ``cancel_workflow``'s passes at most: each takes what workers claimed while the one
#: before waited; a workflow whose jobs are claimed faster than a pass ends is rare.
CANCEL_PASSES = 10


class Workflow:
    """One workflow being built: ``with leasejobs.workflow(name) as wf: wf.add(...)``.

    The block is one transaction: an exception in it leaves no workflow and
    no job. ``id`` is the workflow's row once the block has started.
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ValueError("a workflow's name must be a non-empty string of at most 255 characters.")
        self.name = name
        self.id: int | None = None
        self._atomic: Any = None  # the block's transaction.atomic, once entered
        self._open = False  # inside the block: add() may insert
        self._nodes: dict[int, Job] = {}

    def __enter__(self) -> "Workflow":
        if self._atomic is not None:
            raise RuntimeError(f"workflow {self.name!r} was already opened: use a new leasejobs.workflow().")
        self._atomic = transaction.atomic(using=db_alias())
        self._atomic.__enter__()
        try:
            self.id = facade.create_workflow(self.name)
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._open = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._open = False
        result: bool | None = self._atomic.__exit__(kind, exc, tb)
        if kind is None:
            logger.info("workflow created workflow=%s name=%s jobs=%s", self.id, self.name, len(self._nodes))
        return result

    @property
    def jobs(self) -> list[Job]:
        """The jobs ``add`` returned, in the order they were added."""
        return list(self._nodes.values())

    def add(
        self,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        after: Iterable[Job] = (),
        on_parent_failure: str = "cancel",
        **using_options: Any,
    ) -> Job:
        """Enqueue ``task(*args, **kwargs)`` as a node of this workflow; return its ``Job``.

        ``after``: jobs this workflow's ``add`` returned; the job is due once
        every one of them is done. ``on_parent_failure``: ``"cancel"`` (a
        parent that fails or is cancelled cancels this job) or ``"run"``
        (this job runs once every parent has ended, whatever the outcome).
        ``using_options`` go to the task's ``using(...)``: a leasejobs task's
        (queue, priority, run_at, delay, retry, concurrency_key, ...), or a
        Django Task's of the leasejobs backend (queue_name, priority, ...).
        """
        if not self._open or self.id is None:
            raise RuntimeError(
                f"workflow {self.name!r} is not open: call add inside `with leasejobs.workflow(...) as wf:`."
            )
        if on_parent_failure not in ON_PARENT_FAILURE:
            raise ValueError(f'on_parent_failure must be "cancel" or "run", not {on_parent_failure!r}.')
        if using_options.get("idempotency_key") is not None:
            raise ValueError(
                "a workflow's job cannot take an idempotency_key (an existing job cannot join a "
                "workflow): make the code that opens the workflow idempotent instead."
            )
        parents = self._parents(after)
        if parents:
            if {"run_at", "delay", "run_after"} & {k for k, v in using_options.items() if v is not None}:
                raise ValueError(
                    "a job with parents is due when its last parent is done: give run_at or delay "
                    "only to a job without parents."
                )
            # Inserted never due: no NOTIFY, and no entry at the head of the claim index.
            using_options = {**using_options, _run_at_option(task): NEVER}
        job = _enqueue(task, tuple(args), dict(kwargs or {}), using_options)
        row = facade.add_node(
            {
                "id": job.id,
                "workflow_id": self.id,
                "parents": parents,
                "run_on_failure": on_parent_failure == "run",
            }
        )
        if row is None:  # a job someone else's enqueue returned, not a new one
            raise ValueError(f"job {job.id} is not a new job, so it cannot join workflow {self.id}.")
        job.workflow_id, job.pending_parents, job.run_at = self.id, len(parents), row[1]
        self._nodes[job.id] = job
        return job

    def _parents(self, after: Iterable[Job]) -> list[int]:
        """The ids of ``after``, each a job this workflow's ``add`` returned, without repeats."""
        if isinstance(after, Job):
            after = [after]
        ids: list[int] = []
        for parent in after:
            parent_id = parent.pk if isinstance(parent, Job) else None
            if parent_id is None or parent_id not in self._nodes:
                raise ValueError(
                    f"after= takes only jobs returned by this workflow's add, and {parent!r} is not one: "
                    "add the parent to this workflow first."
                )
            if parent_id not in ids:
                ids.append(parent_id)
        return ids


def _run_at_option(task: Any) -> str:
    """The name of the "not before" option of ``task``'s ``using``: leasejobs' or Django's."""
    from leasejobs.jobs.registry import Task

    return "run_at" if isinstance(task, Task) else "run_after"


def workflow(name: str) -> Workflow:
    """``with leasejobs.workflow(name) as wf:``: build a workflow in one transaction."""
    return Workflow(name)


def _enqueue(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]) -> Job:
    """Enqueue through the task's own path: a leasejobs ``Task``, or a Django Task of leasejobs' backend."""
    from leasejobs.jobs.registry import Task

    if isinstance(task, Task):
        return (task.using(**options) if options else task).enqueue(*args, **kwargs)
    if not callable(getattr(task, "enqueue", None)) or not callable(getattr(task, "get_backend", None)):
        raise TypeError(
            f"wf.add takes a leasejobs @task or a Django Task of the leasejobs backend, not {task!r}."
        )
    from leasejobs.tasks_backend.backend import LeaseJobsBackend

    if not isinstance(task.get_backend(), LeaseJobsBackend):
        raise TypeError(
            f"{task!r} uses another Tasks backend: a workflow holds only jobs of leasejobs' backend "
            "(set its backend to leasejobs.backend.LeaseJobsBackend)."
        )
    result = (task.using(**options) if options else task).enqueue(*args, **kwargs)
    return Job.objects.using(db_alias()).get(pk=int(result.id))


def _workflow_id(workflow: "Workflow | WorkflowRow | int") -> int:
    if isinstance(workflow, Workflow | WorkflowRow):
        if workflow.id is None:
            raise ValueError("this workflow was never opened, so it has nothing to cancel.")
        return int(workflow.id)
    if isinstance(workflow, int) and not isinstance(workflow, bool):
        return workflow
    raise TypeError(f"cancel_workflow takes a workflow or its id, not {workflow!r}.")


def cancel_workflow(workflow: "Workflow | WorkflowRow | int", by: str = "cancel_workflow") -> bulk.Changed:
    """Cancel every job of ``workflow`` not yet finished: queued ones at once, running ones
    through the cancel request their worker's heartbeat hands to the body.

    The admin's fenced cancel, a batch at a time (``operations.bulk``);
    returns what it matched and changed. Jobs that end meanwhile are left
    as they ended. Each job is cancelled fenced on the state it was read in,
    so one that a worker claimed between the read and the write (the write
    waited for a row a running step held, say) is left: passes go on until
    none is left unfinished without a cancel, at most ``CANCEL_PASSES``.
    """
    jobs = Job.objects.using(db_alias()).filter(workflow_id=_workflow_id(workflow))
    uncancelled = jobs.exclude(status=Job.Status.RUNNING, cancel_requested=True)
    outcome = last = bulk.apply("cancel", uncancelled, by)
    for _ in range(CANCEL_PASSES - 1):
        if not last.moved_on:
            break
        last = bulk.apply("cancel", uncancelled, by)
        outcome.changed.extend(last.changed)
    return outcome
