"""What an attempt's end becomes: done, a retry, a failure or a cancel.

Each function turns what happened to one attempt into the ``Outcome`` the
finisher writes. None of them may raise on a job's data: an exception whose
message cannot be read, a NUL in a traceback or a return value PostgreSQL
cannot store all become that job's error, never a dead thread.
"""

import traceback
from typing import Any

from leasejobs import conf
from leasejobs.store import Outcome
from leasejobs.values import stored_json, stored_text
from leasejobs.worker import rules
from leasejobs.worker.held import HeldJob


def error_entry(job: HeldJob, worker_id: str, exception_class: str, trace: str) -> dict[str, Any]:
    """One entry of the job's ``errors`` list (the backend and the admin read these)."""
    return {
        "attempt": job.key.attempt,
        "worker_id": worker_id,
        "exception_class": exception_class,
        "traceback": stored_text(trace),
    }


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
    """Retry with backoff while started runs remain, else fail; a pending cancel ends it."""
    try:
        last_line = traceback.format_exception_only(exc)[-1].strip()
        trace = "".join(traceback.format_exception(exc))
    except Exception:  # a hostile __str__ or __repr__
        last_line = f"{type(exc).__name__}: <the exception's message could not be read>"
        trace = last_line
    last_line = stored_text(last_line)
    entry = error_entry(job, worker_id, f"{type(exc).__module__}.{type(exc).__qualname__}", trace)
    if job.ctx.cancel_requested:
        return Outcome(status="cancelled", last_error=last_line, error_entry=entry)
    return _retry_or_fail(job, last_line, entry)


def timeout_outcome(job: HeldJob, worker_id: str) -> Outcome:
    """The attempt ran past its task's ``timeout_seconds``."""
    timeout = job.task.timeout_seconds if job.task else None
    error = f"TimeoutError: job ran past its timeout of {timeout} s"
    return _retry_or_fail(job, error, error_entry(job, worker_id, "builtins.TimeoutError", error))


def refusal(why: str) -> Outcome:
    """A claimed row that cannot run at all (no retry would help)."""
    return Outcome(status="failed", last_error=stored_text(why))


def cancelled_before_start() -> Outcome:
    return Outcome(status="cancelled", last_error="cancelled before its body started")


def _retry_or_fail(job: HeldJob, last_error: str, entry: dict[str, Any]) -> Outcome:
    if rules.may_retry(job.runs, job.max_attempts):
        delay = rules.retry_delay(
            job.runs,
            base=float(conf.get("RETRY_BACKOFF_SECONDS")),
            cap=float(conf.get("RETRY_BACKOFF_MAX_SECONDS")),
        )
        return Outcome(status="queued", last_error=last_error, error_entry=entry, retry_delay=delay)
    return Outcome(status="failed", last_error=last_error, error_entry=entry)
