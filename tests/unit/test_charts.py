"""The overview's charts: what each query finds, their cache, who fills it, and the page that draws them."""

import datetime as dt
import re

import psycopg
import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from leasejobs.admin import charts
from leasejobs.db import chartpoints, facade
from leasejobs.models import ChartPoint, Job
from leasejobs.worker import charts as worker_charts
from leasejobs.worker.events import Events
from tests.helpers import database_url

pytestmark = pytest.mark.django_db

HOUR = charts.WINDOWS["hour"]


def ago(minutes: float) -> Now:
    return Now() - dt.timedelta(minutes=minutes)


def minute(t: dt.datetime) -> dt.datetime:
    """The one-minute bucket a time falls in."""
    return t.replace(second=0, microsecond=0)


def a_busy_hour() -> dict[str, Job]:
    finished = {"status": "done", "attempt": 1, "run_at": ago(5), "finished_at": ago(4.5)}
    for _ in range(3):
        Job.objects.create(task_name="t", started_at=ago(5) + dt.timedelta(seconds=4), **finished)
    failed = Job.objects.create(
        task_name="t", started_at=ago(5) + dt.timedelta(seconds=10), **{**finished, "status": "failed"}
    )
    # Attempt 3 after one failure: one attempt ended with no outcome (a lost lease), claimed 10 min ago.
    retried = Job.objects.create(
        task_name="t",
        status="done",
        attempt=3,
        errors=[{"attempt": 1}],
        run_at=ago(12),
        started_at=ago(10),
        finished_at=ago(9.5),
    )
    # Attempt 2 and no error entry at all (errors NULL): its first attempt lost its lease.
    lost = Job.objects.create(
        task_name="t", status="done", attempt=2, run_at=ago(9), started_at=ago(8), finished_at=ago(7.5)
    )
    # Two jobs due for 20 minutes in queue "mail", never claimed.
    for _ in range(2):
        Job.objects.create(task_name="t", queue="mail", run_at=ago(20))
    Job.objects.update(created_at=ago(30))
    jobs = {
        "failed": failed,
        "retried": retried,
        "lost": lost,
        "mail": Job.objects.filter(queue="mail").first(),
    }
    for job in jobs.values():
        job.refresh_from_db()
    return jobs


def test_each_chart_counts_what_happened_in_its_buckets():
    jobs = a_busy_hour()
    finished_at = minute(jobs["failed"].finished_at)
    times, values = charts.points("throughput", HOUR)
    assert len(times) == 60 and finished_at in times
    assert (values["finished"][finished_at], values["failed"][finished_at]) == (4, 1)
    assert sum(values["finished"].values()) == 6
    times, values = charts.points("queue_time", HOUR)
    assert values["p50"][finished_at] == pytest.approx(4.0)
    assert values["p95"][finished_at] == pytest.approx(9.1)
    times, values = charts.points("leases_lost", HOUR)
    assert values["lost"][minute(jobs["retried"].started_at)] == 1
    assert values["lost"][minute(jobs["lost"].started_at)] == 1
    assert sum(values["lost"].values()) == 2
    times, values = charts.points("backlog", HOUR)
    due = minute(jobs["mail"].run_at)
    mail = values["mail"]
    assert mail[due - dt.timedelta(minutes=1)] == 0 and mail[due] == 2 and mail[times[-1]] == 2
    # The retried job waited from its run_at (12 min ago) to its claim (10 min ago).
    retried = values["default"]
    assert retried[minute(jobs["retried"].run_at)] == 1
    assert retried[minute(jobs["retried"].started_at)] == 0


def test_a_job_whose_last_run_lost_its_lease_counts_as_a_lease_lost():
    """The claim that ends such a job writes 'lease expired on the last run (…)' and no
    error entry: each of its attempts lost its lease, the last one too."""
    job = Job.objects.create(
        task_name="t",
        status="failed",
        attempt=3,
        max_attempts=3,
        last_error="lease expired on the last run (3 of 3): worker w-1 stopped heartbeating",
        run_at=ago(9),
        started_at=ago(8),
        finished_at=ago(7),
    )
    job.refresh_from_db()
    _, values = charts.points("leases_lost", HOUR)
    assert values["lost"][minute(job.started_at)] == 3
    assert sum(values["lost"].values()) == 3


