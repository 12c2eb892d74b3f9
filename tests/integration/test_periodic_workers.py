"""Periodic jobs with real ``runworker`` processes: one job per (schedule, tick), whatever happens.

Workers run ``tests.periodic_settings`` with their schedule set in
``LEASEJOBS_TEST_PERIODIC`` (see that module). Schedules tick every second
(cron's optional sixth, leading field is seconds), so a bounded run of some
seconds covers dozens of ticks. Ticks are read back from the jobs'
idempotency keys (``periodic:<schedule>:<tick>``).
"""

import datetime as dt
import json
import os
import random
import re
import signal
import time
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.db import connection

from leasejobs.db.rows import tick_of_key
from leasejobs.models import Job, PeriodicSchedule
from tests.connection_budget import many_connections
from tests.helpers import wait_until

STAMP = "tests.testapp.tasks.stamp"
SKEWED_CLOCK = Path(__file__).resolve().parents[1] / "chaos" / "skewed_clock"
SECOND = dt.timedelta(seconds=1)
ENQUEUED = r"periodic job enqueued "


def env_for(schedules: list[dict], clock_skew: float = 0.0) -> dict[str, str]:
    """The environment of a worker declaring ``schedules``, its wall clock ``clock_skew`` seconds off.

    The skew comes from tests/chaos/skewed_clock/sitecustomize.py, which
    shifts ``time.time()`` and ``datetime.now()`` of the whole process.
    """
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.periodic_settings",
        "LEASEJOBS_TEST_PERIODIC": json.dumps(schedules),
    }
    if clock_skew:
        path = os.pathsep.join(filter(None, [str(SKEWED_CLOCK), os.environ.get("PYTHONPATH")]))
        env.update(PYTHONPATH=path, LEASEJOBS_CLOCK_SKEW_SECONDS=str(clock_skew))
    return env


def every_second(name: str, **options) -> dict:
    return {"task": STAMP, "cron": "* * * * * *", "name": name, **options}


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def ticks_of(name: str) -> list[dt.datetime]:
    """The tick of every job schedule ``name`` enqueued, in tick order (duplicates kept)."""
    keys = Job.objects.filter(idempotency_key__startswith=f"periodic:{name}:").values_list(
        "idempotency_key", flat=True
    )
    return sorted(tick_of_key(k) for k in keys)


def assert_one_job_per_tick(name: str, first: dt.datetime, last: dt.datetime) -> list[dt.datetime]:
    """Every second from ``first`` to ``last`` has exactly one job; return all ticks."""
    ticks = ticks_of(name)
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    window = [t for t in ticks if first <= t <= last]
    expected = int((last - first) / SECOND) + 1
    missing = sorted({first + i * SECOND for i in range(expected)} - set(window))
    assert not missing, f"ticks without a job: {missing[:5]}"
    for job in Job.objects.filter(idempotency_key__startswith=f"periodic:{name}:"):
        assert job.run_at == tick_of_key(job.idempotency_key), "run_at is the tick"
        assert job.created_at >= job.run_at, "inserted before its tick by the database clock"
    return ticks


def stop_all(workers) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGTERM)
    for w in workers:
        w.wait(timeout=60)


@many_connections(48)
def test_six_workers_enqueue_each_tick_once_through_kill_and_pause_storms(start_worker):
    schedules = [every_second("storm", catch_up="all")]
    workers = [start_worker("--concurrency", "2", env=env_for(schedules)) for _ in range(6)]
    wait_until(lambda: ticks_of("storm"), timeout=60, what="the first periodic job")
    first = ticks_of("storm")[0]
    rng = random.Random(14)
    kills = pauses = 0
    storm_ends = time.monotonic() + 18
    while time.monotonic() < storm_ends:
        victim = rng.randrange(len(workers))
        if rng.random() < 0.5:
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait()
            workers[victim] = start_worker("--concurrency", "2", env=env_for(schedules))
            kills += 1
        else:
            workers[victim].signal(signal.SIGSTOP)
            time.sleep(rng.uniform(0.5, 3.0))
            workers[victim].signal(signal.SIGCONT)
            pauses += 1
        time.sleep(rng.uniform(0.2, 1.0))
    # Let the fleet catch up, then end the bounded run.
    storm_end = db_now().replace(microsecond=0)
    wait_until(
        lambda: ticks_of("storm")[-1] >= storm_end + 3 * SECOND, timeout=60, what="ticks after the storm"
    )
    stop_all(workers)
    last = PeriodicSchedule.objects.get(name="storm").last_tick
    ticks = assert_one_job_per_tick("storm", first, last)
    assert ticks[-1] == last
    assert kills >= 3 and pauses >= 3, (kills, pauses)
    print(f"\nstorm: {len(ticks)} ticks, one job each, through {kills} SIGKILLs and {pauses} SIGSTOPs")


