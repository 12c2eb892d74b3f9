"""What ``runworker`` tells a worker: its options and its identity."""

import os
import secrets
import socket
from dataclasses import dataclass, field

from leasejobs.db.pooling import ConnectionPlan


def default_worker_id() -> str:
    """Host, pid and a random suffix: unique per process, never reused."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class WorkerOptions:
    queues: list[str] | None = None
    concurrency: int = 4
    lease_seconds: float | None = None
    heartbeat_seconds: float | None = None
    heartbeat: bool = True
    burst: bool = False
    #: With ``burst``: exit only once no retry or snooze of its queues is due later either.
    wait_for_retries: bool = False
    max_jobs: int | None = None
    worker_id: str = field(default_factory=default_worker_id)
    grace_seconds: float = 10.0
    poll_interval: float | None = None
    #: Most jobs claimed ahead of free runner slots (None: LEASEJOBS["PREFETCH"]).
    prefetch: int | None = None
    #: Enqueue the jobs of periodic schedules (runworker --no-periodic: False).
    periodic: bool = True
    #: VACUUM the job table when dead rows pile up (runworker --no-vacuum: False;
    #: LEASEJOBS["VACUUM_THRESHOLD"] None turns it off everywhere).
    vacuum: bool = True
    #: A child leaves (and a fresh one is forked) after this many bodies
    #: (runworker --max-jobs-per-child); None: never.
    max_jobs_per_child: int | None = None
    #: ... or once its own memory passes this many bytes (--max-memory-per-child).
    max_memory_per_child: int | None = None
    #: Through a transaction pooler or not, and where to LISTEN (``pooling.plan()``;
    #: None: direct, LISTEN on the queue's database).
    connections: ConnectionPlan | None = None
