"""A job's page: what happened to it, in the order an operator asks.

The page is read from one row (``Job`` with ``leasejobs.admin.lease``'s
annotations and ``db_now``, the database clock of that read), so every
duration agrees with the claim statement's view of the job:

- on a failed job, the error and its traceback first;
- status, lease and the times to the second, each with the duration that
  answers the question (queued for, ran for, lease left);
- the attempts, each with its worker and why it ended, from what the row
  records: ``Job.attempt_workers`` (one per claim), ``errors`` (one per failed
  attempt), ``attempt``, ``snoozes``, and the times of the latest attempt.
  An earlier attempt with no error entry ended without an outcome of its
  own: its lease expired and another claim took the job over, or its
  worker gave it back (at shutdown, or an operator's release), or it
  snoozed. The row keeps no time for those, except that the next attempt's
  claim (``started_at``) is when the job was taken over;
- then the rest of the row, leaving out what is empty.
"""

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from leasejobs.admin import lease, steps
from leasejobs.db.rows import ErrorEntry, read_entries
from leasejobs.models import Job

#: A fieldset as ModelAdmin.get_fieldsets returns it.
Fieldset = tuple[str | None, dict[str, Any]]


def db_now(job: Job) -> dt.datetime:
    """The database clock when the row was read (annotated by JobAdmin.get_queryset)."""
    now: dt.datetime | None = getattr(job, "db_now", None)
    return now if now is not None else timezone.now()


def stamp(moment: dt.datetime) -> str:
    """A time to the second in the current time zone: '2026-06-01 12:00:03 UTC'."""
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def clock(moment: dt.datetime, now: dt.datetime) -> str:
    """A time to the second, with its date only when it is not today: '12:00:03'."""
    local, today = timezone.localtime(moment), timezone.localtime(now)
    return f"{local:%H:%M:%S}" if local.date() == today.date() else f"{local:%Y-%m-%d %H:%M:%S}"


def ago(moment: dt.datetime, now: dt.datetime) -> str:
    """'3 min 5 s ago' or 'in 10 s', from the database clock."""
    return lease.relative(moment - now)


# -- the error first --------------------------------------------------------------


def entries(job: Job) -> list[ErrorEntry]:
    """The row's error entries that are entries (the column is JSON: anything may be there)."""
    return [e for e in read_entries(job.errors) if isinstance(e, dict)]


def last_entry(job: Job) -> ErrorEntry | None:
    """The error entry of the job's latest attempt, if that attempt failed with an exception."""
    found = [e for e in entries(job) if e.get("attempt") == job.attempt]
    return found[-1] if found else None


# -- times and durations ----------------------------------------------------------------


def times(job: Job) -> list[tuple[str, dt.datetime, str]]:
    """(what, when, how long) for each time the row has, in the order they happen."""
    now = db_now(job)
    rows: list[tuple[str, dt.datetime, str]] = [("created", job.created_at, ago(job.created_at, now))]
    if job.status == Job.Status.QUEUED:
        waited = now - job.run_at
        note = f"waiting for {lease.human(waited)}" if waited >= dt.timedelta(0) else ago(job.run_at, now)
        rows.append(("due", job.run_at, note))
    else:
        rows.append(("due", job.run_at, ""))
    claimed = job.started_at if job.attempt and job.status != Job.Status.QUEUED else None
    if claimed is not None:
        note = f"queued for {lease.human(max(dt.timedelta(0), claimed - max(job.run_at, job.created_at)))}"
        if job.status == Job.Status.RUNNING:
            note += f" · running for {lease.human(now - claimed)}"
        rows.append((f"claimed (attempt {job.attempt})", claimed, note))
    if job.status == Job.Status.RUNNING:
        if job.heartbeat_at is not None:
            rows.append(("last heartbeat", job.heartbeat_at, ago(job.heartbeat_at, now)))
        if job.lease_until is not None:
            left = job.lease_until - now
            note = (
                f"{lease.human(left)} left" if left > dt.timedelta(0) else f"expired {lease.human(left)} ago"
            )
            rows.append(("lease until", job.lease_until, note))
    if job.finished_at is not None and job.status in (
        Job.Status.DONE,
        Job.Status.FAILED,
        Job.Status.CANCELLED,
    ):
        note = ago(job.finished_at, now)
        if claimed is not None and job.finished_at >= claimed:
            note = f"ran for {lease.human(job.finished_at - claimed)} · {note}"
        rows.append((job.status, job.finished_at, note))
    return rows


