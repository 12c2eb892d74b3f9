"""Runners: the threads that run job bodies.

Each runner takes the oldest buffered job, runs its body, settles its one
outcome and goes straight on to the next job, so a stream of short jobs
costs no thread hand-off per job. A body's exception, ``SystemExit``
included, fails that job only; anything that goes wrong while describing
it becomes the job's error too (see ``outcomes``).
"""

import asyncio
import inspect
import time
from collections.abc import Callable

from django.db import connections

from leasejobs import observe
from leasejobs.connection import CONNECTION_ERRORS
from leasejobs.context import activate, deactivate
from leasejobs.exceptions import LeaseLost
from leasejobs.store import Outcome, WorkerStore
from leasejobs.worker import outcomes, rules
from leasejobs.worker.events import Events, describe
from leasejobs.worker.held import HeldJob, HeldJobs


class Runners:
    def __init__(
        self,
        store: WorkerStore,
        held: HeldJobs,
        events: Events,
        *,
        settle: Callable[[HeldJob, Outcome], bool],
        buffer_low: Callable[[int], None],
    ) -> None:
        self.store = store
        self.held = held
        self.events = events
        self._settle = settle
        self._buffer_low = buffer_low
        #: Smoothed body duration (seconds), None until a body has run; sizes the prefetch.
        self.mean_duration: float | None = None
        self._is_async: dict[str, bool] = {}

    def run(self) -> None:
        """One runner thread: take, run, settle, until the table is closed."""
        while (job := self.held.take()) is not None:
            started = time.monotonic()
            try:
                self._run_one(job, started)
            finally:
                self.mean_duration = rules.mean_duration(self.mean_duration, time.monotonic() - started)
                self._buffer_low(self.held.body_ended())

    def _run_one(self, job: HeldJob, started: float) -> None:
        if job.ctx.cancel_requested:
            self._settle(job, outcomes.cancelled_before_start())
            return
        if started >= job.lease_ends:
            # Its worker was paused (SIGSTOP, a stopped VM) while the job waited
            # for a runner: another worker may hold it, and a place under a limit.
            if self.held.drop(job):
                self.events.lease_lost(job, "its lease ran out before its body started")
            return
        if not job.counted and job.taken_over and not self._mark_started(job):
            return
        job.started = True
        assert job.task is not None, "refused jobs never reach a runner"
        job.deadline = rules.timeout_deadline(started, job.task.timeout_seconds)
        observed = observe.job_started(job.ctx, job.waited + started - job.claimed_at, job.trace_context)
        try:
            outcome, raised = self._execute(job)
        finally:
            _tidy_django_connections()
        observe.job_finished(
            observed,
            job.ctx,
            "lease_lost" if outcome is None else outcome.status,
            time.monotonic() - started,
            raised,
        )
        if outcome is not None and not self._settle(job, outcome):
            self.events.late_outcome(job, time.monotonic() - started)

    def _mark_started(self, job: HeldJob) -> bool:
        """Put a taken-over job's run on record before its body may kill this worker too."""
        try:
            marked = self.store.mark_started(job.key)
        except CONNECTION_ERRORS as exc:
            marked = False
            why = f"its start could not be recorded: {exc.__class__.__name__}"
        else:
            why = "the job moved on before its body started"
        if not marked:
            if self.held.drop(job):
                self.events.lease_lost(job, why)
            return False
        job.counted = True
        return True

    def _execute(self, job: HeldJob) -> tuple[Outcome | None, BaseException | None]:
        """Run the body: its outcome (None when it let ``LeaseLost`` escape: nothing to write),
        and what it raised."""
        task = job.task
        assert task is not None
        is_async = self._is_async.get(job.task_name)
        if is_async is None:
            is_async = self._is_async[job.task_name] = inspect.iscoroutinefunction(task.func)
        token = activate(job.ctx)
        try:
            args = [job.ctx, *job.args] if task.takes_context else job.args
            if is_async:
                result = asyncio.run(task.func(*args, **job.kwargs))
            else:
                result = task.func(*args, **job.kwargs)
        except LeaseLost as exc:
            if self.held.drop(job):
                self.events.lease_lost(job, f"the body stopped: {describe(exc)}")
            return None, exc
        except BaseException as exc:  # SystemExit in a body must not kill its runner
            return outcomes.failure(job, exc, self.events.worker_id), exc
        finally:
            deactivate(token)
        return outcomes.success(job, result), None


def _tidy_django_connections() -> None:
    """After a body: drop Django connections a failure left unusable.

    Healthy connections are kept (a new connection per job is what makes a
    naive Django worker slow); a broken one is closed so the next job gets a
    fresh one instead of the same error.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()
