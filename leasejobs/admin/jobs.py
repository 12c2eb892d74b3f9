"""The job and side-effect admins: lease state at a glance, read-only pages, fenced actions.

Nothing here writes through a model form: a job page is read-only (a form
save would write a whole row read moments earlier over a worker's heartbeat
or finish), and the only writes are the fenced actions of
``leasejobs.admin.actions``. The changelist stays a handful of queries on a
table of millions of rows: an estimated count, no ``SELECT DISTINCT`` over
the table, the bulky JSON columns deferred, and the default order (-id)
served by the primary key index.
"""

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.db.models import F, Func, Q, QuerySet, TextField, Value
from django.db.models.functions import Left, Now
from django.http import HttpRequest
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from leasejobs.admin import actions, lease, retry_matching
from leasejobs.admin.filters import LeaseStateFilter, QueueFilter
from leasejobs.admin.paginator import EstimatedCountPaginator
from leasejobs.errors import read_entries
from leasejobs.models import Job, SideEffect, Slot

#: Columns the changelist never shows; left unread so a page of 100 jobs
#: does not carry their arguments, results and tracebacks.
HEAVY_COLUMNS = ("args", "kwargs", "result", "errors", "worker_ids", "last_error")

#: How much of the last error's first line the changelist shows.
ERROR_HEAD_CHARS = 160

#: The largest id a search term may be (bigint).
MAX_ID = 2**63 - 1


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
    list_display = [
        "id",
        "task_name",
        "queue_display",
        "status_display",
        "attempt_display",
        "lease_display",
        "heartbeat_display",
        "run_at_display",
        "error_display",
    ]
    list_display_links = ["id", "task_name"]
    empty_value_display = "—"
    list_filter = ["status", QueueFilter, LeaseStateFilter]
    search_fields = ["task_name", "idempotency_key"]
    search_help_text = "A job id, an exact idempotency key, or else part of a task name."
    # Only the primary key has an index fit for ordering a big table.
    sortable_by = ["id"]
    actions = [actions.retry_now, actions.cancel, actions.release_lease]
    inlines = [SideEffectInline]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "task_name",
                    "queue",
                    "priority",
                    "status_display",
                    "idempotency_key",
                    "concurrency_display",
                ]
            },
        ),
        (
            "Lease",
            {
                "fields": [
                    "lease_display",
                    "attempt_display",
                    "leased_by",
                    "heartbeat_display",
                    "lease_until",
                    "heartbeat_at",
                    "cancel_requested",
                    "worker_ids_display",
                ]
            },
        ),
        ("Times", {"fields": ["created_at", "run_at", "started_at", "finished_at"]}),
        ("Arguments and result", {"fields": ["args_display", "kwargs_display", "result_display"]}),
        ("Errors", {"fields": ["last_error_display", "errors_display"]}),
    ]
    readonly_fields = flatten_fieldsets(fieldsets)

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
        return [retry_failed, *super().get_urls()]

    # -- rows -----------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {"title": "Jobs", "can_retry_failed": self.has_change_permission(request)}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        return lease.annotate(super().get_queryset(request))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """A job id or an exact idempotency key (both indexed), else part of a task name.

        The task-name match reads the table; it is tried only when no job has
        the term as its key, so a key search stays an index lookup.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and int(term) <= MAX_ID:
            return queryset.filter(Q(pk=int(term)) | Q(idempotency_key=term)), False
        if Job.objects.filter(idempotency_key=term).exists():
            return queryset.filter(idempotency_key=term), False
        return queryset.filter(task_name__icontains=term), False

    # -- columns --------------------------------------------------------------

    def action_checkbox(self, obj: Job) -> SafeString:
        """The row's checkbox, plus the state it was shown in, for fenced actions."""
        return format_html(
            '{}<input type="hidden" name="{}" value="{}">',
            super().action_checkbox(obj),
            actions.SEEN_FIELD,
            actions.seen_token(obj),
        )

    @admin.display(description="queue")
    def queue_display(self, obj: Job) -> SafeString:
        """The queue, linking to the list of its jobs."""
        return format_html(
            '<a href="?{}">{}</a>', urlencode({QueueFilter.parameter_name: obj.queue}), obj.queue
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

    @admin.display(description="attempt (token)")
    def attempt_display(self, obj: Job) -> str:
        return f"{obj.attempt} / {obj.max_attempts}"

    @admin.display(description="lease")
    def lease_display(self, obj: Job) -> SafeString:
        return lease.cell(obj)

    @admin.display(description="heartbeat")
    def heartbeat_display(self, obj: Job) -> str:
        return lease.heartbeat(obj)

    @admin.display(description="run at")
    def run_at_display(self, obj: Job) -> SafeString:
        """When it is (or was) due, relative to the database clock; the date on hover."""
        return format_html('<span title="{}">{}</span>', obj.run_at.isoformat(), lease.relative(obj.run_in))  # type: ignore[attr-defined]

    @admin.display(description="last error")
    def error_display(self, obj: Job) -> str:
        head: str = obj.error_head  # type: ignore[attr-defined]  # annotated by get_queryset()
        return head[:ERROR_HEAD_CHARS] + "…" if len(head) > ERROR_HEAD_CHARS else head

    # -- the job page ---------------------------------------------------------

    @admin.display(description="args")
    def args_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description="workers, by attempt")
    def worker_ids_display(self, obj: Job) -> SafeString:
        return format_html_join(
            "", "<div>attempt {}: {}</div>", ((n, w) for n, w in enumerate(obj.worker_ids or [], start=1))
        )

    @admin.display(description="last error")
    def last_error_display(self, obj: Job) -> SafeString:
        return format_html('<pre class="leasejobs-traceback">{}</pre>', obj.last_error)

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
                for e in read_entries(obj.errors)
                if isinstance(e, dict)  # the column is JSON: anyone with SQL may have put anything there
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
