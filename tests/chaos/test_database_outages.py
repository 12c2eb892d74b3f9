"""The database goes away under running workers: a restart, and killed connections.

Every worker connection (claim, heartbeat, finish, listen) and every job
body's Django connection can be cut at any statement. A cut claim leaves its
jobs to expire and be reclaimed; a cut heartbeat is retried on a new
connection (or the lease expires and the job is taken over); a cut finish is
retried and, if the job moved on meanwhile, dropped; a cut body fails its
attempt and is retried. Nothing is lost or done twice.
"""

import random
import time
from collections import Counter

from leasejobs.models import Job
from tests.chaos import pgserver
from tests.chaos.helpers import (
    Fleet,
    cannot_run_here,
    check,
    database_call,
    enqueue_effects,
    unfinished,
    wait_finished,
)
from tests.helpers import wait_until

JOBS = 240
WORKERS = 3


def done(job_ids: list[int]) -> int:
    return database_call(lambda: Job.objects.filter(id__in=job_ids, status="done").count(), default=0)


def test_postgresql_restarted_mid_run(start_worker, record_figures):
    try:
        server = pgserver.local_server()
        pgserver.refuse_if_shared()
    except pgserver.Unavailable as exc:
        cannot_run_here(str(exc))
    fleet = Fleet(start_worker, "restart", ["--lease", "2", "--concurrency", "4"])
    job_ids = enqueue_effects(JOBS, seconds=0.3)
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    restarts = 0
    for share in (0.2, 0.5):
        wait_until(lambda share=share: done(job_ids) >= share * JOBS, timeout=30, what=f"{share:.0%} done")
        assert unfinished(job_ids) > 0, "the restart must come while jobs run"
        server.restart()
        restarts += 1
    wait_finished(job_ids, timeout=60)
    fleet.stop_all()
    reconnects = len(fleet.logs().split("reconnected ")) - 1
    record_figures("PostgreSQL restart", check(job_ids, fleet, restarts=restarts, reconnects=reconnects))


def test_connections_terminated_mid_job_and_mid_heartbeat(start_worker, record_figures):
    """pg_terminate_backend on our own workers' backends only, twice a second.

    Each round cuts one heartbeat connection and one other connection (a job
    body's, a claim's, a finish's or a listener's), while jobs run.
    """
    fleet = Fleet(start_worker, "terminate", ["--lease", "1", "--concurrency", "4"])
    job_ids = enqueue_effects(JOBS, seconds=0.3)
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    terminated: Counter[str] = Counter()
    deadline = time.monotonic() + 90
    while unfinished(job_ids) and time.monotonic() < deadline:
        time.sleep(0.5)
        backends = pgserver.backends_of(set(fleet.ids.values()))
        beats = [b for b in backends if b[1] == "heartbeat"]
        others = [b for b in backends if b[1] != "heartbeat"]
        chosen = [random.choice(group) for group in (beats, others) if group]
        if pgserver.terminate([pid for pid, _purpose, _state in chosen]) != len(chosen):
            continue  # one ended on its own meanwhile; count only what we cut
        for _pid, purpose, state in chosen:
            terminated[purpose] += 1
            terminated["mid-statement"] += state == "active"
    wait_finished(job_ids, timeout=60)
    assert terminated["heartbeat"] and terminated["body"], terminated
    fleet.stop_all()
    reconnects = len(fleet.logs().split("reconnected ")) - 1
    figures = {f"{purpose} connections terminated": n for purpose, n in sorted(terminated.items())}
    record_figures("pg_terminate_backend", check(job_ids, fleet, **figures, reconnects=reconnects))
