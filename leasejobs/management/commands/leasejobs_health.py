"""``manage.py leasejobs_health``: a probe for Kubernetes (exit 0 healthy, 1 not, one line).

``--worker``: the newest worker started on this host (or ``--worker-id``)
heartbeated within ``leasejobs.db.sql.workers.STALE_AFTER`` of its heartbeat
intervals. A liveness probe: a wedged (paused, deadlocked) worker fails it.
``--queue``: the oldest due job has waited at most ``--max-lag`` and at most
``--max-expired`` leases have run out. A readiness or alerting probe.
``--queue NAME`` checks that queue only, and fails on a name nothing uses
(no job, no registered task, no limits): a typo would otherwise be OK forever.
"""

import socket
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.db.sql import workers
from leasejobs.jobs import registry
from leasejobs.jobs.discovery import discover
from leasejobs.management.arguments import duration, non_negative_int
from leasejobs.queues import stats as queuestats


class Command(BaseCommand):
    help = "Exit 0 if healthy, 1 if not, with one line: --worker (this host's worker) and/or --queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="store_true", help="Check this host's worker heartbeat.")
        parser.add_argument(
            "--worker-id", metavar="ID", help="Check this worker instead of the host's newest."
        )
        parser.add_argument(
            "--queue",
            nargs="?",
            const="",
            metavar="NAME",
            help="Check the lag and expired leases of every queue, or of the queue NAME.",
        )
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
        if not (options["worker"] or options["worker_id"] or options["queue"] is not None):
            options["worker"], options["queue"] = True, ""
        problems: list[str] = []
        facts: list[str] = []
        try:
            if options["worker"] or options["worker_id"]:
                self._check_worker(options["worker_id"], problems, facts)
            if options["queue"] is not None:
                queue = options["queue"] or None
                self._check_queue(queue, options["max_lag"], options["max_expired"], problems, facts)
        except DatabaseError as exc:
            problems.append(f"database unreachable: {str(exc).strip().splitlines()[0] if str(exc) else exc}")
        if problems:
            self.stdout.write("UNHEALTHY: " + "; ".join(problems))
            sys.exit(1)
        self.stdout.write("OK: " + "; ".join(facts))

    def _check_worker(self, worker_id: str | None, problems: list[str], facts: list[str]) -> None:
        hostname = socket.gethostname()
        row = facade.newest_worker(worker_id, hostname)
        if row is None:
            problems.append(f"no worker {worker_id or f'on host {hostname}'} has heartbeated")
            return
        found, age, interval = row
        allowed = workers.STALE_AFTER * interval
        if age > allowed:
            problems.append(
                f"worker {found} last heartbeated {age:.1f} s ago (limit {allowed:.1f} s: "
                f"{workers.STALE_AFTER} x its {interval:g} s interval)"
            )
        else:
            facts.append(f"worker {found} heartbeated {age:.1f} s ago")

    def _check_queue(
        self, queue: str | None, max_lag: float, max_expired: int, problems: list[str], facts: list[str]
    ) -> None:
        stats = queuestats.read()
        ages = {q: age for q, age in stats.oldest_due_age.items() if queue in (None, q)}
        lag_queue = max(ages, key=ages.__getitem__, default=None)
        lag = ages.get(lag_queue, 0.0) if lag_queue else 0.0
        expired = sum(n for q, n in stats.expired_leases.items() if queue in (None, q))
        if queue is not None and not any(q == queue for q, _ in stats.jobs) and (unknown := _unused(queue)):
            problems.append(unknown)
            return
        if lag > max_lag:
            problems.append(f"oldest due job in queue {lag_queue} waited {lag:.0f} s (limit {max_lag:g} s)")
        if expired > max_expired:
            problems.append(f"{expired} expired lease(s) (limit {max_expired})")
        if lag <= max_lag and expired <= max_expired:
            which = "queue lag" if queue is None else f"queue {queue} lag"
            facts.append(
                f"{which} {lag:.0f} s, {expired} expired lease(s), {stats.live_workers} live worker(s)"
            )


def _unused(queue: str) -> str | None:
    """Why nothing uses the queue ``queue`` (which has no queued or running job), or None.

    Used means: a registered task's queue (as ``runworker`` finds them), in
    ``LEASEJOBS["QUEUES"]``, paused or limited (a row of its own), or the
    queue of any job, finished ones too (the last, slowest look).
    """
    from leasejobs.models import Job, Queue

    discover()
    used = {task.queue for task in registry.all_tasks().values()}
    if queue in used or queue in (conf.get("QUEUES") or {}):
        return None
    if Queue.objects.using(db_alias()).filter(name=queue).exists():
        return None
    if Job.objects.using(db_alias()).filter(queue=queue).exists():
        return None
    named = ", ".join(sorted(used)) or "none"
    return (
        f"queue {queue!r} has no jobs and no registered task uses it: check the name "
        f"(the registered tasks use {named}), or declare a queue that only .using(queue=...) "
        f"reaches in LEASEJOBS['QUEUES'] ({{{queue!r}: {{}}}})"
    )
