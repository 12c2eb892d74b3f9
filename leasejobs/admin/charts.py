"""The overview's charts over time: four queries over the jobs table, no table of their own.

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
from typing import Any

from django.db import connections, transaction

from leasejobs.conf import db_alias


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

#: Every bucket start from ``since`` (a bucket start) to now, oldest first; the last
#: one is the current, still open bucket.
_BUCKETS = """
buckets AS (SELECT generate_series(%(since)s::timestamptz, now(), %(step)s) AS t)"""

#: The start of the current bucket, on the database clock.
CURRENT_BUCKET = "SELECT date_bin(%(step)s, now(), TIMESTAMPTZ '2000-01-01')"

THROUGHPUT = f"""
WITH {_BUCKETS},
agg AS (
    SELECT date_bin(%(step)s, finished_at, TIMESTAMPTZ '2000-01-01') AS t,
           count(*) AS finished, count(*) FILTER (WHERE status = 'failed') AS failed
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
    GROUP BY 1
)
SELECT b.t, COALESCE(a.finished, 0), COALESCE(a.failed, 0)
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

QUEUE_TIME = f"""
WITH {_BUCKETS},
agg AS (
    SELECT date_bin(%(step)s, finished_at, TIMESTAMPTZ '2000-01-01') AS t,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (
               ORDER BY extract(epoch FROM started_at - run_at)) AS p
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
      AND started_at IS NOT NULL
    GROUP BY 1
)
SELECT b.t, a.p[1], a.p[2]
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

#: The jobs that can matter to a window: active now, or finished within it.
_RECENT = """
recent AS (
    SELECT queue, status, run_at, created_at, started_at, finished_at, attempt, errors, last_error
    FROM leasejobs_job WHERE status IN ('queued', 'running')
    UNION ALL
    SELECT queue, status, run_at, created_at, started_at, finished_at, attempt, errors, last_error
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
)"""

BACKLOG = f"""
WITH {_BUCKETS}, {_RECENT},
spans AS (
    SELECT queue, GREATEST(run_at, created_at) AS enter,
           CASE WHEN status = 'queued' THEN 'infinity'::timestamptz
                WHEN started_at >= GREATEST(run_at, created_at) THEN started_at
                ELSE COALESCE(finished_at, 'infinity'::timestamptz) END AS leave
    FROM recent
),
events AS (
    SELECT queue, GREATEST(date_bin(%(step)s, enter, TIMESTAMPTZ '2000-01-01'),
                           (SELECT min(t) FROM buckets)) AS t, 1 AS d
    FROM spans WHERE enter <= now() AND leave > (SELECT min(t) FROM buckets) AND leave > enter
    UNION ALL
    SELECT queue, date_bin(%(step)s, leave, TIMESTAMPTZ '2000-01-01'), -1
    FROM spans WHERE enter <= now() AND leave > (SELECT min(t) FROM buckets) AND leave > enter
                 AND leave <= now()
),
per_bucket AS (SELECT queue, t, sum(d) AS d FROM events GROUP BY queue, t),
queues AS (SELECT DISTINCT queue FROM per_bucket)
SELECT b.t, q.queue,
       sum(COALESCE(p.d, 0)) OVER (PARTITION BY q.queue ORDER BY b.t)::int AS backlog
FROM buckets AS b CROSS JOIN queues AS q
LEFT JOIN per_bucket AS p ON p.queue = q.queue AND p.t = b.t
ORDER BY q.queue, b.t
"""

LEASES_LOST = f"""
WITH {_BUCKETS}, {_RECENT},
agg AS (
    SELECT date_bin(%(step)s, started_at, TIMESTAMPTZ '2000-01-01') AS t,
           sum(GREATEST(0, attempt - jsonb_array_length(errors)
                           - CASE WHEN status = 'queued' THEN 0 ELSE 1 END)
               + CASE WHEN status = 'failed' AND last_error LIKE 'lease expired on the last attempt%%'
                      THEN 1 ELSE 0 END) AS lost
    FROM recent
    WHERE started_at >= (SELECT min(t) FROM buckets)
    GROUP BY 1
)
SELECT b.t, COALESCE(a.lost, 0)::int
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

QUERIES = {"throughput": THROUGHPUT, "queue_time": QUEUE_TIME, "backlog": BACKLOG, "leases_lost": LEASES_LOST}


#: Each query's value columns, as series names (the backlog's series are its queues).
SERIES = {"throughput": ("finished", "failed"), "queue_time": ("p50", "p95"), "leases_lost": ("lost",)}

#: Stored points of closed buckets: (chart, step, bucket) rows; a bucket with
#: no data is stored as one row with series '' so it is not computed again.
READ_POINTS = """
SELECT t, series, value FROM leasejobs_chartpoint
WHERE chart = %(chart)s AND step_seconds = %(step_seconds)s AND t >= %(first)s AND t < %(current)s
"""
WRITE_POINTS = """
INSERT INTO leasejobs_chartpoint (chart, step_seconds, t, series, value)
SELECT %(chart)s, %(step_seconds)s, p.t, p.series, p.value
FROM unnest(%(ts)s::timestamptz[], %(series)s::text[], %(values)s::float8[]) AS p(t, series, value)
ON CONFLICT (chart, step_seconds, t, series) DO NOTHING
"""
#: Points are kept two days: the longest window is one.
FORGET_POINTS = "DELETE FROM leasejobs_chartpoint WHERE t < now() - interval '2 days'"


def run(name: str, step: timedelta, since: datetime) -> list[tuple[datetime, str, float | None]]:
    """Chart query ``name`` from bucket ``since`` to now, as (bucket, series, value) points."""
    with connections[db_alias()].cursor() as cursor:
        params: dict[str, Any] = {"step": step, "since": since}
        cursor.execute(QUERIES[name], params)
        rows = cursor.fetchall()
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
    with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
        # Compiling these short queries (JIT) costs more than it saves: 12 ms of 95 at 1M rows.
        cursor.execute("SET LOCAL jit = off")
        step: dict[str, Any] = {"step": window.step}
        cursor.execute(CURRENT_BUCKET, step)
        current = cursor.fetchone()[0]
        count = int(window.span / window.step)
        times = [current - window.step * (count - 1 - i) for i in range(count)]
        cursor.execute(
            READ_POINTS, {"chart": name, "step_seconds": step_seconds, "first": times[0], "current": current}
        )
        stored = cursor.fetchall()
        known = {t for t, _, _ in stored}
        missing = [t for t in times[:-1] if t not in known]
        fresh = run(name, window.step, missing[0] if missing else current)
        closed = [(t, series, v) for t, series, v in fresh if t < current and t not in known]
        marks = [(t, "", None) for t in missing]
        if missing:
            new = closed + marks
            cursor.execute(
                WRITE_POINTS,
                {
                    "chart": name,
                    "step_seconds": step_seconds,
                    "ts": [p[0] for p in new],
                    "series": [p[1] for p in new],
                    "values": [p[2] for p in new],
                },
            )
            cursor.execute(FORGET_POINTS)
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
