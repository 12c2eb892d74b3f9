"""The periodic schedules page: each schedule the database remembers, with links to its jobs.

Read-only: a schedule is declared in code or settings, and its row is
written only by the workers' tick statement (an edit here would be undone,
or worse, move ``last_tick`` backwards). Next ticks are computed from the
database clock. With no schedule yet, the page says how to declare one
(templates/admin/leasejobs/periodicschedule/change_list.html).
"""

import datetime as dt
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from leasejobs.db.rows import periodic_key_prefix
from leasejobs.models import PeriodicSchedule
from leasejobs.periodic.status import db_now
from leasejobs.periodic.ticks import ScheduleError, next_tick, zone


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "task_name",
        "cron",
        "timezone",
        "last_tick",
        "next_tick",
        "last_job",
        "jobs",
        "enqueued",
        "skipped",
    ]
    search_fields = ["name", "task_name"]
    ordering = ["name"]

    class Media:
        css = {"all": ["leasejobs/admin.css"]}

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        return super().changelist_view(request, {"title": "Periodic schedules", **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> Any:
        self._now = db_now()
        return super().get_queryset(request)

    @admin.display(description="next tick (its zone)")
    def next_tick(self, obj: PeriodicSchedule) -> str:
        try:
            tz = zone(obj.timezone)
            upcoming = next_tick(obj.cron, tz, max(getattr(self, "_now", obj.last_tick), obj.last_tick))
        except (ScheduleError, ValueError):
            return "-"
        return _local(upcoming, tz) if upcoming else "-"

    @admin.display(description="last job")
    def last_job(self, obj: PeriodicSchedule) -> str:
        if not obj.last_job_id:
            return "-"
        url = reverse("admin:leasejobs_job_change", args=[obj.last_job_id])
        return format_html('<a href="{}">#{}</a>', url, obj.last_job_id)

    @admin.display(description="jobs")
    def jobs(self, obj: PeriodicSchedule) -> str:
        query = urlencode({"idempotency_key__startswith": periodic_key_prefix(obj.name)})
        return format_html('<a href="{}?{}">all jobs</a>', reverse("admin:leasejobs_job_changelist"), query)

    def _never(self, request: HttpRequest, obj: Any = None) -> bool:
        """Rows are written by the workers' tick statement only (see the module's docstring)."""
        return False

    has_add_permission = has_change_permission = has_delete_permission = _never


def _local(when: dt.datetime, tz: Any) -> str:
    return f"{when.astimezone(tz):%Y-%m-%d %H:%M:%S %Z} ({when:%H:%M:%S} UTC)"
