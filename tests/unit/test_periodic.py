"""Periodic jobs in one process: ticks and daylight saving, checks, catch-up bounds, overlap, jitter,
``leasejobs_periodic`` and the admin page. The multi-worker guarantees are in test_periodic_workers.py.
"""

import datetime as dt
import itertools
import time
from importlib.util import find_spec
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from leasejobs import periodic
from leasejobs.db.rows import tick_of_key
from leasejobs.jobs import registry
from leasejobs.jobs.discovery import discover
from leasejobs.models import Job, PeriodicSchedule
from leasejobs.periodic.checks import check_schedules
from leasejobs.periodic.scheduler import Scheduler
from leasejobs.periodic.schedules import load
from leasejobs.periodic.status import db_now
from leasejobs.periodic.ticks import jitter, latest_ticks, next_tick
from tests.testapp.tasks import add

STAMP = "tests.testapp.tasks.stamp"
UTC = dt.UTC


def local(zone: str, *args: int, fold: int = 0) -> dt.datetime:
    return dt.datetime(*args, tzinfo=ZoneInfo(zone), fold=fold)


def forward(cron: str, zone: str, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    ticks, t = [], start
    while (t := next_tick(cron, ZoneInfo(zone), t)) is not None and t <= end:
        ticks.append(t)
    return ticks


# -- daylight saving: Debian/Vixie cron's rules, on real transition dates ------------------------

DST_DAYS = [
    # zone, spring-forward day, fall-back day (2026)
    ("Europe/Paris", (2026, 3, 29), (2026, 10, 25)),
    ("America/New_York", (2026, 3, 8), (2026, 11, 1)),
]


@pytest.mark.parametrize(("zone", "spring", "autumn"), DST_DAYS)
def test_a_daily_0230_job_runs_once_on_the_spring_forward_and_the_fall_back_day(zone, spring, autumn):
    for day, expected_local in (
        # 02:30 does not exist: cron runs the job once, at the jump (03:00 new time).
        (spring, (3, 0)),
        # 02:30 happens twice: cron runs the job once, at the first.
        (autumn, (2, 30)),
    ):
        start = local(zone, *day, 0, 0)
        end = local(zone, *day, 23, 59)
        ticks = forward("30 2 * * *", zone, start.astimezone(UTC), end.astimezone(UTC))
        assert len(ticks) == 1, ticks
        on = ticks[0].astimezone(ZoneInfo(zone))
        assert (on.hour, on.minute) == expected_local
        assert on.fold == 0
        # Walking back from the day's end (what catch-up does) finds the same single tick.
        assert (
            latest_ticks("30 2 * * *", ZoneInfo(zone), start.astimezone(UTC), end.astimezone(UTC), 5) == ticks
        )


@pytest.mark.parametrize(("zone", "spring", "autumn"), DST_DAYS)
def test_an_hourly_job_follows_real_hours_across_both_transitions(zone, spring, autumn):
    for day, hours in ((spring, 23), (autumn, 25)):
        start = local(zone, *day, 0, 0).astimezone(UTC) - dt.timedelta(seconds=1)
        end = local(zone, *day, 23, 59).astimezone(UTC)
        ticks = forward("0 * * * *", zone, start, end)
        assert len(ticks) == hours
        assert all(b - a == dt.timedelta(hours=1) for a, b in itertools.pairwise(ticks))


def test_latest_ticks_walks_back_a_long_downtime_in_bounded_steps():
    until = dt.datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    after = until - dt.timedelta(days=365)
    ticks = latest_ticks("* * * * * *", ZoneInfo("UTC"), after, until, 100)
    assert len(ticks) == 100 and ticks[-1] == until and ticks == sorted(ticks)
    assert latest_ticks("* * * * *", ZoneInfo("UTC"), until - dt.timedelta(minutes=3), until, 10) == [
        dt.datetime(2026, 6, 1, 11, 58, tzinfo=UTC),
        dt.datetime(2026, 6, 1, 11, 59, tzinfo=UTC),
        dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
    ]


def test_jitter_is_the_same_for_every_worker_and_within_the_window():
    tick = dt.datetime(2026, 6, 1, 7, tzinfo=UTC)
    delays = {jitter("report", tick + dt.timedelta(minutes=i), 30) for i in range(50)}
    assert all(dt.timedelta(0) <= d < dt.timedelta(seconds=30) for d in delays)
    assert len(delays) > 40, "spread over the window"
    assert jitter("report", tick, 30) == jitter("report", tick, 30)
    assert jitter("report", tick, 0) == dt.timedelta(0)


def test_the_idempotency_key_names_schedule_and_tick():
    tick = dt.datetime(2026, 6, 1, 7, 0, tzinfo=UTC)
    (schedule,) = load_with([{"task": STAMP, "cron": "0 7 * * *", "name": "a:b"}])
    assert schedule.key(tick) == "periodic:a:b:2026-06-01T07:00:00Z"
    assert tick_of_key(schedule.key(tick)) == tick
    assert tick_of_key("receipt:42") is None and tick_of_key(None) is None


# -- declaring and checking ---------------------------------------------------------------------


def load_with(setting):
    from django.test import override_settings

    with override_settings(LEASEJOBS={"PERIODIC": setting}):
        found, errors = load()
    assert not errors, errors
    return found


@pytest.mark.parametrize(
    ("entry", "sentence"),
    [
        ({"task": STAMP, "cron": "61 * * * *"}, r"bad cron expression '61 \* \* \* \*' \(Bad minute\)"),
        (
            {"task": STAMP, "cron": "0 7 * * *", "timezone": "Mars/Olympus"},
            "unknown time zone 'Mars/Olympus'",
        ),
        ({"task": "nowhere.task", "cron": "0 7 * * *"}, "no registered task is named 'nowhere.task'"),
        (
            {"task": STAMP, "cron": "0 7 * * *", "catch_up": "some"},
            "catch_up must be one of latest, all, none",
        ),
        ({"task": STAMP, "cron": "0 7 * * *", "croon": 1}, "unknown key"),
        ({"task": STAMP, "cron": "0 7 * * *", "kwargs": {"seconds": object()}}, "must be JSON"),
        (
            {"task": STAMP, "cron": "0 7 * * *", "kwargs": {"secnds": 1}},
            r"The arguments do not fit tests.testapp.tasks.stamp\(seconds=0.0\): got an unexpected "
            "keyword argument 'secnds'; pass the arguments the function takes",
        ),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_at_start_in_one_sentence(settings, entry, sentence):
    settings.LEASEJOBS = {"PERIODIC": [entry]}
    errors = check_schedules()
    assert len(errors) == 1 and errors[0].id == "leasejobs.E010"
    assert errors[0].msg.count(". ") == 0 and errors[0].msg.endswith(".")
    with pytest.raises(SystemCheckError, match=sentence):
        call_command("check")


def test_two_schedules_may_not_share_a_name(settings):
    settings.LEASEJOBS = {
        "PERIODIC": [{"task": STAMP, "cron": "0 7 * * *"}, {"task": STAMP, "cron": "0 8 * * *"}]
    }
    (error,) = check_schedules()
    assert "Two periodic schedules are named 'tests.testapp.tasks.stamp'" in error.msg


def test_periodic_goes_above_task_and_declares_a_schedule_named_after_it(settings):
    settings.LEASEJOBS = {"PERIODIC": []}
    decorated = periodic("0 7 * * *", timezone="Europe/Paris", kwargs={"a": 1, "b": 2})(add)
    periodic("0 8 * * *", name="add-at-eight", args=[1, 2])(add)
    assert decorated is add
    by_name = {s.name: s for s in load()[0]}
    assert by_name[add.name].tz == ZoneInfo("Europe/Paris") and by_name[add.name].kwargs == {"a": 1, "b": 2}
    assert by_name["add-at-eight"].args == [1, 2] and by_name["add-at-eight"].task_name == add.name
    with pytest.raises(TypeError, match="put it above @task"):
        periodic("0 7 * * *")(lambda: None)


@pytest.mark.skipif(find_spec("django.tasks") is None, reason="Django Tasks need Django 6")
def test_a_django_task_is_scheduled_by_its_module_path(settings, db):
    # What a worker does at start (this test used to pass only after another
    # test of the same process had registered the Django Tasks).
    discover()
    settings.LEASEJOBS = {
        **settings.LEASEJOBS,
        "PERIODIC": [{"task": "tests.testapp.django_tasks.noop", "cron": "* * * * *", "name": "dj"}],
    }
    (schedule,) = load()[0]
    scheduler = Scheduler("test", [schedule])
    scheduler.run_due()
    PeriodicSchedule.objects.filter(name="dj").update(last_tick=db_now() - dt.timedelta(minutes=2))
    scheduler._clock = None  # a worker that comes back (re-reads its rows)
    scheduler.run_due()
    (job,) = Job.objects.filter(idempotency_key__startswith="periodic:dj:")
    assert job.task_name == "tests.testapp.django_tasks.noop"


# -- the scheduler's statement, in one process --------------------------------------------------


def scheduler_for(settings, **options):
    # A ``db`` test runs in one transaction, where the database's now() stays
    # at the transaction's start while the scheduler's clock estimate moves
    # on: within a second of a minute's end the two can straddle the next
    # tick. Workers run each statement in its own transaction, where they
    # cannot; the test starts clear of the boundary instead.
    second = time.time() % 60
    if second > 55:
        time.sleep(61 - second)
    registry.autodiscover()
    entry = {"task": STAMP, "cron": "* * * * *", "name": "minutely", **options}
    settings.LEASEJOBS = {**settings.LEASEJOBS, "PERIODIC": [entry]}
    scheduler = Scheduler("test-worker")
    scheduler.run_due()  # registers: a new schedule starts from now
    return scheduler


def come_back_after(scheduler, minutes):
    """As if every worker had been down for ``minutes``: the row's last tick is that old."""
    PeriodicSchedule.objects.filter(name="minutely").update(
        last_tick=db_now() - dt.timedelta(minutes=minutes)
    )
    scheduler._clock = None
    scheduler.run_due()


def jobs_of(name="minutely"):
    return list(Job.objects.filter(idempotency_key__startswith=f"periodic:{name}:").order_by("id"))


def test_catch_up_all_is_bounded_by_max_catch_up_and_in_tick_order(settings, db):
    scheduler = scheduler_for(settings, catch_up="all", max_catch_up=5)
    assert jobs_of() == [], "a new schedule does not fire for the past"
    come_back_after(scheduler, 30)
    jobs = jobs_of()
    ticks = [tick_of_key(j.idempotency_key) for j in jobs]
    assert len(jobs) == 5 and ticks == sorted(ticks)
    assert all(b - a == dt.timedelta(minutes=1) for a, b in itertools.pairwise(ticks))
    assert [j.run_at for j in jobs] == ticks
    row = PeriodicSchedule.objects.get(name="minutely")
    assert row.last_tick == ticks[-1] and row.last_job_id == jobs[-1].id and row.enqueued == 5
    # Running again at the same moment, as any other worker would, adds nothing.
    scheduler._clock = None
    scheduler.run_due()
    assert len(jobs_of()) == 5


def test_jitter_spreads_run_at_but_the_key_names_the_tick(settings, db):
    scheduler = scheduler_for(settings, catch_up="all", jitter_seconds=40)
    come_back_after(scheduler, 10)
    jobs = jobs_of()
    assert len(jobs) == 10
    delays = [(j.run_at - tick_of_key(j.idempotency_key)).total_seconds() for j in jobs]
    assert all(0 <= d < 40 for d in delays) and len(set(delays)) > 1


def test_scheduled_at_is_the_tick_and_none_for_other_jobs(settings, db, django_assert_num_queries):
    from leasejobs.jobs.context import JobContext

    scheduler = scheduler_for(settings)
    come_back_after(scheduler, 3)
    (job,) = jobs_of()
    ctx = JobContext(job_id=job.id, attempt=1, worker_id="w")
    assert ctx.scheduled_at == tick_of_key(job.idempotency_key) and ctx.scheduled_at.tzinfo is not None
    plain = add.enqueue(1, 2)
    assert JobContext(job_id=plain.id, attempt=1, worker_id="w").scheduled_at is None
    # A worker that read the key with the claim hands it over: no query then.
    told = JobContext(job_id=job.id, attempt=1, worker_id="w")
    told.note_idempotency_key(job.idempotency_key)
    with django_assert_num_queries(0):
        assert told.scheduled_at == ctx.scheduled_at


# -- seeing it ----------------------------------------------------------------------------------


def test_leasejobs_periodic_lists_schedules_and_runs_one_now(settings, db):
    scheduler = scheduler_for(settings, timezone="Europe/Paris")
    come_back_after(scheduler, 2)
    out = StringIO()
    call_command("leasejobs_periodic", stdout=out)
    text = out.getvalue()
    assert "minutely" in text and "cron '* * * * *' in Europe/Paris" in text
    assert "CET" in text and "UTC" in text and "queued" in text and "1 enqueued" in text
    out = StringIO()
    call_command("leasejobs_periodic", "--run", "minutely", stdout=out)
    assert "enqueued job" in out.getvalue()
    assert len(jobs_of()) == 2
    with pytest.raises(CommandError, match="no periodic schedule named 'nope' is declared"):
        call_command("leasejobs_periodic", "--run", "nope")
    # A schedule the database remembers but this code no longer declares.
    row = PeriodicSchedule.objects.get(name="minutely")
    PeriodicSchedule.objects.create(
        name="gone",
        task_name=STAMP,
        cron="0 3 * * *",
        timezone="UTC",
        signature="old",
        declared_at=row.declared_at,
        last_tick=row.last_tick,
    )
    out = StringIO()
    call_command("leasejobs_periodic", stdout=out)
    assert "gone\n" in out.getvalue() and "not declared by this code (removed?)" in out.getvalue()


def test_the_admin_lists_schedules_with_links_to_their_jobs(settings, admin_client):
    scheduler = scheduler_for(settings)
    come_back_after(scheduler, 2)
    add.enqueue(1, 2)
    page = admin_client.get("/admin/leasejobs/periodicschedule/").content.decode()
    assert "minutely" in page and "idempotency_key__startswith=periodic%3Aminutely%3A" in page
    (job,) = jobs_of()
    assert f"/admin/leasejobs/job/{job.id}/change/" in page
    listed = admin_client.get("/admin/leasejobs/job/?idempotency_key__startswith=periodic%3Aminutely%3A")
    assert listed.status_code == 200
    assert f"/admin/leasejobs/job/{job.id}/change/" in listed.content.decode()
    assert "tests.testapp.tasks.add" not in listed.content.decode()
