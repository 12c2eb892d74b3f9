"""The Queues page: every queue that has jobs, with its controls (pause, limits).

A queue runs unpaused and unlimited until it has a row in ``leasejobs_queue``;
pausing it or adding a row with limits is how it is controlled. The page
lists the union of those rows and of the queues with jobs queued, running or
finished in the last 15 minutes (the rows the claim's partial index and the
``finished_at`` index cover: no scan of the table's history), each with a
Pause or Resume button and a link to set its limits (a new row, or its own).
It shows what the claim sees right now: places in use under the concurrency
limit and claims in the current rate window.

Saving a queue's limits here makes them win over ``LEASEJOBS["QUEUES"]``
from then on, brings its numbered places in line (``controls.make_places``)
and wakes its workers. The Pause and Resume actions of Django's action form
still answer a POST (scripts, older pages).
"""

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from leasejobs.db import facade
from leasejobs.models import UNFINISHED, Job, Queue
from leasejobs.queues import controls

#: A queue whose jobs all finished longer ago than this is left off the page (unless controlled).
RECENT = dt.timedelta(minutes=15)

#: Places of one kind held right now (the kind is a constant of this module, never user input).
_HELD = (
    "(SELECT count(*) FROM leasejobs_slot AS s WHERE s.kind = '%s' "
    "AND s.name = leasejobs_queue.name AND s.held_until >= now())"
)


