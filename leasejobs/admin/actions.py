"""The job actions: retry now, cancel, release lease — each fenced.

An operator acts on what the page showed, and the queue moves on while they
read it. Every row of the changelist therefore carries the status and
attempt it was shown with (a hidden ``leasejobs_seen`` input beside its
checkbox); an action sends the selected rows with those values to one
statement of ``leasejobs.db.sql`` whose WHERE re-checks them, and reports how
many rows it changed and how many had changed since the page was shown.

A row of the action's ``queryset`` that comes without that state (a plain
Django admin POST, another admin theme's template, a script, or the action
called from code as ``retry_now(modeladmin, request, queryset)``) is acted
on in its current state: its id, status and attempt are read first and the
same fenced statement runs with them, so a row that moves on between the read
and the write is still left alone. Only the rows of ``queryset`` are touched.
"Select all N jobs" across pages is refused: rows on other pages were never
shown, so the operator never saw what they would change.

Releasing a lease that is still healthy (held, its worker heartbeating)
takes a job from a body that is running: the pages that offer it (the job
list and a job's page) send ``leasejobs_release=ask``, and the action then
answers with a confirmation page that says what happens to that body
before it releases anything. A POST without that field (a script, or the
action called from code) is not asked, as no other action is.
"""

import logging
from dataclasses import dataclass

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from leasejobs import conf
from leasejobs.admin import lease
from leasejobs.conf import db_alias
from leasejobs.db import facade, sql
from leasejobs.models import Job

logger = logging.getLogger("leasejobs.admin")

#: The hidden input that carries "id:status:attempt" of each row shown.
SEEN_FIELD = "leasejobs_seen"

#: The hidden input of the pages that ask before a healthy lease is released:
#: ``ask`` from the job list and a job's page, ``confirmed`` from the question.
CONFIRM_FIELD = "leasejobs_release"
ASK = "ask"
CONFIRMED = "confirmed"


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
    #: How the rows' expected state was known: "the page was shown" or "it was read".
    since: str

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
        # Eligible rows that were not changed: they moved on before the statement ran.
        moved_on = self.selected - self.not_eligible - changed
        if moved_on:
            verb = "has" if moved_on == 1 else "have"
            parts.append(f"{moved_on} {verb} changed since {self.since} and {verb} been left alone.")
        if self.not_eligible:
            parts.append(
                f"{self.not_eligible} {'was' if self.not_eligible == 1 else 'were'} not {self.eligible_as}."
            )
        level = messages.WARNING if moved_on or self.not_eligible else messages.SUCCESS
        model_admin.message_user(request, " ".join(parts), level)


def _shown(request: HttpRequest) -> dict[int, Seen]:
    """The rows' state as the changelist showed it, from its hidden inputs (maybe none)."""
    shown: dict[int, Seen] = {}
    for token in request.POST.getlist(SEEN_FIELD):
        job_id, _, rest = token.partition(":")
        status, _, attempt = rest.partition(":")
        if job_id.isdigit() and attempt.isdigit():
            shown[int(job_id)] = Seen(int(job_id), status, int(attempt))
    return shown


def select(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Job],
    eligible: set[str],
    eligible_as: str,
) -> Selection | None:
    """The rows of ``queryset`` with the state to fence on, split by whether the action applies.

    A row's state is the one its page showed when the POST carries it, else
    its current state, read here. None (and a message) for a select-across.
    """
    if request.POST.get("select_across") == "1":
        model_admin.message_user(
            request,
            "Select the jobs on this page: an action changes a job only while it is in the state and "
            "attempt you saw, and the jobs on other pages were not shown. Nothing was changed.",
            messages.ERROR,
        )
        return None
    shown = _shown(request)
    current = queryset.using(db_alias()).order_by("pk").values_list("pk", "status", "attempt")
    rows = [shown.get(pk, Seen(pk, status, attempt)) for pk, status, attempt in current]
    targets = [s for s in rows if s.status in eligible]
    from_page = any(s.id in shown for s in rows)
    since = "the page was shown" if from_page else "it was read"
    return Selection(targets, len(rows), len(rows) - len(targets), eligible_as, since)


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
def release_lease(
    model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]
) -> TemplateResponse | None:
    """Give running jobs' leases back: queued, claimable at once, the holder's writes fenced off."""
    selection = select(model_admin, request, queryset, {Job.Status.RUNNING}, "running")
    if selection is None:
        return None
    if request.POST.get(CONFIRM_FIELD) == ASK:
        healthy = held_leases(selection.targets)
        if healthy:
            return confirm_release(model_admin, request, healthy)
    params = {k: v for k, v in selection.params.items() if k != "statuses"}
    rows = facade.admin_change(sql.ADMIN_RELEASE, {**params, "channel": conf.get("NOTIFY_CHANNEL")})
    _log("released", request, rows)
    selection.report(model_admin, request, f"Released {len(rows)}", len(rows))
    return None


def held_leases(targets: list[Seen]) -> list[Job]:
    """The targets whose lease is healthy now (held, heartbeat on time; database clock),
    in the attempt the page showed. An expiring or expired lease is released without a question."""
    attempts = {t.id: t.attempt for t in targets}
    jobs = (
        lease.annotate(Job.objects.using(db_alias()).filter(pk__in=list(attempts)))
        .filter(lease.state_q(lease.HELD))
        .only("id", "task_name", "queue", "status", "attempt", "leased_by", "lease_until", "cancel_requested")
        .order_by("pk")
    )
    return [
        job
        for job in jobs
        if attempts.get(job.pk) == job.attempt and getattr(job, "lease_state", None) == lease.HELD
    ]


def confirm_release(
    model_admin: admin.ModelAdmin, request: HttpRequest, healthy: list[Job]
) -> TemplateResponse:
    """The question before a healthy lease is released: the same POST again, confirmed.

    Every field of the POST goes back unchanged (the selection, the state
    each row was shown in, the action), so the answer is acted on exactly as
    the question was asked, fenced the same way.
    """
    carried = [
        (key, value)
        for key, values in request.POST.lists()
        for value in values
        if key not in ("csrfmiddlewaretoken", CONFIRM_FIELD)
    ]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Release a lease that is still held?",
        "opts": model_admin.opts,
        "jobs": [(job, lease.cell(job)) for job in healthy],
        "carried": carried,
        "confirm_field": CONFIRM_FIELD,
        "confirmed": CONFIRMED,
        "back": request.get_full_path(),
    }
    return TemplateResponse(request, "admin/leasejobs/job/release_confirm.html", context)


@admin.action(description="Cancel (queued: at once; running: ask the body to stop)", permissions=["change"])
def cancel(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> None:
    """Cancel queued jobs now; ask running ones to stop, through their worker's heartbeat."""
    selection = select(
        model_admin, request, queryset, {Job.Status.QUEUED, Job.Status.RUNNING}, "queued or running"
    )
    if selection is None:
        return
    rows = facade.admin_change(sql.ADMIN_CANCEL, {**selection.params, "channel": conf.get("NOTIFY_CHANNEL")})
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
        queryset,
        {Job.Status.QUEUED, Job.Status.FAILED, Job.Status.CANCELLED},
        "failed, cancelled or queued",
    )
    if selection is None:
        return
    rows = facade.admin_change(sql.ADMIN_RETRY, {**selection.params, "channel": conf.get("NOTIFY_CHANNEL")})
    _log("retried", request, rows)
    selection.report(model_admin, request, f"Queued {len(rows)} to run now", len(rows))