@many_connections(36)
def test_worker_clocks_an_hour_off_neither_duplicate_nor_skip_a_tick(start_worker):
    # catch_up="all": a worker an hour ahead, were its clock used, would
    # enqueue every tick of the next hour at once; one an hour behind none.
    schedules = [every_second("skewed", catch_up="all")]
    workers = [start_worker(env=env_for(schedules, skew)) for skew in (3600.0, -3600.0, 3600.0, -3600.0)]
    ahead, behind = workers[0::2], workers[1::2]
    for w in workers:
        w.wait_for_log(r"worker started", timeout=60)
    # Those clocks really are off: the log's timestamps come from them.
    stamp = re.search(r"^(\S+ \S+),\d+ ", ahead[0].log(), re.M).group(1)
    off = dt.datetime.fromisoformat(stamp).replace(tzinfo=dt.UTC) - db_now()
    assert abs(off.total_seconds() - 3600) < 120, off
    wait_until(lambda: len(ticks_of("skewed")) >= 4, timeout=90, what="the first ticks, all four racing")
    # Whichever worker wins the race, each side must enqueue too: pause the
    # other side (SIGSTOP) until this one has enqueued two more ticks.
    for paused, running in ((ahead, behind), (behind, ahead)):
        for w in paused:
            w.signal(signal.SIGSTOP)
        done = sum(w.count(ENQUEUED) for w in running)
        wait_until(
            lambda running=running, done=done: sum(w.count(ENQUEUED) for w in running) >= done + 2,
            timeout=30,
            what="ticks enqueued by the running side",
        )
        for w in paused:
            w.signal(signal.SIGCONT)
    settled = len(ticks_of("skewed"))
    wait_until(lambda: len(ticks_of("skewed")) >= settled + 3, timeout=30, what="ticks after the pauses")
    stop_all(workers)
    ticks = ticks_of("skewed")
    assert_one_job_per_tick("skewed", ticks[0], ticks[-1])
    assert ticks[-1] <= db_now()


def cron_ticks(start: dt.datetime, end: dt.datetime, step: int) -> list[dt.datetime]:
    """Every ``step``-second tick (of the minute) in ``(start, end]``."""
    t = start.replace(microsecond=0) + SECOND
    found = []
    while t <= end:
        if t.second % step == 0:
            found.append(t)
        t += SECOND
    return found


def test_downtime_then_restart_under_each_catch_up_mode(start_worker):
    schedules = [
        {"task": STAMP, "cron": "*/3 * * * * *", "name": "latest", "catch_up": "latest"},
        {"task": STAMP, "cron": "*/3 * * * * *", "name": "all", "catch_up": "all"},
        # On time until half its period (5 s) has passed.
        {"task": STAMP, "cron": "*/10 * * * * *", "name": "none", "catch_up": "none"},
    ]
    first = start_worker(env=env_for(schedules))
    wait_until(lambda: all(ticks_of(n) for n in ("latest", "all", "none")), timeout=60, what="first ticks")
    first.signal(signal.SIGKILL)
    first.wait()
    down_at = db_now()
    before = {n: ticks_of(n)[-1] for n in ("latest", "all", "none")}
    # Down over a */10 tick, back 6 s after it (too late for "none") and 10 s after the kill at
    # the earliest (3+ */3 ticks missed).
    missed_none = cron_ticks(down_at, down_at + 10 * SECOND, 10)[0]
    back = max(missed_none + 6 * SECOND, down_at + 10 * SECOND)
    wait_until(lambda: db_now() >= back, timeout=40, interval=0.1)
    restarted = db_now()
    assert (restarted - down_at).total_seconds() >= 10
    second = start_worker(env=env_for(schedules))
    wait_until(
        lambda: all(ticks_of(n)[-1] > restarted for n in ("latest", "all", "none")),
        timeout=60,
        what="ticks after the restart",
    )
    stop_all([second])

    # "all": every tick missed while down has its job, in order.
    all_ticks = ticks_of("all")
    assert all_ticks == cron_ticks(all_ticks[0] - SECOND, all_ticks[-1], 3)
    missed = cron_ticks(before["all"], restarted, 3)
    assert len(missed) >= 3 and set(missed) <= set(all_ticks)
    # "latest": of the ticks missed up to the first one the restarted worker
    # enqueued, only that one has a job.
    latest_ticks = ticks_of("latest")
    first_after = min(t for t in latest_ticks if t > before["latest"])
    gap = cron_ticks(before["latest"], first_after, 3)
    assert len(gap) >= 3, gap
    assert [t for t in latest_ticks if before["latest"] < t <= first_after] == [first_after]
    # "none": the tick that came 6+ s before the restart is dropped; the next one runs.
    none_ticks = ticks_of("none")
    assert missed_none not in none_ticks
    assert none_ticks[-1] > restarted
    assert PeriodicSchedule.objects.get(name="none").skipped >= 1


