"""``manage.py leasejobs_health``: a probe for Kubernetes (exit 0 healthy, 1 not, one line).

``--worker``: the newest worker started on this host (or ``--worker-id``)
heartbeated within ``leasejobs.liveness.STALE_AFTER`` of its heartbeat
intervals. A liveness probe: a wedged (paused, deadlocked) worker fails it.
``--queue``: the oldest due job has waited at most ``--max-lag`` and at most
``--max-expired`` leases have run out. A readiness or alerting probe.
"""

import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, connections

from leasejobs import liveness, queuestats
from leasejobs.conf import db_alias
from leasejobs.management.arguments import duration, non_negative_int

#: This host's newest worker (or the one named), with its heartbeat age and interval.
WORKER = """
SELECT w.worker_id, extract(epoch FROM now() - w.heartbeat_at)::float8, w.interval_seconds
FROM leasejobs_worker AS w
WHERE (%(worker_id)s::text IS NULL AND w.hostname = %(hostname)s) OR w.worker_id = %(worker_id)s
ORDER BY w.started_at DESC
LIMIT 1
"""


class Command(BaseCommand):
    help = "Exit 0 if healthy, 1 if not, with one line: --worker (this host's worker) and/or --queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="store_true", help="Check this host's worker heartbeat.")
        parser.add_argument(
            "--worker-id", metavar="ID", help="Check this worker instead of the host's newest."
        )
        parser.add_argument("--queue", action="store_true", help="Check the queue's lag and expired leases.")
        parser.add_argument(
            "--max-lag",
            type=duration,
            default=60.0,
            metavar="AGE",
            help="Most a due job may wait unclaimed, such as 60s or 5m (default 60s).",
        )
        parser.add_argument(
            "--max-expired",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Most running jobs with an expired lease (default 0).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not (options["worker"] or options["worker_id"] or options["queue"]):
            options["worker"] = options["queue"] = True
        problems: list[str] = []
        facts: list[str] = []
        try:
            if options["worker"] or options["worker_id"]:
                self._check_worker(options["worker_id"], problems, facts)
            if options["queue"]:
                self._check_queue(options["max_lag"], options["max_expired"], problems, facts)
        except DatabaseError as exc:
            problems.append(f"database unreachable: {str(exc).strip().splitlines()[0] if str(exc) else exc}")
        if problems:
            self.stdout.write("UNHEALTHY: " + "; ".join(problems))
            sys.exit(1)
        self.stdout.write("OK: " + "; ".join(facts))

    def _check_worker(self, worker_id: str | None, problems: list[str], facts: list[str]) -> None:
        hostname = socket.gethostname()
        with connections[db_alias()].cursor() as cursor:
            cursor.execute(WORKER, {"worker_id": worker_id, "hostname": hostname})
            row = cursor.fetchone()
        if row is None:
            problems.append(f"no worker {worker_id or f'on host {hostname}'} has heartbeated")
            return
        found, age, interval = row
        allowed = liveness.STALE_AFTER * interval
        if age > allowed:
            problems.append(
                f"worker {found} last heartbeated {age:.1f} s ago (limit {allowed:.1f} s: "
                f"{liveness.STALE_AFTER} x its {interval:g} s interval)"
            )
        else:
            facts.append(f"worker {found} heartbeated {age:.1f} s ago")

    def _check_queue(self, max_lag: float, max_expired: int, problems: list[str], facts: list[str]) -> None:
        stats = queuestats.read()
        lag_queue = max(stats.oldest_due_age, key=stats.oldest_due_age.__getitem__, default=None)
        lag = stats.oldest_due_age.get(lag_queue, 0.0) if lag_queue else 0.0
        expired = sum(stats.expired_leases.values())
        if lag > max_lag:
            problems.append(f"oldest due job in queue {lag_queue} waited {lag:.0f} s (limit {max_lag:g} s)")
        if expired > max_expired:
            problems.append(f"{expired} expired lease(s) (limit {max_expired})")
        if lag <= max_lag and expired <= max_expired:
            facts.append(
                f"queue lag {lag:.0f} s, {expired} expired lease(s), {stats.live_workers} live worker(s)"
            )
