"""The overview page: the queue at a glance, refreshed by the page itself.

Every number comes from the database clock, in a few small queries that stay
cheap on a big table:

- jobs by queue and status: queued (due / later) and running, exactly, over
  the rows the claim's partial index covers; finished jobs (done, failed,
  cancelled) over the last 15 minutes only, through the partial index on
  ``finished_at`` — a total over all history would be a full-table scan;
- leases: held, expiring soon and expired (see ``leasejobs.admin.lease``),
  with the expired jobs listed, oldest first;
- the age of the oldest due job, per queue;
- throughput: jobs finished in the last 1, 5 and 15 minutes;
- workers: each row of ``leasejobs_worker`` (live while its heartbeat is
  younger than ``workers.STALE_AFTER`` intervals, late after that, until a
  starting worker forgets it a day later), with the jobs it holds, and any
  holder of a held lease that has no row (a worker of an older version);
  the card counts the same rows as the table;
- stuck jobs: expired leases (the holder stopped heartbeating) and late
  heartbeats (a lease with under a third left: the holder missed at least
  one), oldest first;
- queue controls: each controlled queue, paused or not, its limits, the
  places in use under its concurrency limit and its claims in the current
  rate window (``leasejobs.admin.queues.controlled``);
- charts over the last hour or day (``?window=hour|day``), see
  ``leasejobs.admin.charts``, below all of the above.
"""

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from leasejobs.admin import charts, lease, svgchart
from leasejobs.admin.queues import controlled
from leasejobs.db import facade
from leasejobs.models import UNFINISHED, Job, JobOverview

#: Throughput windows, in minutes; the largest also bounds the finished counts.
WINDOWS = (1, 5, 15)

#: How many expired leases, and how many late heartbeats, the page lists.
EXPIRED_SHOWN = 20

#: Seconds between refreshes by default; ``?refresh=N`` changes it, 0 stops it.
REFRESH_SECONDS = 5

FINISHED = [Job.Status.DONE, Job.Status.FAILED, Job.Status.CANCELLED]


@dataclass
class QueueRow:
    """One queue's line of the overview."""

    queue: str
    due: int = 0
    later: int = 0
    running: int = 0
    held: int = 0
    expiring: int = 0
    expired: int = 0
    oldest_due_age: dt.timedelta | None = None
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED, 0))

    @property
    def oldest_due(self) -> str:
        return "" if self.oldest_due_age is None else lease.human(self.oldest_due_age)

    @property
    def done(self) -> int:
        return self.finished[Job.Status.DONE]

    @property
    def failed(self) -> int:
        return self.finished[Job.Status.FAILED]

    @property
    def cancelled(self) -> int:
        return self.finished[Job.Status.CANCELLED]


def _ago(minutes: int) -> Any:
    return Now() - dt.timedelta(minutes=minutes)


def _active_by_queue() -> QuerySet:
    due = Q(status=Job.Status.QUEUED, run_at__lte=Now())
    return (
        Job.objects.filter(UNFINISHED)
        .values("queue")
        .annotate(
            due=Count("id", filter=due),
            later=Count("id", filter=Q(status=Job.Status.QUEUED, run_at__gt=Now())),
            running=Count("id", filter=Q(status=Job.Status.RUNNING)),
            held=Count("id", filter=lease.state_q(lease.HELD)),
            expiring=Count("id", filter=lease.state_q(lease.EXPIRING)),
            expired=Count("id", filter=lease.state_q(lease.EXPIRED)),
            oldest_due_age=Now() - Min("run_at", filter=due),
        )
        .order_by("queue")
    )


def _finished_by_queue() -> QuerySet:
    return (
        Job.objects.filter(status__in=FINISHED, finished_at__gte=_ago(max(WINDOWS)))
        .values("queue", "status")
        .annotate(n=Count("id"))
        .order_by()
    )


@dataclass(frozen=True)
class WorkerRow:
    """One worker of the overview's table."""

    worker_id: str
    hostname: str
    jobs: int
    beat_age: dt.timedelta
    interval: float | None
    live: bool

    @property
    def last_heartbeat(self) -> str:
        return f"{lease.human(self.beat_age)} ago"

    @property
    def late_note(self) -> str:
        """Why a worker is flagged: it beats every N s and has not for longer than STALE_AFTER beats."""
        if self.live or self.interval is None:
            return ""
        return f"late: it beats every {self.interval:g} s"


def _workers() -> list[WorkerRow]:
    # Django's default database, as before the move (not LEASEJOBS["DATABASE"]).
    rows = facade.worker_rows(DEFAULT_DB_ALIAS)
    return [
        WorkerRow(w, host, jobs, age or dt.timedelta(0), interval, live)
        for w, host, jobs, age, interval, live in rows
    ]