@many_connections(20)
def test_schedules_removed_or_changed_between_two_worker_generations(start_worker):
    gen1 = [
        {"task": STAMP, "cron": "*/2 * * * * *", "name": "changing", "catch_up": "all"},
        every_second("removed", catch_up="all"),
    ]
    workers = [start_worker(env=env_for(gen1)) for _ in range(2)]
    wait_until(lambda: len(ticks_of("changing")) >= 3, timeout=60, what="generation 1 ticks")
    stop_all(workers)
    stopped = db_now()
    removed_last = ticks_of("removed")[-1]
    time.sleep(6)  # down long enough for catch_up="all" to have ticks to fill, were it to fire for the past

    gen2 = [{"task": STAMP, "cron": "*/5 * * * * *", "name": "changing", "catch_up": "all"}]
    started = db_now()
    workers = [start_worker(env=env_for(gen2)) for _ in range(2)]
    wait_until(lambda: len([t for t in ticks_of("changing") if t > started]) >= 3, timeout=60, what="gen 2")
    stop_all(workers)

    assert ticks_of("removed")[-1] == removed_last, "a removed schedule stops ticking"
    row = PeriodicSchedule.objects.get(name="removed")
    assert row.last_tick == removed_last, "and keeps its state for the record"
    changing = ticks_of("changing")
    assert not [t for t in changing if stopped < t <= started], "nothing fired for the past"
    new = [t for t in changing if t > started]
    assert new == cron_ticks(new[0] - SECOND, new[-1], 5), "the new expression, every tick"
    assert PeriodicSchedule.objects.get(name="changing").cron == "*/5 * * * * *"


@many_connections(41)
def test_two_deploys_side_by_side_with_different_schedule_sets(start_worker):
    shared = every_second("shared", catch_up="all")
    deploy1 = [shared, every_second("only-1"), {"task": STAMP, "cron": "*/2 * * * * *", "name": "contested"}]
    deploy2 = [shared, every_second("only-2"), {"task": STAMP, "cron": "*/3 * * * * *", "name": "contested"}]
    old = [start_worker(env=env_for(deploy1)) for _ in range(2)]
    for w in old:
        w.wait_for_log(r"worker started", timeout=60)
    wait_until(lambda: ticks_of("contested"), timeout=60, what="deploy 1 ticks")
    new = [start_worker(env=env_for(deploy2)) for _ in range(2)]
    for w in new:
        w.wait_for_log(r"worker started", timeout=60)
    both_from = db_now() + 2 * SECOND
    wait_until(
        lambda: ticks_of("shared")[-1] >= both_from + 8 * SECOND, timeout=90, what="a run side by side"
    )
    stop_all(old + new)

    shared_ticks = ticks_of("shared")
    assert_one_job_per_tick("shared", shared_ticks[0], shared_ticks[-1])
    assert [t for t in ticks_of("only-1") if t > both_from], "deploy 1 keeps its own schedules"
    assert [t for t in ticks_of("only-2") if t > both_from], "deploy 2 runs its own schedules"
    # The definition of the worker started last wins; the older deploy leaves that schedule alone.
    contested = [t for t in ticks_of("contested") if t > both_from]
    assert contested and all(t.second % 3 == 0 for t in contested), contested
    assert any("declared differently by a worker started later" in w.log() for w in old)
    assert PeriodicSchedule.objects.get(name="contested").cron == "*/3 * * * * *"


def test_a_bad_schedule_stops_runworker_at_start_with_one_sentence(start_worker):
    bad = start_worker(env=env_for([{"task": STAMP, "cron": "0 7 * * *", "timezone": "Europe/Pariss"}]))
    assert bad.wait(timeout=60) != 0
    assert "(leasejobs.E010) Periodic schedule 'tests.testapp.tasks.stamp'" in bad.log()
    assert "unknown time zone 'Europe/Pariss'." in bad.log()


@pytest.mark.skipif(find_spec("django.tasks") is None, reason="Django Tasks need Django 6")
def test_a_schedule_naming_a_django_task_passes_the_check_and_its_ticks_run(start_worker):
    # The check at runworker's start knows the Django Tasks the worker will
    # register (it used to know only @task functions, and refused to start).
    schedules = [{"task": "tests.testapp.django_tasks.noop", "cron": "* * * * * *", "name": "dj-noop"}]
    worker = start_worker("--concurrency", "1", env=env_for(schedules))
    ticks = Job.objects.filter(idempotency_key__startswith="periodic:dj-noop:")

    def two_ticks_done() -> bool:
        assert worker.proc.poll() is None, f"runworker exited:\n{worker.log()[-2000:]}"
        return ticks.filter(status="done").count() >= 2

    try:
        wait_until(two_ticks_done, timeout=30, what="two ticks of the Django Task done")
        assert not ticks.filter(status="failed").exists()
    finally:
        stop_all([worker])


