"""The queue controls in the admin: pause and resume, and limits changed at run time.

One row per controlled queue (``leasejobs_queue``). Saving a queue's limits
here makes them win over ``LEASEJOBS["QUEUES"]`` from then on, brings its
numbered places in line (``controls.make_slots``) and wakes its workers. The
changelist shows what the claim sees right now: places in use under the
concurrency limit and claims in the current rate window.
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest

from leasejobs import controls
from leasejobs.models import Queue

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
            limits = controls.Limits(None, self.instance.rate_count, self.instance.rate_seconds)
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
        rate = controls.Limits(None, obj.rate_count, obj.rate_seconds).rate
        return "—" if rate is None else f"{obj.rate_used} of {rate}"  # type: ignore[attr-defined]

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        controls.make_slots(obj.name)
