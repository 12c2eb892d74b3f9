"""The overview's charts over time: four queries over the jobs table, closed buckets stored.

Each query reads only what two partial indexes serve: the jobs finished in
the window (``leasejobs_job_finished``) and the active jobs (``leasejobs_job_claim``),
so its cost follows the jobs of the window, not the table's history
(docs/admin.md has the timings at 1,000,000 rows). Buckets come from the
database clock (``date_bin``, PostgreSQL 14+); every bucket is returned, empty
ones as zero.

- throughput: jobs finished (done, failed or cancelled) and failed per bucket,
  by ``finished_at``, as a rate per minute;
- queue time: p50 and p95 of ``started_at - run_at`` (from due to the claim of
  the attempt that finished) of the jobs finished in each bucket;
- backlog: jobs queued and due at the end of each bucket, by queue. A job is
  in the backlog from ``max(run_at, created_at)`` until its latest claim
  (``started_at``), or until it was cancelled; an earlier attempt's wait is
  not kept by the table, so a retried job counts from its retry's ``run_at``;
- leases lost: attempts that ended with no outcome of their own (lease
  expired and taken over, or given back at shutdown), counted when the job
  was next claimed. The table keeps one error entry per failed attempt, so
  these are ``attempt`` minus the attempts accounted for.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from leasejobs.db import facade


@dataclass(frozen=True)
class Window:
    name: str
    label: str
    span: timedelta
    step: timedelta


WINDOWS = {
    "hour": Window("hour", "last hour, per minute", timedelta(hours=1), timedelta(minutes=1)),
    "day": Window("day", "last day, per 15 minutes", timedelta(days=1), timedelta(minutes=15)),
}


#: Each query's value columns, as series names (the backlog's series are its queues).
SERIES = {"throughput": ("finished", "failed"), "queue_time": ("p50", "p95"), "leases_lost": ("lost",)}


def run(name: str, step: timedelta, since: datetime) -> list[tuple[datetime, str, float | None]]:
    """Chart query ``name`` from bucket ``since`` to now, as (bucket, series, value) points."""
    rows = facade.chart_rows(name, {"step": step, "since": since})
    if name == "backlog":
        return [(t, queue, float(n)) for t, queue, n in rows]
    return [(r[0], series, r[k]) for r in rows for k, series in enumerate(SERIES[name], 1)]


def points(name: str, window: Window) -> tuple[list[datetime], dict[str, dict[datetime, float | None]]]:
    """The window's bucket starts, and each series' values by bucket.

    Closed buckets are computed once and stored (``leasejobs_chartpoint``);
    each call computes only the buckets not stored yet and the current one,
    so a page that refreshes every few seconds reads a minute or a quarter
    of an hour of jobs, not a day of them. A closed bucket does not change:
    jobs finish (and are claimed) on the database clock, now, in the
    current bucket.
    """
    step_seconds = int(window.step.total_seconds())
    with facade.chart_transaction() as cursor:
        current = facade.current_bucket(cursor, window.step)
        count = int(window.span / window.step)
        times = [current - window.step * (count - 1 - i) for i in range(count)]
        stored = facade.read_points(
            cursor, {"chart": name, "step_seconds": step_seconds, "first": times[0], "current": current}
        )
        known = {t for t, _, _ in stored}
        missing = [t for t in times[:-1] if t not in known]
        fresh = run(name, window.step, missing[0] if missing else current)
        closed = [(t, series, v) for t, series, v in fresh if t < current and t not in known]
        marks = [(t, "", None) for t in missing]
        if missing:
            new = closed + marks
            facade.write_points(
                cursor,
                {
                    "chart": name,
                    "step_seconds": step_seconds,
                    "ts": [p[0] for p in new],
                    "series": [p[1] for p in new],
                    "values": [p[2] for p in new],
                },
            )
    values: dict[str, dict[datetime, float | None]] = {}
    for t, series, v in [*stored, *fresh]:
        if series:
            values.setdefault(series, {})[t] = v
    return times, values


@dataclass
class Series:
    label: str
    values: list[float | None]


@dataclass
class Chart:
    """One chart's data, ready to draw: bucket starts, and one or more series."""

    key: str
    title: str
    unit: str
    times: list[datetime]
    series: list[Series]


def build(window: Window) -> list[Chart]:
    """The four charts of the overview for ``window``."""
    per_minute = window.step / timedelta(minutes=1)

    def chart(key: str, title: str, unit: str, scale: float = 1.0, zero: float | None = 0.0) -> Chart:
        times, values = points(key, window)
        series = []
        for label in SERIES.get(key) or sorted(values):
            by_t = values.get(label, {})
            column = [by_t.get(t, zero) for t in times]
            series.append(Series(label, [None if v is None else v / scale for v in column]))
        return Chart(key, title, unit, times, series)

    return [
        chart("throughput", "Jobs finished and failed", "jobs per minute", scale=per_minute),
        chart("queue_time", "Queue time (due to claim)", "seconds", zero=None),
        chart("backlog", "Queued backlog by queue", "jobs due, not yet claimed"),
        chart("leases_lost", "Leases lost", "attempts"),
    ]
