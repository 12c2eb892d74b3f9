"""Lease state of a job, computed by the database from its own clock.

A job's lease is judged against ``now()`` of the database, never against the
web server's clock, so the admin agrees with the claim statement about who
holds what. The states, each a ``Q`` usable both as a filter (index-friendly
conditions, no function of a column) and inside the ``lease_state``
annotation:

- ``held``: running and ``lease_until`` is in the future;
- ``expiring``: held, with less than a third of the job's own lease left.
  The lease length is ``lease_until`` less the latest renewal (the last
  heartbeat, or the claim before the first: ``RENEWED_AT``), each of which
  sets both in one statement, and a worker heartbeats every third of the
  lease by default, so a job in this state has missed at least one heartbeat;
- ``expired``: running and ``lease_until`` is past (or missing): the holder
  stopped heartbeating and any worker may take the job over;
- ``none``: not running, so nobody holds it.
"""

import datetime as dt

from django.db.models import Case, CharField, DurationField, ExpressionWrapper, F, Q, QuerySet, Value, When
from django.db.models.functions import Coalesce, Now
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from leasejobs.models import UNFINISHED, Job

HELD = "held"
EXPIRING = "expiring"
EXPIRED = "expired"
NONE = "none"

#: Filter choices, in the order an operator scans them.
CHOICES = [
    (HELD, "held"),
    (EXPIRING, "expiring soon (under 1/3 of its lease left)"),
    (EXPIRED, "expired"),
    (NONE, "none (not running)"),
]


#: When the lease was last set: the attempt's last heartbeat, or its claim
#: (``started_at``) before the first (a claim leaves ``heartbeat_at`` NULL).
RENEWED_AT = Coalesce(F("heartbeat_at"), F("started_at"))


def _duration(expression: object) -> ExpressionWrapper:
    return ExpressionWrapper(expression, output_field=DurationField())


def state_q(state: str) -> Q:
    """The condition for one lease state, as a filter the planner can use."""
    running = UNFINISHED & Q(status=Job.Status.RUNNING)
    held = running & Q(lease_until__gt=Now())
    if state == HELD:
        return held
    if state == EXPIRING:
        third_of_lease = _duration((F("lease_until") - RENEWED_AT) / 3)
        return held & Q(lease_until__lt=Now() + third_of_lease)
    if state == EXPIRED:
        # ~Q on a nullable column also matches NULL: a running row without a
        # lease is as unheld as an expired one.
        return running & ~Q(lease_until__gt=Now())
    if state == NONE:
        return ~running
    raise ValueError(f"unknown lease state {state!r}; known: {[c for c, _ in CHOICES]}")


def annotate(queryset: QuerySet[Job]) -> QuerySet[Job]:
    """Add ``lease_state``, ``lease_left``, ``heartbeat_age`` and ``run_in`` from the database clock."""
    return queryset.annotate(
        lease_state=Case(
            *(When(state_q(s), then=Value(s)) for s in (EXPIRING, HELD, EXPIRED)),
            default=Value(NONE),
            output_field=CharField(),
        ),
        lease_left=_duration(F("lease_until") - Now()),
        heartbeat_age=_duration(Now() - RENEWED_AT),
        run_in=_duration(F("run_at") - Now()),
    )


def human(delta: dt.timedelta) -> str:
    """A short duration for a glance: '12 s', '4 min 5 s', '2 h 3 min', '3 d 4 h'."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def cell(job: Job) -> SafeString:
    """The lease as one coloured cell of two short lines; needs the ``annotate`` columns.

    It reads as one sentence ("held by w-3f2a · 20 s left", "expired 40 s
    ago · last holder w-3f2a", then "· cancel requested" when one is
    pending): what a screen reader, a copy and the ``title`` shown on hover
    give. The stylesheet shows it as two lines, the state and holder first
    and the time (or the last holder) below, each cut short with an ellipsis
    rather than wrapped when the holder's name is long. Every value goes
    through ``format_html``, so a worker id holding markup is shown as text.
    """
    state = getattr(job, "lease_state", NONE)
    if state not in (HELD, EXPIRING, EXPIRED):
        return format_html('<span class="leasejobs-lease leasejobs-lease-none">{}</span>', "—")
    left: dt.timedelta | None = getattr(job, "lease_left", None)
    holder = job.leased_by or "?"
    # (class, text) of the first line's parts, then of the second's.
    if state == EXPIRED:
        first = [("state", f"expired {human(left)} ago" if left is not None else "expired (no lease)")]
        second = [("holder", f"last holder {holder}")]
    else:
        first = [("state", "held"), ("holder", f"by {holder}")]
        second = [("time", f"{human(left or dt.timedelta(0))} left")]
    if job.cancel_requested and job.status == Job.Status.RUNNING:
        second.append(("note", "· cancel requested"))
    return format_html(
        '<span class="leasejobs-lease leasejobs-lease-{}" title="{}">'
        '<span class="leasejobs-lease-line">{}</span> '
        '<span class="leasejobs-lease-line"><span class="leasejobs-lease-sep">·</span> {}</span></span>',
        state,
        " · ".join(" ".join(text for _, text in line) for line in (first, second)),
        _parts(first),
        _parts(second),
    )


def _parts(parts: list[tuple[str, str]]) -> SafeString:
    """Spans of one line of the lease cell, a space apart (so its text reads as a sentence)."""
    return format_html_join(" ", '<span class="leasejobs-lease-{}">{}</span>', parts)


def relative(delta: dt.timedelta | None) -> str:
    """'in 10 min' or '2 min ago' for a time ``delta`` away from now."""
    if delta is None:
        return "—"
    if abs(delta) < dt.timedelta(seconds=1):
        return "now"
    return f"in {human(delta)}" if delta > dt.timedelta(0) else f"{human(delta)} ago"


def heartbeat(job: Job) -> str:
    """Heartbeat age of a running job ('3 s ago'); '—' when nobody should beat."""
    age = getattr(job, "heartbeat_age", None)
    if job.status != Job.Status.RUNNING or age is None:
        return "—"
    return f"{human(age)} ago"