def times_table(job: Job) -> SafeString:
    return format_html(
        '<table class="leasejobs-times"><tbody>{}</tbody></table>',
        format_html_join(
            "",
            "<tr><th>{}</th><td>{}</td><td>{}</td></tr>",
            ((what, stamp(when), note) for what, when, note in times(job)),
        ),
    )


# -- the attempts ----------------------------------------------------------------


def _worker(job: Job, n: int) -> str:
    """The worker of attempt ``n``, as the row records it (``Job.attempt_workers``)."""
    workers = job.attempt_workers
    return workers[n - 1] if 0 < n <= len(workers) and workers[n - 1] else "worker not recorded"


def _exception(entry: ErrorEntry) -> str:
    return str(entry.get("exception_class") or "an exception")


def _no_outcome(job: Job) -> str:
    """Why an attempt ended with no error entry and no finish of its own."""
    if job.snoozes:
        return "snoozed, or lost its lease (expired and taken over, or given back)"
    return "lost its lease (expired and taken over, or given back)"


def _latest(job: Job, entry: ErrorEntry | None) -> tuple[str, str]:
    """(what happened, css state) for the latest attempt."""
    now = db_now(job)
    state = getattr(job, "lease_state", lease.NONE)
    claimed = f"claimed at {clock(job.started_at, now)}" if job.started_at else "claimed"
    if job.status == Job.Status.RUNNING:
        if state == lease.EXPIRED:
            until = job.lease_until
            when = f" at {clock(until, now)} ({ago(until, now)})" if until else ""
            return (
                f"{claimed}; lost its lease{when}: no heartbeat in time, any worker may take it over",
                "expired",
            )
        left = lease.human(getattr(job, "lease_left", None) or dt.timedelta(0))
        if state == lease.EXPIRING:
            return f"{claimed}; running, heartbeat late: {left} of its lease left", "expiring"
        return f"{claimed}; running, lease held: {left} left", "held"
    finished = f" at {clock(job.finished_at, now)}" if job.finished_at else ""
    if job.status == Job.Status.DONE:
        return f"{claimed}; done{finished}", "done"
    if job.status == Job.Status.FAILED:
        if entry is not None:
            return f"{claimed}; failed{finished}: {_exception(entry)}", "failed"
        reason = job.last_error.splitlines()[0] if job.last_error else "no error recorded"
        return f"{claimed}; failed{finished}: {reason}", "failed"
    if job.status == Job.Status.CANCELLED:
        return f"{claimed}; cancelled{finished}", "cancelled"
    # Queued again after this attempt: a retry to come, or no outcome of its own.
    due = f"due again {ago(job.run_at, now)}"
    if entry is not None:
        return f"{claimed}; failed: {_exception(entry)}; {due}", "failed"
    return f"{claimed}; {_no_outcome(job)}; {due}", "lost"


def attempts(job: Job) -> list[tuple[int, str, str, str]]:
    """(attempt, worker, what happened, css state) for each attempt, first to latest."""
    now = db_now(job)
    by_attempt = {e.get("attempt"): e for e in entries(job)}
    rows = []
    for n in range(1, job.attempt + 1):
        entry = by_attempt.get(n)
        if n == job.attempt:
            what, state = _latest(job, entry)
        elif entry is not None:
            what, state = f"failed: {_exception(entry)}; retried", "failed"
        else:
            what, state = _no_outcome(job), "lost"
            if n == job.attempt - 1 and job.started_at and job.status != Job.Status.QUEUED:
                what += f"; attempt {n + 1} took the job over at {clock(job.started_at, now)}"
        rows.append((n, _worker(job, n), what, state))
    return rows


def timeline(job: Job) -> SafeString:
    """The attempts as a list: 'attempt 1: w-a · lost its lease …'."""
    return format_html(
        '<ol class="leasejobs-timeline">{}</ol>',
        format_html_join(
            "",
            '<li class="leasejobs-attempt-{}">attempt {}: {} · {}</li>',
            ((state, n, worker, what) for n, worker, what, state in attempts(job)),
        ),
    )


