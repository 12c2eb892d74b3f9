"""The job and side-effect admins: lease state at a glance, read-only pages, fenced actions.

Nothing here writes through a model form: a job page is read-only (a form
save would write a whole row read moments earlier over a worker's heartbeat
or finish), and the only writes are the fenced actions of
``leasejobs.admin.actions``. The changelist stays a handful of queries on a
table of millions of rows: an estimated count, no ``SELECT DISTINCT`` over
the table, the bulky JSON columns deferred, and the default order (-id)
served by the primary key index.
"""

import datetime as dt
import json
import re
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import F, Func, Q, QuerySet, TextField, Value
from django.db.models.functions import Left, Now
from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from leasejobs.admin import actions, job_page, lease, page_actions, retry_matching, steps, task_search
from leasejobs.admin.filters import LeaseStateFilter, QueueFilter
from leasejobs.admin.paginator import EstimatedCountPaginator
from leasejobs.models import Job, SideEffect, Slot

#: Columns the changelist never shows; left unread so a page of 100 jobs
#: does not carry their arguments, results and tracebacks.
HEAVY_COLUMNS = ("args", "kwargs", "result", "errors", "worker_ids", "last_error")

#: How much of the last error's first line the changelist shows.
ERROR_HEAD_CHARS = 160

#: The largest id a search term may be (bigint).
MAX_ID = 2**63 - 1


def short_task_name(name: str) -> str:
    """The last part of a dotted task name (``shop.tasks.send_receipt`` -> ``send_receipt``).

    The module path is what makes a changelist row too wide to read; the
    function's name is what an operator recognises, and the full name is
    on hover and on the job's page.
    """
    return name.rsplit(".", 1)[-1] or name


def breakable(duration: str) -> SafeString:
    """'42 min 30 s ago' that a narrow column may break between its parts, never inside one.

    Each number stays with its unit, so at 1280 px the column takes two
    short lines ('42 min 30 s' / 'ago') rather than pushing the last error
    off screen; the text reads the same.
    """
    return format_html_join(
        " ",
        "{}",
        ((format_html('<span class="leasejobs-nobr">{}</span>', part),) for part in _PARTS.findall(duration)),
    )


#: The parts of a short duration: '42 min', '30 s', 'ago', 'in', 'now', '—'.
_PARTS = re.compile(r"\d+ \w+|\S+")


