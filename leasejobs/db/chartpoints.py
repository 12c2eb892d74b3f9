"""The overview charts' points: each closed bucket computed once from the jobs, then stored.

A chart over a window (the last hour per minute, the last day per 15
minutes) is its stored closed buckets (``leasejobs_chartpoint``), the closed
buckets not stored yet, and the current bucket, which is always read from
the jobs. A closed bucket does not change (jobs finish and are claimed on
the database clock, now, in the current bucket), so whoever needs it first
computes it and stores it for everyone after: the admin's overview
(``leasejobs.admin.charts``, on Django's connection) or a worker, as the
bucket closes (``keep``, on its vacuum thread's connection, see
``leasejobs.worker.charts``). Computing a day of buckets at once reads the
day's ~330,000 finished jobs at 10M jobs a month: about a second for the
four charts, which a page must not pay (docs/scaling.md, issue 32); a
worker that stores each bucket as it closes reads a minute's or a quarter
of an hour's jobs at a time instead.

Every function takes a DB-API cursor inside an open transaction: Django's
cursor and a psycopg cursor both do, as the statements
(``leasejobs.db.sql.charts``) are the same on both.
"""

import datetime as dt
from dataclasses import dataclass
from typing import Any

from leasejobs.db.sql import charts as sql

#: (bucket start, series, value); series '' marks a bucket computed with no data.
Point = tuple[dt.datetime, str, float | None]


@dataclass(frozen=True)
class Window:
    name: str
    label: str
    span: dt.timedelta
    step: dt.timedelta

    @property
    def step_seconds(self) -> int:
        return int(self.step.total_seconds())


WINDOWS = {
    "hour": Window("hour", "last hour, per minute", dt.timedelta(hours=1), dt.timedelta(minutes=1)),
    "day": Window("day", "last day, per 15 minutes", dt.timedelta(days=1), dt.timedelta(minutes=15)),
}

#: The charts, by the name their points are stored under.
CHARTS = tuple(sql.QUERIES)

#: Each query's value columns, as series names (the backlog's series are its queues).
SERIES = {"throughput": ("finished", "failed"), "queue_time": ("p50", "p95"), "leases_lost": ("lost",)}


def run(cursor: Any, name: str, step: dt.timedelta, since: dt.datetime) -> list[Point]:
    """Chart query ``name`` from bucket ``since`` to now, as (bucket, series, value) points."""
    cursor.execute(sql.QUERIES[name], {"step": step, "since": since})
    rows = cursor.fetchall()
    if name == "backlog":
        return [(t, queue, float(n)) for t, queue, n in rows]
    return [(r[0], series, r[k]) for r in rows for k, series in enumerate(SERIES[name], 1)]


def bucket(cursor: Any, step: dt.timedelta) -> dt.datetime:
    """The start of the current bucket, on the database clock."""
    return _start(cursor, sql.BUCKET_AGO, {"step": step, "ago": dt.timedelta(0)})


def unsettled_bucket(cursor: Any, step: dt.timedelta, settled: dt.timedelta) -> dt.datetime:
    """The start of the first bucket that may still change (``sql.UNSETTLED_BUCKET``)."""
    return _start(cursor, sql.UNSETTLED_BUCKET, {"step": step, "ago": settled})


def _start(cursor: Any, statement: str, params: dict[str, dt.timedelta]) -> dt.datetime:
    """A bucket start, in UTC: the worker's connection answers in the server's time zone,
    where subtracting whole steps would follow the wall clock across a change of summer time."""
    cursor.execute(statement, params)
    start: dt.datetime = cursor.fetchone()[0]
    return start.astimezone(dt.UTC)


def bucket_times(window: Window, current: dt.datetime) -> list[dt.datetime]:
    """The window's bucket starts, oldest first, ending with ``current``."""
    count = int(window.span / window.step)
    return [current - window.step * (count - 1 - i) for i in range(count)]


def _stored(cursor: Any, name: str, window: Window, times: list[dt.datetime]) -> list[Point]:
    cursor.execute(
        sql.READ_POINTS,
        {"chart": name, "step_seconds": window.step_seconds, "first": times[0], "current": times[-1]},
    )
    rows: list[Point] = cursor.fetchall()
    return rows


def _compute(
    cursor: Any, name: str, window: Window, times: list[dt.datetime], known: set[dt.datetime]
) -> list[Point]:
    """Read the buckets from the first of ``times[:-1]`` not in ``known`` to now, store the
    closed ones among them (those before ``times[-1]``), and return what was read."""
    missing = [t for t in times[:-1] if t not in known]
    fresh = run(cursor, name, window.step, missing[0] if missing else times[-1])
    if missing:
        closed = [(t, series, v) for t, series, v in fresh if t < times[-1] and t not in known]
        new = closed + [(t, "", None) for t in missing]
        cursor.execute(
            sql.WRITE_POINTS,
            {
                "chart": name,
                "step_seconds": window.step_seconds,
                "ts": [p[0] for p in new],
                "series": [p[1] for p in new],
                "values": [p[2] for p in new],
            },
        )
        cursor.execute(sql.FORGET_POINTS)
    return fresh


def points(
    cursor: Any, name: str, window: Window
) -> tuple[list[dt.datetime], dict[str, dict[dt.datetime, float | None]]]:
    """The window's bucket starts, and each series' values by bucket.

    Each call computes only the closed buckets not stored yet (and stores
    them) and the current one, so a page that refreshes every few seconds
    reads a minute or a quarter of an hour of jobs, not a day of them.
    """
    cursor.execute(sql.JIT_OFF)
    times = bucket_times(window, bucket(cursor, window.step))
    stored = _stored(cursor, name, window, times)
    fresh = _compute(cursor, name, window, times, {t for t, _, _ in stored})
    values: dict[str, dict[dt.datetime, float | None]] = {}
    for t, series, v in [*stored, *fresh]:
        if series:
            values.setdefault(series, {})[t] = v
    return times, values


def keep(cursor: Any, settled: dt.timedelta) -> int | None:
    """Store every chart's closed buckets of every window that are not stored yet; how many
    buckets that was (0: none missing), or None when another transaction keeps them now.

    A bucket counts as closed here once it has been closed for ``settled``
    and every transaction open on the database that this role can see began
    after its end: a job enqueued or finished by a transaction that began
    before the bucket's end commits after it, and a bucket stored before that
    commit would miss it for good (a request that enqueues and then waits on
    a slow API, a paused worker in mid-finish). Its statements give up on a
    lock after a second (``sql.KEEP_BOUNDS``): the points table locked by a
    migration fails the step, never the vacuum thread that runs it. Under a
    transaction-level advisory lock, taken without
    waiting: of many workers looking at the same moment, one does the work
    and the others see it done at their next look. Run right after each
    bucket closes, it reads that bucket's jobs only (and the current
    bucket's, and the active jobs, as a page's refresh does); after a gap
    (no worker ran, or a fresh install) it reads from the first bucket
    missing, once.
    """
    cursor.execute(sql.KEEP_LOCK)
    if not cursor.fetchone()[0]:
        return None
    cursor.execute(sql.KEEP_BOUNDS)
    cursor.execute(sql.JIT_OFF)
    computed = 0
    for window in WINDOWS.values():
        times = bucket_times(window, unsettled_bucket(cursor, window.step, settled))
        for name in CHARTS:
            known = {t for t, _, _ in _stored(cursor, name, window, times)}
            missing = [t for t in times[:-1] if t not in known]
            if missing:
                _compute(cursor, name, window, times, known)
                computed += len(missing)
    return computed
