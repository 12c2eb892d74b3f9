"""One attempt's body: the one way leasejobs runs a task function.

A worker's child runs every body through ``run``, and so does
``leasejobs.testing.run_jobs``: a body that is done in a test is done on a
worker, and one that fails on a worker fails in the test. ``run`` reads the
arguments the row holds, activates the job context, calls the function (a
coroutine function, or a function that returns an awaitable, runs to its
end on an event loop of its own), and turns what happened into the
attempt's ``Outcome`` (``leasejobs.worker.outcomes``). Any exception a body
raises, ``SystemExit`` included, becomes that job's outcome. ``LeaseLost``
and ``BodyStopped`` become no outcome at all once the attempt is known to be
over (the fence found the job taken, or the worker raised the body's flags:
the attempt that holds the job, or the worker that stopped the body, owns
the outcome); raised by a body's own code while its lease holds, they are
an ordinary failure, so the attempt ends now instead of running out its lease.
"""

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from django.db import connections

from leasejobs.db.store import Outcome
from leasejobs.exceptions import BodyStopped, LeaseLost
from leasejobs.jobs import registry
from leasejobs.jobs.context import BodySlot, JobContext, activate, context_for, deactivate
from leasejobs.observability import observe
from leasejobs.worker import outcomes
from leasejobs.worker.outcomes import CountedAttempt, Facts

if TYPE_CHECKING:
    from leasejobs.jobs.registry import Task


class Ran(NamedTuple):
    """How one body ended.

    ``Ran`` and ``Prepared`` are named tuples: a child builds one of each per
    body, and as frozen dataclasses they cost about 1 µs each to build.
    """

    #: What to write; None when the body let ``LeaseLost`` escape or was stopped.
    outcome: Outcome | None
    #: What the body raised, or None.
    raised: BaseException | None
    seconds: float
    #: The worker stopped it (``BodyStopped``): its process should not run another.
    stopped: bool = False


class Attempt(CountedAttempt, Protocol):
    """What a claimed attempt says of itself, as a worker's child and ``leasejobs.testing`` hold it."""

    @property
    def retry_policy(self) -> str | None: ...


class Prepared(NamedTuple):
    """A body ready to run: its task, what its outcome is judged by, its context and arguments."""

    task: "Task"
    facts: Facts
    ctx: JobContext
    args: list[Any]
    kwargs: dict[str, Any]


def prepare(
    job: Attempt,
    args_text: str,
    kwargs_text: str,
    *,
    worker_id: str,
    lease_seconds: float,
    places: int,
    slot: BodySlot | None = None,
) -> Prepared:
    """Everything ``run`` needs for one attempt; ``ValueError`` naming why it cannot run
    (an unknown task, a stored retry policy or arguments that cannot be read)."""
    task = registry.get(job.task_name)
    if task is None:
        raise ValueError(f"unknown task {job.task_name!r}")
    policy = outcomes.policy_of(task.retry, job.retry_policy)
    args, kwargs = load_arguments(args_text, kwargs_text)
    facts = outcomes.facts_for(job, policy, worker_id)
    ctx = context_for(job, worker_id=worker_id, lease_seconds=lease_seconds, places=places, slot=slot)
    return Prepared(task, facts, ctx, args, kwargs)


def load_arguments(args_text: str, kwargs_text: str) -> tuple[list[Any], dict[str, Any]]:
    """A row's arguments as the body gets them; ``ValueError`` naming what is wrong.

    Read here, in the process that runs the body, and never by the worker:
    a value Python refuses (an integer of more than 4,300 digits, JSON nested
    past the recursion limit) fails that job alone.
    """
    try:
        args = [] if args_text == "[]" else json.loads(args_text)
        kwargs = {} if kwargs_text == "{}" else json.loads(kwargs_text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the job's arguments cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("malformed job row: args must be a JSON list and kwargs a JSON object")
    return args, kwargs


def run(
    task: "Task",
    ctx: JobContext,
    facts: Facts,
    args: list[Any],
    kwargs: dict[str, Any],
    trace_context: dict[str, str] | None = None,
) -> Ran:
    """Run the body once and say how it ended."""
    began = time.perf_counter()
    observed = observe.job_started(ctx, trace_context)
    token = activate(ctx)
    outcome: Outcome | None = None
    raised: BaseException | None = None
    stopped = False
    try:
        result = task.func(*([ctx, *args] if task.takes_context else args), **kwargs)
        # None, what most bodies return, is never awaitable: spare it the ABC check.
        if result is not None and inspect.isawaitable(result):
            result = _await(result)
    except (LeaseLost, BodyStopped) as exc:
        raised = exc
        if ctx.lease_lost:  # the fence, or the worker's flags, said so: the attempt is over
            stopped = isinstance(exc, BodyStopped)
        else:  # raised by the body's own code while its lease holds: an ordinary failure
            outcome = outcomes.failure(facts, exc, cancel_requested=ctx.cancel_requested)
    except BaseException as exc:  # SystemExit in a body fails its job, never its process
        raised = exc
        outcome = outcomes.failure(facts, exc, cancel_requested=ctx.cancel_requested)
    else:
        outcome = outcomes.success(facts, result, cancel_requested=ctx.cancel_requested)
    finally:
        deactivate(token)
    if raised is not None:
        _tidy_django_connections()
    seconds = time.perf_counter() - began
    status = "lease_lost" if outcome is None else outcome.status
    observe.job_finished(observed, ctx, status, seconds, raised)
    return Ran(outcome, raised, seconds, stopped)


def _await(awaitable: Awaitable[Any]) -> Any:
    """Run an awaitable to its end on an event loop of its own.

    A fresh loop per body (``asyncio.run``): tasks a body started and left
    behind are cancelled as it ends, never run on during the next body.
    """
    if inspect.iscoroutine(awaitable):
        return asyncio.run(awaitable)

    async def wait() -> Any:
        return await awaitable

    return asyncio.run(wait())


def _tidy_django_connections() -> None:
    """After a body that raised: drop Django connections its failure left unusable.

    Healthy connections are kept (a new connection per job is what makes a
    naive Django worker slow); a broken one is closed so the next job gets a
    fresh one instead of the same error.
    """
    for conn in connections.all(initialized_only=True):
        # Never inside a transaction the caller holds (leasejobs.testing in a test's).
        if conn.connection is not None and conn.errors_occurred and not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()
