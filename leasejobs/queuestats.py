"""Queue-wide health in one cheap query, for the metrics view and the health probe.

Reads only the rows the claim's partial index covers (queued and running)
and the small ``leasejobs_worker`` table, so it stays cheap however much
history the table keeps: finished jobs are counted by the workers'
``leasejobs_jobs_finished_total`` instead. All ages are on the database clock.
"""

from dataclasses import dataclass, field

from django.db import connections

from leasejobs import liveness
from leasejobs.conf import db_alias

#: One row per (queue, status) of active jobs, plus the live-worker count on
#: every row; a queue-less row when no job is active.
QUERY = f"""
SELECT a.queue, a.status, COALESCE(a.jobs, 0), a.oldest_due_age, COALESCE(a.expired, 0), w.live
FROM ({liveness.COUNT_LIVE}) AS w(live)
LEFT JOIN LATERAL (
    SELECT queue, status, count(*) AS jobs,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued' AND run_at <= now()))
               AS oldest_due_age,
           count(*) FILTER (WHERE status = 'running' AND lease_until < now()) AS expired
    FROM leasejobs_job
    WHERE status IN ('queued', 'running')
    GROUP BY queue, status
) AS a ON true
ORDER BY a.queue, a.status
"""


@dataclass
class QueueStats:
    #: (queue, status) -> jobs, for status queued and running.
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    #: queue -> seconds since the oldest due, unclaimed job became due.
    oldest_due_age: dict[str, float] = field(default_factory=dict)
    #: queue -> running jobs whose lease ran out (their worker died or is paused).
    expired_leases: dict[str, int] = field(default_factory=dict)
    live_workers: int = 0


def read() -> QueueStats:
    stats = QueueStats()
    with connections[db_alias()].cursor() as cursor:
        cursor.execute(QUERY)
        for queue, status, jobs, oldest, expired, live in cursor.fetchall():
            stats.live_workers = live
            if queue is None:
                continue
            stats.jobs[(queue, status)] = jobs
            if oldest is not None:
                stats.oldest_due_age[queue] = float(oldest)
            if status == "running":
                stats.expired_leases[queue] = expired
    return stats
