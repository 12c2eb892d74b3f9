"""Queue-wide health in one cheap query, for the metrics view and the health probe.

Reads only the rows the claim's partial index covers (queued and running)
and the small ``leasejobs_worker`` table, so it stays cheap however much
history the table keeps: finished jobs are counted by the workers'
``leasejobs_jobs_finished_total`` instead. All ages are on the database clock.
"""

from dataclasses import dataclass, field

from leasejobs.db import facade


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
    for queue, status, jobs, oldest, expired, live in facade.queue_stats_rows():
        stats.live_workers = live
        if queue is None:
            continue
        stats.jobs[(queue, status)] = jobs
        if oldest is not None:
            stats.oldest_due_age[queue] = float(oldest)
        if status == "running":
            stats.expired_leases[queue] = expired
    return stats