@many_connections(35)
def test_no_periodic_workers_never_schedule_and_each_worker_pays_about_one_statement_per_tick(start_worker):
    schedules = [every_second("cost")]
    idle = start_worker("--no-periodic", env=env_for(schedules))
    idle.wait_for_log(r"worker started", timeout=60)
    time.sleep(3)
    assert ticks_of("cost") == [], "a --no-periodic worker enqueues nothing"
    workers = [start_worker(env=env_for(schedules)) for _ in range(3)]
    wait_until(lambda: len(ticks_of("cost")) >= 20, timeout=90, what="twenty ticks")
    stop_all([idle, *workers])
    ticks = ticks_of("cost")
    assert_one_job_per_tick("cost", ticks[0], ticks[-1])
    for w in workers:
        statements = int(re.search(r"periodic scheduler stopped .* statements=(\d+)", w.log()).group(1))
        # One statement per tick of its life, one to register, and a few more at most.
        assert statements <= len(ticks) + 5, (statements, len(ticks))
        print(f"\n{w.pid}: {statements} statements for {len(ticks)} ticks")
    assert "periodic" not in idle.log()


def statements_of(worker) -> int:
    """The statements a stopped worker's scheduler ran, from its closing log line."""
    return int(re.search(r"periodic scheduler stopped .* statements=(\d+)", worker.log()).group(1))


def test_catch_up_all_with_max_catch_up_1_enqueues_every_tick_at_one_statement_each(start_worker):
    # Issue 28, item 6: the one-second lookahead took the only catch-up slot,
    # so every statement offered a tick not yet due, enqueued nothing, and
    # the worker looked again at once (972 statements in 8 s).
    worker = start_worker(
        "--concurrency", "1", env=env_for([every_second("one", catch_up="all", max_catch_up=1)])
    )
    worker.wait_for_log(r"worker started", timeout=60)
    started = db_now()
    wait_until(lambda: len(ticks_of("one")) >= 6, timeout=20, what="six ticks of a max_catch_up=1 schedule")
    stop_all([worker])
    ticks = assert_one_job_per_tick("one", ticks_of("one")[0], ticks_of("one")[-1])
    assert ticks[0] <= started + 3 * SECOND, "the first tick after the start has its job"
    print(f"\nmax_catch_up=1: {len(ticks)} ticks, one job each, {statements_of(worker)} statements")
    assert statements_of(worker) <= len(ticks) + 5, (statements_of(worker), len(ticks))


def test_max_catch_up_n_catches_up_n_ticks_after_a_downtime(start_worker):
    schedules = [every_second("three", catch_up="all", max_catch_up=3)]
    first = start_worker("--concurrency", "1", env=env_for(schedules))
    wait_until(lambda: len(ticks_of("three")) >= 2, timeout=60, what="the first ticks")
    first.signal(signal.SIGKILL)
    first.wait()
    before = ticks_of("three")[-1]
    wait_until(lambda: db_now() >= before + 8 * SECOND, timeout=20, interval=0.1)
    second = start_worker("--concurrency", "1", env=env_for(schedules))
    wait_until(lambda: len([t for t in ticks_of("three") if t > before]) >= 6, timeout=60, what="ticks after")
    stop_all([second])
    jobs = Job.objects.filter(idempotency_key__startswith="periodic:three:")
    after = [j for j in jobs if tick_of_key(j.idempotency_key) > before]
    # The first statement after the restart inserted its jobs with one created_at (its now()).
    first_statement = min(j.created_at for j in after)
    caught_up = sorted(tick_of_key(j.idempotency_key) for j in after if j.created_at == first_statement)
    assert len(caught_up) == 3, caught_up
    assert caught_up[-1] <= first_statement and caught_up[-1] > first_statement - 2 * SECOND
    ticks = ticks_of("three")
    assert next(t for t in ticks if t > before) == caught_up[0], "no older missed tick has a job"
    assert_one_job_per_tick("three", caught_up[0], ticks[-1])
    since = len([t for t in ticks if t >= caught_up[-1]])
    statements = statements_of(second)
    print(f"\nmax_catch_up=3: caught up {len(caught_up)}, then {since} ticks in {statements} statements")
    assert statements_of(second) <= since + 5