def test_closed_buckets_are_computed_once_and_kept():
    jobs = a_busy_hour()
    finished_at = minute(jobs["failed"].finished_at)
    charts.points("throughput", HOUR)
    stored = ChartPoint.objects.filter(chart="throughput", step_seconds=60)
    assert stored.filter(series="").count() == 59  # every closed bucket, marked as computed
    assert stored.get(series="finished", t=finished_at).value == 4
    # A job written into a closed bucket afterwards (only a hand-made row can) is not read again.
    Job.objects.create(task_name="t", status="done", run_at=ago(6), started_at=ago(6), finished_at=ago(4.5))
    _, values = charts.points("throughput", HOUR)
    assert values["finished"][finished_at] == 4


def test_the_overview_draws_four_labelled_charts_with_tables(admin_client):
    a_busy_hour()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_worker VALUES ('w-live', 'h', 1, now(), now(), 10), "
            "('w-dead', 'h', 2, now(), now() - interval '1 hour', 10)"
        )
    for window, label in (("", "last hour, per minute"), ("day", "last day, per 15 minutes")):
        page = admin_client.get(f"/admin/leasejobs/joboverview/?window={window}&refresh=0").content.decode()
        assert f"Over time: {label}" in page
        assert page.count('<svg class="leasejobs-chart"') == 4
        assert page.count('role="img"') == 4
        for title in (
            "Jobs finished and failed",
            "Queue time (due to claim)",
            "Queued backlog by queue",
            "Leases lost",
        ):
            assert f">{title}</title>" in page
            assert f"{title}: data table</summary>" in page
        assert ">jobs per minute</text>" in page and ">time (" in page
        assert "<polyline" in page
        assert re.search(r'"leasejobs-big">1</p>\s*<p>heartbeating; 0 holding a lease', page)


def _stored_by_chart(step_seconds: int) -> dict[str, set[dt.datetime]]:
    marks = ChartPoint.objects.filter(step_seconds=step_seconds, series="").values_list("chart", "t")
    found: dict[str, set[dt.datetime]] = {}
    for chart, t in marks:
        found.setdefault(chart, set()).add(t)
    return found


def _keep(settled: dt.timedelta = dt.timedelta(0)) -> int | None:
    with facade.chart_transaction() as cursor:
        return chartpoints.keep(cursor, settled)


def test_a_worker_stores_every_closed_bucket_with_the_values_a_page_computes_cold():
    """``keep`` (a worker's step) stores what the page would have computed and stored itself:
    the same points, so that the page, which then finds every closed bucket stored, reads
    only the current one and shows the same charts."""
    a_busy_hour()
    cold = [charts.build(w) for w in charts.WINDOWS.values()]
    by_page = set(ChartPoint.objects.values_list("chart", "step_seconds", "t", "series", "value"))
    ChartPoint.objects.all().delete()
    assert _keep() == 4 * (59 + 95)
    by_worker = set(ChartPoint.objects.values_list("chart", "step_seconds", "t", "series", "value"))
    assert by_worker == by_page
    assert _keep() == 0  # nothing left to store
    with CaptureQueriesContext(connection) as queries:
        warm = [charts.build(w) for w in charts.WINDOWS.values()]
    assert warm == cold
    # Each chart query of the page read from the current bucket only, and stored nothing.
    reads = [q["sql"] for q in queries.captured_queries if "generate_series" in q["sql"]]
    assert len(reads) == 8
    assert not [q for q in queries.captured_queries if "INSERT INTO leasejobs_chartpoint" in q["sql"]]