def _stuck() -> list[Job]:
    """The oldest expired leases and the oldest late heartbeats, EXPIRED_SHOWN of each, in one query."""
    columns = (
        "id",
        "task_name",
        "queue",
        "status",
        "attempt",
        "leased_by",
        "lease_until",
        "cancel_requested",
    )

    def oldest(state: str) -> QuerySet[Job]:
        return (
            lease.annotate(Job.objects.filter(lease.state_q(state)))
            .only(*columns)
            .order_by("lease_until")[:EXPIRED_SHOWN]
        )

    jobs = list(oldest(lease.EXPIRED).union(oldest(lease.EXPIRING), all=True))
    return sorted(jobs, key=lambda job: (job.lease_until is not None, job.lease_until, job.pk))


def _state(job: Job) -> str:
    state: str = getattr(job, "lease_state", lease.NONE)  # annotated by lease.annotate()
    return state


def snapshot() -> dict[str, Any]:
    """Everything the overview shows, read in one go."""
    rows: dict[str, QueueRow] = {}
    for r in _active_by_queue():
        rows[r["queue"]] = QueueRow(**r)
    for r in _finished_by_queue():
        rows.setdefault(r["queue"], QueueRow(queue=r["queue"])).finished[r["status"]] = r["n"]
    queues = [rows[q] for q in sorted(rows)]

    throughput = Job.objects.filter(status__in=FINISHED, finished_at__gte=_ago(max(WINDOWS))).aggregate(
        **{f"m{m}": Count("id", filter=Q(finished_at__gte=_ago(m))) for m in WINDOWS},
        failed=Count("id", filter=Q(status=Job.Status.FAILED)),
    )
    workers = _workers()
    stuck = _stuck()
    states = controlled()
    oldest = [q for q in queues if q.oldest_due_age is not None]
    return {
        "queues": queues,
        "totals": {
            "due": sum(q.due for q in queues),
            "later": sum(q.later for q in queues),
            "running": sum(q.running for q in queues),
            "held": sum(q.held for q in queues),
            "expiring": sum(q.expiring for q in queues),
            "expired": sum(q.expired for q in queues),
        },
        "oldest_due": max(oldest, key=lambda q: q.oldest_due_age or dt.timedelta(0)) if oldest else None,
        "throughput": [(m, throughput[f"m{m}"], throughput[f"m{m}"] / m) for m in WINDOWS],
        "failed_recently": throughput["failed"],
        "workers": workers,
        "live_workers": sum(1 for w in workers if w.live),
        "late_workers": sum(1 for w in workers if not w.live),
        "holding_workers": sum(1 for w in workers if w.jobs),
        "expired": [(job, lease.cell(job)) for job in stuck if _state(job) == lease.EXPIRED],
        "late": [(job, lease.cell(job)) for job in stuck if _state(job) == lease.EXPIRING],
        "controls": states,
        "paused": {state.name for state in states if state.paused},
    }


class JobPagesAdmin(admin.ModelAdmin):
    """Pages about jobs (the overview, the workflows): whoever may view or change jobs may
    view them, by the job model's permissions; nothing is added, changed or deleted here."""

    def may(self, request: HttpRequest, actions: tuple[str, ...]) -> bool:
        """Whether the user has one of ``actions``' permissions on jobs."""
        job = Job._meta
        return any(
            request.user.has_perm(f"{job.app_label}.{get_permission_codename(action, job)}")
            for action in actions
        )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.may(request, ("view", "change"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(JobOverview)
class OverviewAdmin(JobPagesAdmin):
    """Serves the overview at the proxy model's changelist URL, for whoever may view jobs."""

    def get_urls(self) -> list[URLPattern]:
        # The name the admin index links a model's entry to.
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.overview_view), name=name)]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            refresh = max(0, int(request.GET.get("refresh", REFRESH_SECONDS)))
        except ValueError:
            refresh = REFRESH_SECONDS
        window = charts.WINDOWS.get(request.GET.get("window", ""), charts.WINDOWS["hour"])
        context = {
            **self.admin_site.each_context(request),
            "chart_window": window,
            "chart_windows": list(charts.WINDOWS.values()),
            "charts": [svgchart.render(chart) for chart in charts.build(window)],
            "title": "Queue overview",
            "opts": self.opts,
            "job_opts": Job._meta,
            "refresh": refresh,
            "windows": WINDOWS,
            "expired_shown": EXPIRED_SHOWN,
            **snapshot(),
        }
        return TemplateResponse(request, "admin/leasejobs/overview.html", context)