def pretty_json(value: Any) -> SafeString:
    """JSON indented for reading, escaped (a ``<script>`` in an argument stays text)."""
    return format_html(
        '<pre class="leasejobs-json">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )


class JobChangeList(ChangeList):
    """The changelist's rows: lease state from the database clock, heavy columns left out."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Job]:
        first_line = Func(
            F("last_error"), Value("\n"), Value(1), function="split_part", output_field=TextField()
        )
        queryset: QuerySet[Job] = (
            super()
            .get_queryset(request, *args, **kwargs)
            .defer(*HEAVY_COLUMNS)
            .annotate(error_head=Left(first_line, ERROR_HEAD_CHARS + 1))
        )
        return queryset


class SideEffectInline(admin.TabularInline):
    model = SideEffect
    fields = readonly_fields = ("key", "fencing_token", "data_display", "created_at")
    extra = 0
    can_delete = False
    verbose_name = "side effect (with the fencing token of the attempt that recorded it)"
    verbose_name_plural = "side effects (each with the fencing token of the attempt that recorded it)"

    def get_queryset(self, request: HttpRequest) -> QuerySet[SideEffect]:
        return super().get_queryset(request).order_by("id")

    def has_add_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    @admin.display(description="data")
    def data_display(self, obj: SideEffect) -> SafeString:
        return pretty_json(obj.data)


class BigTableAdmin(admin.ModelAdmin):
    """What both tables need to stay fast and safe at millions of rows.

    No full count (an estimated one, no "N total", no facet counts, which
    would COUNT the table once per filter choice); newest first by the
    primary key index; nothing added or deleted by hand: jobs come from
    enqueue and leave through pruning, and a side effect's key is the
    dedupe memory that must outlive its job.
    """

    ordering = ["-id"]
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(BigTableAdmin):
    # What an operator scans for, left to right: which job, in what state,
    # who holds it and whether it heartbeats, when it is due, what went
    # wrong. The queue rides under the task and the error takes the width
    # left, so the row fits at 1280 px with the sidebar open (docs/admin.md).
    list_display = [
        "id",
        "task_display",
        "status_display",
        "lease_display",
        "heartbeat_display",
        "run_at_display",
        "attempt_display",
        "error_display",
    ]
    list_display_links = ["id"]
    empty_value_display = "—"
    list_filter = ["status", QueueFilter, LeaseStateFilter]
    search_fields = ["task_name", "idempotency_key"]
    search_help_text = (
        "A job id, an exact idempotency key, a task's full name, or part of the name of a task "
        "this project registers, schedules or runs often."
    )
    # Only the primary key has an index fit for ordering a big table.
    sortable_by = ["id"]
    actions = [actions.retry_now, actions.cancel, actions.release_lease]
    inlines = [SideEffectInline]
    # A job's page shows the sections of leasejobs.admin.job_page for that
    # job (get_fieldsets); these are all the fields any page may show.
    readonly_fields = job_page.ALL_FIELDS
    change_form_template = "admin/leasejobs/job/change_form.html"

    class Media:
        css = {"all": ["leasejobs/admin.css"]}

    # -- permissions: read-only pages, actions for whoever may change jobs ----

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # The change permission unlocks the actions (asked without obj); a
        # job's own page stays read-only for everyone (asked with obj).
        return obj is None and super().has_change_permission(request)

    def get_urls(self) -> list[URLPattern]:
        retry_failed = path(
            "retry-failed/",
            self.admin_site.admin_view(lambda request: retry_matching.view(self, request)),
            name="leasejobs_job_retry_failed",
        )
        act = path(
            "<path:object_id>/act/",
            self.admin_site.admin_view(
                lambda request, object_id: page_actions.view(self, request, object_id)
            ),
            name="leasejobs_job_act",
        )
        return [retry_failed, act, *super().get_urls()]

    # -- rows -----------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {"title": "Jobs", "can_retry_failed": self.has_change_permission(request)}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # db_now: the database clock of the read, for a job page's durations.
        return lease.annotate(super().get_queryset(request)).annotate(db_now=Now())

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A job id or an exact idempotency key (both indexed), else a task name or part of one.

        The task-name search is tried only when no job has the term as its
        key; it matches the names the project knows (``task_search``) and
        finds their jobs through the task-name bloom index, never by reading
        the whole table.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and int(term) <= MAX_ID:
            return queryset.filter(Q(pk=int(term)) | Q(idempotency_key=term)), False
        if Job.objects.filter(idempotency_key=term).exists():
            return queryset.filter(idempotency_key=term), False
        return task_search.by_task_name(queryset, term), False

    # -- columns --------------------------------------------------------------

    def action_checkbox(self, obj: Job) -> SafeString:
        """The row's checkbox, plus the state it was shown in, for fenced actions."""
        return format_html(
            '{}<input type="hidden" name="{}" value="{}">',
            super().action_checkbox(obj),
            actions.SEEN_FIELD,
            actions.seen_token(obj),
        )

    @admin.display(description="task · queue")
    def task_display(self, obj: Job) -> SafeString:
        """The task's own name, linking to the job (the full dotted path on hover), and its queue below.

        The queue links to the list of its jobs.
        """
        url = reverse("admin:leasejobs_job_change", args=[obj.pk], current_app=self.admin_site.name)
        return format_html(
            '<a class="leasejobs-task" href="{}" title="{}">{}</a>'
            ' <span class="leasejobs-queue"><a href="?{}">{}</a></span>',
            url,
            obj.task_name,
            short_task_name(obj.task_name),
            urlencode({QueueFilter.parameter_name: obj.queue}),
            obj.queue,
        )

    @admin.display(description="status")
    def status_display(self, obj: Job) -> SafeString:
        return format_html(
            '<span class="leasejobs-status leasejobs-status-{}">{}</span>',
            obj.status,
            obj.get_status_display(),
        )

    @admin.display(description="concurrency key")
    def concurrency_display(self, obj: Job) -> str:
        """The key a job waits on, its limit, and how many of its places are held now."""
        if obj.concurrency_key is None:
            return "—"
        held = Slot.objects.filter(kind="key", name=obj.concurrency_key, held_until__gte=Now()).count()
        return f"{obj.concurrency_key}: {held} of {obj.concurrency_limit} running"

    @admin.display(description="workflow")
    def workflow_display(self, obj: Job) -> SafeString | str:
        """A link to the page of the job's workflow, and the parents it still waits for."""
        if obj.workflow_id is None:
            return "—"
        waiting = f" (waits for {obj.pending_parents} parent job{'s' if obj.pending_parents != 1 else ''})"
        return format_html(
            '<a href="{}">workflow #{}</a>{}',
            reverse("admin:leasejobs_workflow_change", args=[obj.workflow_id]),
            obj.workflow_id,
            waiting if obj.pending_parents and obj.status == Job.Status.QUEUED else "",
        )

    @admin.display(description="attempt")
    def attempt_display(self, obj: Job) -> str:
        return f"{obj.attempt} / {obj.max_attempts}"

    @admin.display(description="lease")
    def lease_display(self, obj: Job) -> SafeString:
        return lease.cell(obj)

    @admin.display(description="heartbeat")
    def heartbeat_display(self, obj: Job) -> SafeString:
        return breakable(lease.heartbeat(obj))

    @admin.display(description="run at")
    def run_at_display(self, obj: Job) -> SafeString:
        """When it is (or was) due, relative to the database clock; the time to the second on hover."""
        run_in: dt.timedelta | None = obj.run_in  # type: ignore[attr-defined]  # annotated by get_queryset()
        return format_html(
            '<span title="{}">{}</span>', job_page.stamp(obj.run_at), breakable(lease.relative(run_in))
        )

    @admin.display(description="last error")
    def error_display(self, obj: Job) -> SafeString | str:
        """The first line of the last error, on one line cut to the column's width; all of it on hover."""
        head: str = obj.error_head  # type: ignore[attr-defined]  # annotated by get_queryset()
        if not head:
            return ""
        text = head[:ERROR_HEAD_CHARS] + "…" if len(head) > ERROR_HEAD_CHARS else head
        return format_html('<span class="leasejobs-error-head" title="{}">{}</span>', text, text)

    # -- the job page ---------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        if obj is None:
            return [(None, {"fields": job_page.ALL_FIELDS})]
        return job_page.fieldsets(obj)

    def get_inline_instances(self, request: HttpRequest, obj: Job | None = None) -> list[Any]:
        """The side effects, only for a job that recorded some (no empty table)."""
        if obj is None or not SideEffect.objects.filter(job_id=obj.pk).exists():
            return []
        return super().get_inline_instances(request, obj)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> Any:
        if obj is not None:
            context = {
                **context,
                "title": f"Job {obj.pk}: {obj.task_name}",
                "subtitle": None,
                "leasejobs_buttons": job_page.buttons(obj) if self.has_change_permission(request) else [],
                "leasejobs_seen": actions.seen_token(obj),
                "leasejobs_confirm_field": actions.CONFIRM_FIELD,
                "leasejobs_ask": actions.ASK,
            }
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.display(description="last error")
    def last_error_display(self, obj: Job) -> SafeString:
        return format_html('<pre class="leasejobs-traceback">{}</pre>', obj.last_error)

    @admin.display(description="traceback")
    def traceback_display(self, obj: Job) -> SafeString | str:
        """The traceback of the attempt that failed the job."""
        entry = job_page.last_entry(obj)
        if entry is None:
            return ""
        return format_html(
            '<p>attempt {} on {}: <strong>{}</strong></p><pre class="leasejobs-traceback">{}</pre>',
            entry.get("attempt", "?"),
            entry.get("worker_id", "?"),
            entry.get("exception_class", ""),
            entry.get("traceback", ""),
        )

    @admin.display(description="cancel requested")
    def cancel_requested_display(self, obj: Job) -> str:
        if not obj.cancel_requested:
            return "no"
        if obj.status == Job.Status.RUNNING:
            return "yes: the worker's next heartbeat asks the body to stop"
        return "yes"

    @admin.display(description="times")
    def times_display(self, obj: Job) -> SafeString:
        return job_page.times_table(obj)

    @admin.display(description="attempts")
    def timeline_display(self, obj: Job) -> SafeString:
        return job_page.timeline(obj)

    @admin.display(description="steps, sleeps and waits")
    def steps_display(self, obj: Job) -> SafeString:
        return steps.table(obj, job_page.db_now(obj))

    @admin.display(description="args")
    def args_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description="tracebacks, by attempt")
    def errors_display(self, obj: Job) -> SafeString:
        return format_html_join(
            "",
            '<div class="leasejobs-error"><strong>attempt {} on {}: {}</strong>'
            '<pre class="leasejobs-traceback">{}</pre></div>',
            (
                (
                    e.get("attempt", "?"),
                    e.get("worker_id", "?"),
                    e.get("exception_class", ""),
                    e.get("traceback", ""),
                )
                for e in job_page.entries(obj)
            ),
        )


@admin.register(SideEffect)
class SideEffectAdmin(BigTableAdmin):
    list_display = ["key", "job_link", "fencing_token", "created_at"]
    search_fields = ["key"]
    search_help_text = "The start of a key, or a job id."
    sortable_by = ["key"]
    fields = readonly_fields = ("key", "job_link", "fencing_token", "data_display", "created_at")

    def has_change_permission(self, request: HttpRequest, obj: SideEffect | None = None) -> bool:
        return False

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[SideEffect], search_term: str
    ) -> tuple[QuerySet[SideEffect], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        q = Q(key__startswith=term)
        if term.isdigit() and int(term) <= MAX_ID:
            q |= Q(job_id=int(term))
        return queryset.filter(q), False

    @admin.display(description="job", ordering="job_id")
    def job_link(self, obj: SideEffect) -> SafeString | str:
        if obj.job_id is None:
            return "— (job pruned)"
        url = reverse("admin:leasejobs_job_change", args=[obj.job_id], current_app=self.admin_site.name)
        return format_html('<a href="{}">#{}</a>', url, obj.job_id)

    @admin.display(description="data")
    def data_display(self, obj: SideEffect) -> SafeString:
        return pretty_json(obj.data)
