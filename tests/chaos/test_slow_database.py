"""Slow database: another session holds a job row FOR UPDATE for longer than the lease.

Two held jobs are locked, one before its body records its side effect (the
body then waits on the lock) and one after (its finish would wait on it).
The worker must report the locked rows and not wedge: its heartbeat skips
them instead of waiting, its other jobs keep being renewed and finished, and
SIGTERM still stops it within its grace. The body waiting on the lock holds
a lease nobody renews: its zygote kills it at the lease's end (nobody else
can take the job while the row stays locked). Once the lock is gone, each
locked job completes exactly once.
"""

import time

import psycopg

from leasejobs.models import Job, SideEffect
from tests.chaos.helpers import Fleet, check, enqueue_effects, wait_finished
from tests.chaos.tasks import effect, effect_key
from tests.helpers import database_url, wait_until
from tests.testapp.models import BodyRun

LEASE = 2.0
GRACE = 1.0


def test_a_row_locked_past_the_lease_neither_wedges_the_worker_nor_doubles_the_job(
    start_worker, record_figures
):
    fleet = Fleet(start_worker, "slow", ["--lease", str(LEASE), "--concurrency", "4", "--grace", str(GRACE)])
    before_effect = effect.enqueue(0.1, first_attempt_seconds=3.0).id  # side effect after 1.5 s
    # Its body ends 1 s after its side effect, which renewed its lease for 2 s: the finish
    # meets the locked row before the unrenewed lease runs out, even on a loaded machine
    # (with 1.5 s, a CI run saw the lease end first: "lease lost", no "finish skipped").
    after_effect = effect.enqueue(0.1, first_attempt_seconds=2.0).id
    worker = fleet.start()
    wait_until(lambda: BodyRun.objects.filter(job_id__in=[before_effect, after_effect]).count() == 2)
    with psycopg.connect(database_url()) as locker:
        # The first lock is taken while the body sleeps before its side effect ...
        locker.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [before_effect])
        # ... the second once its side effect is recorded, before its finish.
        wait_until(lambda: SideEffect.objects.filter(key=effect_key(after_effect)).exists())
        locker.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [after_effect])
        locked_at = time.monotonic()
        for job_id in (before_effect, after_effect):
            worker.wait_for_log(rf"heartbeat skipped job={job_id} attempt=1 worker=\S+: row locked")
        # Other jobs keep flowing through the same worker, past the lease.
        others = enqueue_effects(40, seconds=0.1)
        wait_finished(others, timeout=20, what="the other jobs done while two rows are locked")
        wait_until(lambda: time.monotonic() - locked_at > LEASE + 0.5, what="the lease passes")
        assert Job.objects.filter(id__in=others).exclude(attempt=1).count() == 0
        # SIGTERM: the worker stops within its grace although two rows stay locked.
        stopped_at = time.monotonic()
        worker.signal(15)
        assert worker.wait(timeout=GRACE + 10) == 0, worker.log()[-3000:]
        stop_seconds = time.monotonic() - stopped_at
        assert stop_seconds < GRACE + 4
        # It said why: the finish met a locked row, and the body waiting on the other
        # lock outlived its unrenewed lease and was killed.
        worker.wait_for_log(rf"finish skipped job={after_effect} attempt=1 worker=\S+: row locked", timeout=0)
        worker.wait_for_log(
            rf"lease lost job={before_effect} attempt=1 worker=\S+: its lease ran out", timeout=0
        )
        held_seconds = time.monotonic() - locked_at
        # Nobody took the locked jobs over meanwhile: the lock keeps claims off them too.
        locked = Job.objects.filter(id__in=[before_effect, after_effect])
        assert set(locked.values_list("attempt", flat=True)) == {1}
        locker.rollback()
    fleet.start()
    job_ids = [before_effect, after_effect, *others]
    wait_finished(job_ids, timeout=20, what="the locked jobs done once the lock is gone")
    fleet.stop_all()
    record_figures(
        "slow database",
        check(
            job_ids,
            fleet,
            **{
                "rows locked": 2,
                "seconds locked": round(held_seconds, 1),
                "heartbeats skipped": fleet.logs().count("heartbeat skipped"),
                "seconds to stop on SIGTERM": round(stop_seconds, 1),
            },
        ),
    )
