"""PgBouncer goes away under running workers: killed and restarted, and its server connections killed.

The workers reach the database through a PgBouncer in transaction mode that
this scenario starts itself (``tests.pgbouncer``) and LISTEN directly. A
killed PgBouncer cuts every client connection of every worker at once (the
claim, heartbeat and finish connections and each job body's Django
connection); killed server connections cut whichever transactions they were
running. PostgreSQL itself is never restarted. Nothing is lost or done twice.
"""

import signal
import time
from collections import Counter

from django.db import connection

from leasejobs.models import Job
from tests.chaos import pgserver
from tests.chaos.helpers import Fleet, check, database_call, enqueue_effects, unfinished, wait_finished
from tests.helpers import database_url, wait_until
from tests.pgbouncer import PgBouncer

JOBS = 240
WORKERS = 3


def done(job_ids: list[int]) -> int:
    return database_call(lambda: Job.objects.filter(id__in=job_ids, status="done").count(), default=0)


def test_pgbouncer_restarted_and_its_server_connections_killed_mid_run(start_worker, record_figures):
    s = connection.settings_dict
    bouncer = PgBouncer(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432), pool_size=8)
    try:
        env = {
            "DATABASE_URL": bouncer.url(s["NAME"]),
            "LEASEJOBS_LISTEN_URL": database_url(),
            "DJANGO_DISABLE_SERVER_SIDE_CURSORS": "1",
        }
        fleet = Fleet(start_worker, "bouncer", ["--lease", "2", "--concurrency", "4"])
        job_ids = enqueue_effects(JOBS, seconds=0.3)
        for _ in range(WORKERS):
            fleet.start(env=env)
        fleet.wait_started()
        restarts = 0
        for share in (0.2, 0.5):
            wait_until(
                lambda share=share: done(job_ids) >= share * JOBS, timeout=60, what=f"{share:.0%} done"
            )
            assert unfinished(job_ids) > 0, "the restart must come while jobs run"
            bouncer.stop(signal.SIGKILL)
            time.sleep(1.0)
            bouncer.start()
            restarts += 1
        terminated: Counter[str] = Counter()
        wait_until(lambda: done(job_ids) >= 0.7 * JOBS, timeout=60, what="70% done")
        deadline = time.monotonic() + 10
        while unfinished(job_ids) and time.monotonic() < deadline:
            backends = pgserver.backends_of(set(fleet.ids.values()))
            through_bouncer = [b for b in backends if b[1] != "listen"]
            if through_bouncer:
                pid, purpose, _state = through_bouncer[0]
                terminated[purpose] += pgserver.terminate([pid])
            time.sleep(0.5)
        wait_finished(job_ids, timeout=120)
        fleet.stop_all()
        assert restarts == 2 and sum(terminated.values()) > 0, terminated
    finally:
        bouncer.remove()
    reconnects = len(fleet.logs().split("reconnected ")) - 1
    figures = {f"{purpose} server connections terminated": n for purpose, n in sorted(terminated.items())}
    record_figures(
        "PgBouncer restart",
        check(job_ids, fleet, pgbouncer_restarts=restarts, **figures, reconnects=reconnects),
    )
