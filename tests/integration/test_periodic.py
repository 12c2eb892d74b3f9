"""The integration half of tests/unit/test_periodic.py: its tests that start workers or commit."""

import datetime as dt
import itertools
import time

from django.db.models.functions import Now

from leasejobs.db.rows import tick_of_key
from leasejobs.models import Job, PeriodicSchedule
from leasejobs.periodic.status import db_now
from tests.helpers import wait_until
from tests.unit.test_periodic import jobs_of, scheduler_for

# -- daylight saving: Debian/Vixie cron's rules, on real transition dates ------------------------


# -- declaring and checking ---------------------------------------------------------------------


# -- the scheduler's statement, in one process --------------------------------------------------


def test_catch_up_all_keeps_the_latest_max_catch_up_of_the_due_ticks_it_is_offered(
    settings, transactional_db
):
    # The worker offers max_catch_up due ticks plus its lookahead tick; when
    # the database has reached that one too, it keeps the latest max_catch_up.
    scheduler = scheduler_for(settings, catch_up="all", max_catch_up=3, cron="* * * * * *")
    PeriodicSchedule.objects.filter(name="minutely").update(last_tick=db_now() - dt.timedelta(seconds=30))
    scheduler._register()
    # An estimate 1.5 s behind the database: the lookahead tick is due as well.
    at, mono = scheduler._clock
    scheduler._clock = (at - dt.timedelta(seconds=1.5), mono)
    scheduler.run_due()
    ticks = [tick_of_key(j.idempotency_key) for j in jobs_of()]
    assert len(ticks) == 3, ticks
    assert all(b - a == dt.timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
    row = PeriodicSchedule.objects.get(name="minutely")
    assert row.last_tick == ticks[-1] and row.enqueued == 3 and row.skipped == 1
    assert scheduler.statements == 3  # register, look again at the rows, one tick


def test_overlap_false_skips_ticks_while_the_previous_job_is_queued_and_records_them(
    settings, transactional_db
):
    # Every second, and committed statements: each look sees the database clock move on.
    scheduler = scheduler_for(settings, overlap=False, cron="* * * * * *")
    wait_until(lambda: scheduler.run_due() and jobs_of(), timeout=10, interval=0.2, what="a first job")
    first = jobs_of()[0]
    time.sleep(2.5)
    scheduler.run_due()
    assert jobs_of() == [first], "the previous job is still queued"
    assert PeriodicSchedule.objects.get(name="minutely").skipped >= 1
    Job.objects.filter(id=first.id).update(status="running")
    time.sleep(1.5)
    scheduler.run_due()
    assert jobs_of() == [first], "the previous job is still running"
    Job.objects.filter(id=first.id).update(status="done", finished_at=Now())
    time.sleep(1.5)
    scheduler.run_due()
    assert len(jobs_of()) == 2


# -- seeing it ----------------------------------------------------------------------------------
