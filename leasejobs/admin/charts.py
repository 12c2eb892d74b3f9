"""The overview's charts over time: four queries over the jobs table, closed buckets stored.

Which buckets are stored, and by whom: ``leasejobs.db.chartpoints``.

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

from leasejobs.db import chartpoints, facade
from leasejobs.db.chartpoints import SERIES, WINDOWS, Window

__all__ = ["SERIES", "WINDOWS", "Chart", "Series", "Window", "build", "points"]


def points(name: str, window: Window) -> tuple[list[datetime], dict[str, dict[datetime, float | None]]]:
    """The window's bucket starts, and each series' values by bucket (``chartpoints.points``).

    Closed buckets are computed once and stored (``leasejobs_chartpoint``),
    by the first page that needs them or, as they close, by a running
    worker (``leasejobs.worker.charts``); each call computes only the
    buckets not stored yet and the current one.
    """
    with facade.chart_transaction() as cursor:
        return chartpoints.points(cursor, name, window)


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
