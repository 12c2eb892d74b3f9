"""What an attempt's end becomes: done, a retry, a failure or a cancel.

Each function turns what happened to one attempt into the ``Outcome`` the
finisher writes. None of them may raise on a job's data: an exception whose
message cannot be read, a NUL in a traceback or a return value PostgreSQL
cannot store all become that job's error, never a dead thread.
"""

import traceback
from typing import Any

from leasejobs import retry
from leasejobs.errors import ErrorEntry, class_path
from leasejobs.store import Outcome
from leasejobs.values import stored_json, stored_text
from leasejobs.worker.held import HeldJob


def error_entry(job: HeldJob, worker_id: str, exception_class: str, trace: str) -> ErrorEntry:
    """One entry of the job's ``errors`` list (the backend and the admin read these)."""
    return ErrorEntry(
        attempt=job.key.attempt,
        worker_id=worker_id,
        exception_class=exception_class,
        traceback=stored_text(trace),
    )


def success(job: HeldJob, result: Any) -> Outcome:
    """Done (or cancelled, when a cancel arrived meanwhile), or failed if the result cannot be stored."""
    status = "cancelled" if job.ctx.cancel_requested else "done"
    if result is None:
        return Outcome(status=status)
    try:
        text = stored_json(result, f"the return value of {job.task_name}")
    except (TypeError, ValueError) as exc:
        return Outcome(status="failed", last_error=stored_text(str(exc)))
    return Outcome(status=status, result=text)


def failure(job: HeldJob, exc: BaseException, worker_id: str) -> Outcome:
    """What the job's retry policy says about ``exc`` (``leasejobs.retry.decide``); a cancel ends it.

    Retry with backoff while started runs remain, else fail; ``Snooze`` queues
    it for later without an error entry and without counting the run;
    ``Discard`` fails it now.
    """
    try:
        last_line = traceback.format_exception_only(exc)[-1].strip()
        trace = "".join(traceback.format_exception(exc))
    except Exception:  # a hostile __str__ or __repr__
        last_line = f"{type(exc).__name__}: <the exception's message could not be read>"
        trace = last_line
    last_line = stored_text(last_line)
    entry = error_entry(job, worker_id, class_path(type(exc)), trace)
    if job.ctx.cancel_requested:
        return Outcome(status="cancelled", last_error=last_line, error_entry=entry)
    decision = retry.decide(job.retry_policy, exc, job.runs, job.max_attempts, job.snoozes)
    if decision.action == "snooze":
        return Outcome(status="queued", retry_delay=decision.delay, snoozed=True)
    if decision.action == "retry":
        return Outcome(status="queued", last_error=last_line, error_entry=entry, retry_delay=decision.delay)
    return Outcome(status="failed", last_error=stored_text(decision.reason or last_line), error_entry=entry)


def timeout_outcome(job: HeldJob, worker_id: str) -> Outcome:
    """The attempt ran past its task's ``timeout_seconds``: a ``TimeoutError``, as the policy treats it."""
    timeout = job.task.timeout_seconds if job.task else None
    return failure(job, TimeoutError(f"job ran past its timeout of {timeout} s"), worker_id)


def refusal(why: str) -> Outcome:
    """A claimed row that cannot run at all (no retry would help)."""
    return Outcome(status="failed", last_error=stored_text(why))


def cancelled_before_start() -> Outcome:
    return Outcome(status="cancelled", last_error="cancelled before its body started")
