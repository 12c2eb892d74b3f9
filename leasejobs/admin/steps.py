"""A job's durable steps on its admin page: what it completed, and the sleep or wait it is in.

One query per page (``facade.job_steps``), kept on the job object: the page
asks twice (whether to show the section, then the section).
"""

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from leasejobs.admin import lease
from leasejobs.db import facade
from leasejobs.models import Job

#: A result longer than this many bytes of JSON is shown by its size only.
SHOWN_BYTES = 300


@dataclass(frozen=True)
class StepRow:
    name: str
    kind: str
    attempt: int
    created_at: dt.datetime
    done_at: dt.datetime | None
    done: bool
    wake_at: dt.datetime | None
    event_key: str | None
    event_id: int | None
    result: str | None
    size: int | None


def rows(job: Job) -> list[StepRow]:
    """The job's steps, oldest first (read once per page)."""
    found: list[StepRow] | None = getattr(job, "_leasejobs_steps", None)
    if found is None:
        found = [StepRow(*row) for row in facade.job_steps(job.pk)]
        job._leasejobs_steps = found  # type: ignore[attr-defined]
    return found


def _when(moment: dt.datetime | None) -> str:
    return "—" if moment is None else f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S}"


def state(step: StepRow, now: dt.datetime) -> str:
    """What the step is: done, sleeping, waiting, received, timed out."""
    if step.kind == "step":
        return "done"
    if step.kind == "sleep":
        assert step.wake_at is not None
        verb = "sleeps" if step.wake_at > now else "slept"
        return f"{verb} until {_when(step.wake_at)} ({lease.relative(step.wake_at - now)})"
    if not step.done:
        until = "no timeout" if step.wake_at is None else f"times out {_when(step.wake_at)}"
        return f"waits for event {step.event_key!r} ({until})"
    if step.event_id is None:
        return f"timed out waiting for event {step.event_key!r}"
    return f"received event {step.event_key!r} (#{step.event_id})"


def _result(step: StepRow) -> Any:
    if step.result is None:
        return "—"
    if (step.size or 0) > SHOWN_BYTES:
        return f"{step.size} bytes of JSON"
    return format_html("<code>{}</code>", json.dumps(json.loads(step.result), ensure_ascii=False))


def now_in(job: Job, now: dt.datetime) -> str:
    """The sleep or wait a queued job is in, in words; '' when it is in none."""
    if job.status != Job.Status.QUEUED:
        return ""
    for step in rows(job):
        if step.kind == "wait" and not step.done:
            return f"waiting at {step.name!r}: {state(step, now)}"
    for step in rows(job):
        if step.kind == "sleep" and step.wake_at is not None and step.wake_at > now and job.run_at > now:
            return f"sleeping at {step.name!r}: {state(step, now)}"
    return ""


def table(job: Job, now: dt.datetime) -> SafeString:
    """The steps as a table: name, kind, state, when, by which attempt, result or its size."""
    current = now_in(job, now)
    return format_html(
        '{}<table class="leasejobs-steps"><thead><tr><th>step</th><th>kind</th><th>state</th>'
        "<th>written</th><th>done</th><th>by attempt</th><th>result</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        format_html("<p><strong>Now {}</strong></p>", current) if current else "",
        format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    s.name,
                    s.kind,
                    state(s, now),
                    _when(s.created_at),
                    _when(s.done_at),
                    s.attempt,
                    _result(s),
                )
                for s in rows(job)
            ),
        ),
    )
