"""The job actions: retry now, cancel, release lease — each fenced.

An operator acts on what the page showed, and the queue moves on while they
read it. Every row of the changelist therefore carries the status and
attempt it was shown with (a hidden ``leasejobs_seen`` input beside its
checkbox); an action sends the selected rows with those values to one
statement of ``leasejobs.sql`` whose WHERE re-checks them, and reports how
many rows it changed and how many had changed since the page was shown.
"Select all N jobs" across pages is refused: rows on other pages were never
shown, so there is no state to fence on.
"""

import logging
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest

from leasejobs import conf, sql
from leasejobs.enqueue import db_alias
from leasejobs.models import Job

logger = logging.getLogger("leasejobs.admin")

#: The hidden input that carries "id:status:attempt" of each row shown.
SEEN_FIELD = "leasejobs_seen"


def seen_token(job: Job) -> str:
    return f"{job.pk}:{job.status}:{job.attempt}"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass(frozen=True)
class Seen:
    """A selected job as the page showed it."""

    id: int
    status: str
    attempt: int


@dataclass(frozen=True)
class Selection:
    """The selected jobs an action may change, with what it reports about the rest."""

    targets: list[Seen]
    selected: int
    not_eligible: int
    eligible_as: str

    @property
    def params(self) -> dict[str, list]:
        return {
            "ids": [t.id for t in self.targets],
            "statuses": [t.status for t in self.targets],
            "attempts": [t.attempt for t in self.targets],
        }

    def report(self, model_admin: admin.ModelAdmin, request: HttpRequest, done: str, changed: int) -> None:
        """One message: what was done, of how many, and why the rest was not."""
        parts = [f"{done} of {_plural(self.selected, 'selected job', 'selected jobs')}."]
        # Selected rows that were eligible, or came without a token, and were not changed.
        moved_on = self.selected - self.not_eligible - changed
        if moved_on:
            verb = "has" if moved_on == 1 else "have"
            parts.append(f"{moved_on} {verb} changed since the page was shown and {verb} been left alone.")
        if self.not_eligible:
            parts.append(
                f"{self.not_eligible} {'was' if self.not_eligible == 1 else 'were'} not {self.eligible_as}."
            )
        level = messages.WARNING if moved_on or self.not_eligible else messages.SUCCESS
        model_admin.message_user(request, " ".join(parts), level)


def select(
    model_admin: admin.ModelAdmin, request: HttpRequest, eligible: set[str], eligible_as: str
) -> Selection | None:
    """The selected rows as they were shown, split by whether the action applies.

    A selected row without a well-formed token (a hand-made POST) has no
    state to fence on and is counted as changed. None (and a message) for a
    select-across.
    """
    if request.POST.get("select_across") == "1":
        model_admin.message_user(
            request,
            "Select the jobs on this page: an action changes a job only while it is in the state and "
            "attempt you saw, and the jobs on other pages were not shown. Nothing was changed.",
            messages.ERROR,
        )
        return None
    selected = set(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
    seen: dict[int, Seen] = {}
    for token in request.POST.getlist(SEEN_FIELD):
        job_id, _, rest = token.partition(":")
        status, _, attempt = rest.partition(":")
        if job_id in selected and job_id.isdigit() and attempt.isdigit():
            seen[int(job_id)] = Seen(int(job_id), status, int(attempt))
    targets = [s for s in seen.values() if s.status in eligible]
    return Selection(targets, len(selected), len(seen) - len(targets), eligible_as)


def _execute(statement: str, params: dict[str, object]) -> list[tuple]:
    """Run one fenced statement; its rows are (id, attempt, worker, ...) per changed job."""
    with connections[db_alias()].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def _log(event: str, request: HttpRequest, rows: list[tuple]) -> None:
    for job_id, attempt, worker, *_ in rows:
        logger.info(
            "admin %s job=%s attempt=%s worker=%s user=%s",
            event,
            job_id,
            attempt,
            worker or "-",
            request.user.get_username(),
        )


@admin.action(
    description="Release lease (claimable at once; the holder is fenced off)", permissions=["change"]
)
def release_lease(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    """Give running jobs' leases back: queued, claimable at once, the holder's writes fenced off."""
    selection = select(model_admin, request, {Job.Status.RUNNING}, "running")
    if selection is None:
        return
    params = {k: v for k, v in selection.params.items() if k != "statuses"}
    rows = _execute(sql.ADMIN_RELEASE, {**params, "channel": conf.get("NOTIFY_CHANNEL")})
    _log("released", request, rows)
    selection.report(model_admin, request, f"Released {len(rows)}", len(rows))


@admin.action(description="Cancel (queued: at once; running: ask the body to stop)", permissions=["change"])
def cancel(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    """Cancel queued jobs now; ask running ones to stop, through their worker's heartbeat."""
    selection = select(model_admin, request, {Job.Status.QUEUED, Job.Status.RUNNING}, "queued or running")
    if selection is None:
        return
    rows = _execute(sql.ADMIN_CANCEL, selection.params)
    _log("cancelled", request, rows)
    queued = sum(1 for r in rows if r[3] == Job.Status.QUEUED)
    running = len(rows) - queued
    done = (
        f"Cancelled {_plural(queued, 'queued job', 'queued jobs')} and asked "
        f"{_plural(running, 'running job', 'running jobs')} to stop"
    )
    selection.report(model_admin, request, done, len(rows))


@admin.action(description="Retry now (failed, cancelled or scheduled jobs)", permissions=["change"])
def retry_now(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    """Queue failed or cancelled jobs again, due now, with one more attempt allowed."""
    selection = select(
        model_admin,
        request,
        {Job.Status.QUEUED, Job.Status.FAILED, Job.Status.CANCELLED},
        "failed, cancelled or queued",
    )
    if selection is None:
        return
    rows = _execute(sql.ADMIN_RETRY, {**selection.params, "channel": conf.get("NOTIFY_CHANNEL")})
    _log("retried", request, rows)
    selection.report(model_admin, request, f"Queued {len(rows)} to run now", len(rows))