# -- which fields a job's page shows ------------------------------------------------------


def _present(job: Job, field: str) -> bool:
    """Whether a field of the page has something to show for this job."""
    value = {
        "idempotency_key": job.idempotency_key,
        "concurrency_display": job.concurrency_key,
        "args_display": job.args,
        "kwargs_display": job.kwargs,
        "result_display": job.result is not None,
        "last_error_display": job.last_error,
        "errors_display": entries(job),
        "lease_display": job.status == Job.Status.RUNNING,
        "cancel_requested_display": job.status in (Job.Status.QUEUED, Job.Status.RUNNING)
        or job.cancel_requested,
        "timeline_display": job.attempt,
        "traceback_display": last_entry(job),
        "retry_policy": job.retry_policy,
        "trace_context": job.trace_context,
        "snoozes": job.snoozes,
        "workflow_display": job.workflow_id,
        "steps_display": field == "steps_display" and steps.rows(job),
    }.get(field, True)
    return bool(value)


def _keep(job: Job, sets: Iterable[Fieldset]) -> list[Fieldset]:
    """The fieldsets with their empty fields left out, and the sets left empty dropped."""
    kept = []
    for name, options in sets:
        fields = [f for f in options["fields"] if _present(job, f)]
        if fields:
            kept.append((name, {**options, "fields": fields}))
    return kept


def fieldsets(job: Job) -> list[Fieldset]:
    """The page's sections for this job: the failure first when it failed."""
    failed = job.status == Job.Status.FAILED
    sets: list[Fieldset] = []
    if failed:
        sets.append(("Why it failed", {"fields": ["last_error_display", "traceback_display"]}))
    sets += [
        (
            None,
            {
                "fields": [
                    "status_display",
                    "attempt_display",
                    "lease_display",
                    "cancel_requested_display",
                    "times_display",
                ]
            },
        ),
        ("Attempts", {"fields": ["timeline_display"]}),
        ("Durable steps", {"fields": ["steps_display"]}),
        (
            "Job",
            {"fields": JOB_FIELDS},
        ),
        ("Arguments and result", {"fields": ["args_display", "kwargs_display", "result_display"]}),
        (
            "Errors",
            {"fields": (["errors_display"] if failed else ["last_error_display", "errors_display"])},
        ),
    ]
    return _keep(job, sets)


#: The "Job" section's fields: what the job is, whatever its state.
JOB_FIELDS = [
    "id",
    "task_name",
    "queue",
    "priority",
    "idempotency_key",
    "concurrency_display",
    "runs",
    "snoozes",
    "retry_policy",
    "trace_context",
    "workflow_display",
]

#: Every field any job's page may show (the admin's checks and read-only list).
ALL_FIELDS = [
    "last_error_display",
    "traceback_display",
    "status_display",
    "attempt_display",
    "lease_display",
    "cancel_requested_display",
    "times_display",
    "timeline_display",
    "steps_display",
    *JOB_FIELDS,
    "args_display",
    "kwargs_display",
    "result_display",
    "errors_display",
]


# -- the buttons ---------------------------------------------------------------


def buttons(job: Job) -> list[tuple[str, str, str]]:
    """(action, label, what it does) for the actions that apply to this job now."""
    found = []
    # A job waiting for its workflow parents is not "scheduled": a retry cannot make it due.
    scheduled = job.status == Job.Status.QUEUED and job.pending_parents == 0 and job.run_at > db_now(job)
    if job.status in (Job.Status.FAILED, Job.Status.CANCELLED) or scheduled:
        found.append(("retry_now", "Retry now", "Queue it again, due now, with one more attempt allowed."))
    if job.status == Job.Status.QUEUED:
        found.append(("cancel", "Cancel", "Cancel it now: it will not run."))
    if job.status == Job.Status.RUNNING:
        found.append(
            ("cancel", "Cancel", "Ask the running body to stop, through its worker's next heartbeat.")
        )
        found.append(
            (
                "release_lease",
                "Release lease",
                "Queue it again, claimable at once; the holder's writes are fenced off.",
            )
        )
    return found