def test_a_worker_leaves_a_bucket_closed_less_than_settled_ago_to_its_next_look():
    """A job finished by a transaction that began before a bucket's end may commit after
    it: a worker stores a bucket only once it has been closed for ``settled``."""
    a_busy_hour()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT date_bin('1 minute', now() - interval '150 seconds', TIMESTAMPTZ '2000-01-01'), "
            "date_bin('1 minute', now(), TIMESTAMPTZ '2000-01-01')"
        )
        settled_bucket, current = cursor.fetchone()
    _keep(dt.timedelta(seconds=150))
    minutes = _stored_by_chart(60)
    assert set(minutes) == set(chartpoints.CHARTS)
    for stored in minutes.values():
        assert len(stored) == 59 and max(stored) == settled_bucket - dt.timedelta(minutes=1)
    _keep()  # later (here: with nothing to wait for), the rest
    assert all(max(stored) == current - dt.timedelta(minutes=1) for stored in _stored_by_chart(60).values())


def test_while_one_transaction_keeps_the_points_another_does_not_wait_nor_compute():
    a_busy_hour()
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('leasejobs_chartpoint'))")
        assert _keep() is None
        assert not ChartPoint.objects.exists()
        # Released here, not by closing the connection: the server lets a session's
        # locks go as its backend exits, which can be after the next statement.
        other.execute("SELECT pg_advisory_unlock(hashtext('leasejobs_chartpoint'))")
    assert _keep() == 4 * (59 + 95)


@pytest.mark.parametrize(
    ("clock", "seconds"),
    [
        ("12:00:03", 2.5),  # 11:59 closed 3 s ago: stored 5 s after its end (and half a second)
        ("12:00:05.5", 60.0),  # stored now: the next one, a minute on
        ("12:00:30", 35.5),
        ("12:00:00", 5.5),
    ],
)
def test_a_worker_looks_again_once_the_next_minute_has_settled(clock: str, seconds: float):
    at = dt.datetime.fromisoformat(f"2026-12-04T{clock}+00:00")
    assert worker_charts.next_look(at) == pytest.approx(seconds)


def test_a_failing_look_is_one_warning_then_a_try_a_minute_never_an_exception(monkeypatch, caplog):
    """The vacuum thread runs the keeper: an exception would end the worker (exit 70)."""
    calls: list[float] = []

    def fail(conn: object, settled: dt.timedelta) -> None:
        calls.append(clock[0])
        raise psycopg.OperationalError("the database is read-only")

    clock = [1000.0]
    monkeypatch.setattr(worker_charts.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(worker_charts.maintenance, "keep_chart_points", fail)
    keeper = worker_charts.ChartKeeper(object(), Events("w-1"))  # type: ignore[arg-type]
    for _ in range(3):
        keeper.tick()
        clock[0] += 30
    assert calls == [1000.0, 1060.0]
    assert caplog.text.count("cannot store the overview charts' closed buckets worker=w-1") == 1


def test_a_role_that_may_not_write_the_points_is_told_once_and_the_keeper_stops(monkeypatch, caplog):
    """docs/least-privilege.md's worker role has no grant on leasejobs_chartpoint: its
    worker says so once at INFO, and its vacuum thread stops asking."""

    def refuse(conn: object, settled: dt.timedelta) -> None:
        raise psycopg.errors.InsufficientPrivilege("permission denied for table leasejobs_chartpoint")

    monkeypatch.setattr(worker_charts.maintenance, "keep_chart_points", refuse)
    keeper = worker_charts.ChartKeeper(object(), Events("w-1"))  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="leasejobs.worker"):
        assert keeper.tick() is False
    assert "this worker does not store the overview charts' closed buckets worker=w-1" in caplog.text
    assert "GRANT SELECT, INSERT, DELETE ON leasejobs_chartpoint" in caplog.text
    assert "WARNING" not in caplog.text


def test_bucket_starts_are_in_utc_whatever_the_time_zone_of_the_connection():
    """A worker's own connection answers in the server's time zone; a window's buckets are
    whole steps back from the current one, which on a zone's wall clock would be off by an
    hour across a change of summer time. So bucket starts come back in UTC."""
    with psycopg.connect(database_url(), options="-c TimeZone=Europe/Berlin") as conn, conn.cursor() as cur:
        for start in (
            chartpoints.bucket(cur, dt.timedelta(minutes=1)),
            chartpoints.unsettled_bucket(cur, dt.timedelta(minutes=15), dt.timedelta(seconds=5)),
        ):
            assert start.tzinfo is dt.UTC
            assert start.second == 0 and start.microsecond == 0