class QueueForm(forms.ModelForm):
    """Limits as an operator writes them: a concurrency and a rate such as ``100/m``."""

    rate = forms.CharField(
        required=False, help_text="Most claims per window: 100/m, 20/10s, 5/s. Empty: none."
    )

    class Meta:
        model = Queue
        fields = ["name", "paused", "concurrency"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["name"].disabled = True
            limits = controls.ConcurrencyAndRate(None, self.instance.rate_count, self.instance.rate_seconds)
            self.initial["rate"] = limits.rate or ""

    def clean_concurrency(self) -> int | None:
        value = self.cleaned_data.get("concurrency")
        if value is not None:
            try:
                controls.parse_concurrency(value)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return value

    def clean_rate(self) -> tuple[int, float] | None:
        text = (self.cleaned_data.get("rate") or "").strip()
        if not text:
            return None
        try:
            return controls.parse_rate(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def save(self, commit: bool = True) -> Queue:
        queue: Queue = super().save(commit=False)
        rate = self.cleaned_data.get("rate")
        queue.rate_count, queue.rate_seconds = rate if rate else (None, None)
        if {"concurrency", "rate"} & set(self.changed_data):
            queue.limits_from_settings = False
        if commit:
            queue.save()
        return queue


def _set_paused(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue], paused: bool
) -> None:
    names = list(queryset.values_list("name", flat=True))
    for name in names:
        (controls.pause_queue if paused else controls.resume_queue)(name)
    modeladmin.message_user(
        request, f"{'Paused' if paused else 'Resumed'}: {', '.join(names)}.", messages.SUCCESS
    )


@admin.action(description="Pause the selected queues (running jobs finish)")
def pause(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
    _set_paused(modeladmin, request, queryset, True)


@admin.action(description="Resume the selected queues")
def resume(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
    _set_paused(modeladmin, request, queryset, False)


@dataclass(frozen=True)
class Control:
    """A controlled queue (a row of ``leasejobs_queue``) and what the claim sees of its limits now."""

    name: str
    paused: bool
    limits: controls.ConcurrencyAndRate
    limits_from_settings: bool
    running: int  # concurrency places held now
    rate_used: int  # claims in the current rate window


def controlled() -> list[Control]:
    """Every controlled queue, with its places in use and its rate used right now."""
    return [
        Control(name, paused, controls.ConcurrencyAndRate(conc, count, secs), from_settings, running, used)
        for name, paused, conc, count, secs, from_settings, running, used in facade.queue_controls()
    ]


def _used_of(used: int, limit: int | str | None) -> str:
    """A cell of the queue page: "3 of 4" (places or claims used of the limit), "—" without one."""
    return "—" if limit is None else f"{used} of {limit}"


@dataclass
class QueueLine:
    """One queue of the page: its jobs now, and its controls (None: it has no row)."""

    name: str
    due: int = 0
    later: int = 0
    running: int = 0
    finished: int = 0
    control: Control | None = None

    @property
    def paused(self) -> bool:
        return self.control is not None and self.control.paused

    @property
    def concurrency(self) -> str:
        control = self.control
        return _used_of(control.running, control.limits.concurrency) if control else "—"

    @property
    def rate(self) -> str:
        control = self.control
        return _used_of(control.rate_used, control.limits.rate) if control else "—"

    @property
    def limits_from(self) -> str:
        if self.control is None or self.control.limits == controls.ConcurrencyAndRate():
            return "no limits"
        return "settings" if self.control.limits_from_settings else "changed at run time"


def queue_lines() -> list[QueueLine]:
    """Every controlled queue and every queue with jobs queued, running or recently finished."""
    lines: dict[str, QueueLine] = {}
    due = Q(status=Job.Status.QUEUED, run_at__lte=Now())
    active = (
        Job.objects.filter(UNFINISHED)
        .values("queue")
        .annotate(
            due=Count("id", filter=due),
            later=Count("id", filter=Q(status=Job.Status.QUEUED, run_at__gt=Now())),
            running=Count("id", filter=Q(status=Job.Status.RUNNING)),
        )
        .order_by()
    )
    for row in active:
        lines[row["queue"]] = QueueLine(row["queue"], row["due"], row["later"], row["running"])
    finished = (
        Job.objects.filter(
            status__in=[Job.Status.DONE, Job.Status.FAILED, Job.Status.CANCELLED],
            finished_at__gte=Now() - RECENT,
        )
        .values("queue")
        .annotate(n=Count("id"))
        .order_by()
    )
    for done in finished:
        lines.setdefault(done["queue"], QueueLine(done["queue"])).finished = done["n"]
    for control in controlled():
        lines.setdefault(control.name, QueueLine(control.name)).control = control
    return [lines[name] for name in sorted(lines)]


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    form = QueueForm
    list_display = ["name", "paused", "concurrency_display", "rate_display", "limits_from_settings"]
    actions = [pause, resume]
    fields = ["name", "paused", "concurrency", "rate", "limits_from_settings"]
    readonly_fields = ["limits_from_settings"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Queue]:
        """Each queue with its places in use and its claims in the current rate window."""
        queues: QuerySet[Queue] = (
            super()
            .get_queryset(request)
            .annotate(in_use=RawSQL(_HELD % "concurrency", []), rate_used=RawSQL(_HELD % "rate", []))
        )
        return queues

    @admin.display(description="Running / concurrency")
    def concurrency_display(self, obj: Queue) -> str:
        return "—" if obj.concurrency is None else f"{obj.in_use} of {obj.concurrency}"  # type: ignore[attr-defined]

    @admin.display(description="Claims in window / rate")
    def rate_display(self, obj: Queue) -> str:
        rate = controls.ConcurrencyAndRate(None, obj.rate_count, obj.rate_seconds).rate
        return "—" if rate is None else f"{obj.rate_used} of {rate}"  # type: ignore[attr-defined]

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        controls.make_places(obj.name)

    def get_urls(self) -> list[URLPattern]:
        set_paused = path(
            "set-paused/",
            self.admin_site.admin_view(self.set_paused_view),
            name="leasejobs_queue_set_paused",
        )
        return [set_paused, *super().get_urls()]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """Every queue with its controls; a POST of Django's action form goes to Django's changelist."""
        if request.method == "POST":
            return super().changelist_view(request, extra_context)
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "opts": self.opts,
            "lines": queue_lines(),
            "recent_minutes": int(RECENT.total_seconds() // 60),
            "can_change": self.has_change_permission(request),
            "can_add": self.has_add_permission(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/leasejobs/queue/queues.html", context)

    def set_paused_view(self, request: HttpRequest) -> HttpResponse:
        """POST name, paused=1|0: pause or resume one queue (a row is made if it has none)."""
        back = reverse("admin:leasejobs_queue_changelist", current_app=self.admin_site.name)
        if request.method != "POST":
            return HttpResponseRedirect(back)
        if not self.has_change_permission(request):
            raise PermissionDenied
        name = request.POST.get("name", "")
        paused = request.POST.get("paused") == "1"
        try:
            (controls.pause_queue if paused else controls.resume_queue)(name)
        except ValueError as exc:
            self.message_user(request, f"Nothing was changed: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        done = (
            f"Paused {name}: its queued jobs wait, its running jobs finish."
            if paused
            else f"Resumed {name}: its workers were woken."
        )
        self.message_user(request, done, messages.SUCCESS)
        return HttpResponseRedirect(back)
