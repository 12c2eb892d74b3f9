"""Worker clocks an hour off: leases are still taken over on time, and never early.

Leases are stamped and compared by the database clock only. Were a worker's
clock used, a worker an hour ahead would find every lease expired and steal
running jobs, and a lease stamped by it would last an hour; a worker an hour
behind would stamp leases that are expired at once, and wait an hour to
take over. Both are tried here, with the clocks of the worker processes
really put off (tests/chaos/skewed_clock/sitecustomize.py).
"""

import os
import signal
import time
from pathlib import Path

from django.db import connection

from leasejobs.models import Job
from tests.chaos.helpers import Fleet, check, enqueue_effects, wait_finished
from tests.chaos.tasks import effect
from tests.helpers import wait_until
from tests.testapp.models import BodyRun

SKEW = 3600.0
LEASE = 2.0
SKEWED_CLOCK = Path(__file__).resolve().parent / "skewed_clock"


def clock_off_by(seconds: float) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(SKEWED_CLOCK), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "LEASEJOBS_CLOCK_SKEW_SECONDS": str(seconds)}


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_workers_with_clocks_an_hour_off_take_over_on_time_and_never_early(start_worker, record_figures):
    fleet = Fleet(start_worker, "clock", ["--lease", str(LEASE)])
    held = effect.using(queue="held").enqueue(0.1, first_attempt_seconds=8).id
    behind = fleet.start("--queue", "held", "--concurrency", "1", env=clock_off_by(-SKEW))
    wait_until(lambda: BodyRun.objects.filter(job_id=held).exists(), what="the held job starts")
    claimed_at = time.monotonic()
    # The clock of that worker really is an hour behind: its body stamped this row.
    behind_by = (db_now() - BodyRun.objects.get(job_id=held).created_at).total_seconds()
    assert SKEW - 60 < behind_by < SKEW + 60, behind_by

    orphan = effect.using(queue="orphan").enqueue(0.1, first_attempt_seconds=30).id
    ahead = fleet.start("--queue", "held", "--queue", "orphan", "--queue", "default", env=clock_off_by(SKEW))
    ahead_id = fleet.worker_id(ahead)
    wait_until(lambda: Job.objects.filter(id=orphan, leased_by=ahead_id).exists(), what="orphan claimed")
    # The worker an hour ahead claims and runs other jobs meanwhile, and never
    # takes the held job from the worker an hour behind, three leases long.
    others = enqueue_effects(20, seconds=0.1)
    wait_finished(others, timeout=20)
    wait_until(lambda: time.monotonic() - claimed_at > 3 * LEASE, what="three leases pass")
    still_held = Job.objects.filter(id=held, attempt=1, status="running", leased_by=fleet.worker_id(behind))
    assert still_held.exists()

    # The worker an hour ahead dies holding the orphan: one an hour behind takes it over in seconds.
    ahead.signal(signal.SIGKILL)
    ahead.wait()
    killed_at = time.monotonic()
    fleet.start("--queue", "orphan", env=clock_off_by(-SKEW))
    wait_until(lambda: Job.objects.filter(id=orphan, status="done").exists(), timeout=30, what="takeover")
    takeover_seconds = time.monotonic() - killed_at

    job_ids = [held, orphan, *others]
    wait_finished(job_ids, timeout=20)
    assert Job.objects.get(id=held).attempt == 1 and Job.objects.get(id=orphan).attempt == 2
    fleet.stop_all()
    record_figures(
        "clock skew",
        check(
            job_ids,
            fleet,
            **{
                "worker clocks off by (s)": f"+{SKEW:.0f} and -{SKEW:.0f}",
                "lease": LEASE,
                "seconds from kill to takeover": round(takeover_seconds, 1),
            },
        ),
    )
