"""``manage.py runworker``: run a leasejobs worker until stopped."""

import gc
import logging
import signal
import sys
from typing import Any

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import maintenance, pooling
from leasejobs.db.connection import connection_params
from leasejobs.db.rows import validate_queue, validate_worker_id
from leasejobs.jobs.discovery import discover
from leasejobs.management.arguments import (
    grace_seconds,
    lease_seconds,
    non_negative_int,
    port,
    positive_int,
    wait_seconds,
)
from leasejobs.observability import observe
from leasejobs.observability.logformat import FORMATS, JsonFormatter
from leasejobs.operations import autovacuum
from leasejobs.worker import Worker, WorkerOptions


class Command(BaseCommand):
    help = (
        "Run a leasejobs worker: claim due jobs, run their bodies in child processes under a "
        "heartbeated lease, and stop cleanly on SIGTERM/SIGINT."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="Q",
            help="Only claim jobs of this queue (repeatable; default: all queues).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=4,
            metavar="N",
            help="Job bodies run at once, each in a child process of its own (default 4).",
        )
        parser.add_argument(
            "--max-jobs-per-child",
            type=positive_int,
            metavar="N",
            help="A child process leaves after N bodies and a fresh one takes its place (default: never).",
        )
        parser.add_argument(
            "--max-memory-per-child",
            type=positive_int,
            metavar="MIB",
            help="A child process leaves after a body once its own memory passes this many MiB "
            "(default: never).",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            metavar="N",
            help="Give the child processes up to N jobs ahead of the ones they run, only as many as "
            "start within 20 ms (default LEASEJOBS['PREFETCH']; 0: none ahead).",
        )
        parser.add_argument(
            "--lease",
            type=lease_seconds,
            metavar="SECONDS",
            help="Lease of a claim, at least 1 second, unless the task sets lease_seconds "
            "(default LEASEJOBS['LEASE_SECONDS']).",
        )
        parser.add_argument(
            "--heartbeat",
            type=wait_seconds,
            metavar="SECONDS",
            help="Extend held leases this often (default: a third of each job's lease).",
        )
        parser.add_argument(
            "--no-heartbeat",
            action="store_true",
            help="Never extend leases. Unsafe: kept to reproduce the double run.",
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="The DATABASES alias holding the queue (default LEASEJOBS['DATABASE'], 'default').",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit 0 once no job is ready to claim (it says how many retries wait for later).",
        )
        parser.add_argument(
            "--wait-for-retries",
            action="store_true",
            help="With --burst: exit only once no retry or snooze of its queues waits for later either.",
        )
        parser.add_argument(
            "--max-jobs",
            type=positive_int,
            metavar="N",
            help="Exit after claiming N jobs and finishing them.",
        )
        parser.add_argument(
            "--worker-id", metavar="ID", help="This worker's id (default: host, pid and a random suffix)."
        )
        parser.add_argument(
            "--grace",
            type=grace_seconds,
            default=10.0,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, let running jobs finish this long before "
            "giving their leases back (default 10).",
        )
        parser.add_argument(
            "--metrics-port",
            type=port,
            metavar="PORT",
            help="Serve Prometheus metrics on this port (default LEASEJOBS['METRICS_PORT']; "
            "needs leasejobs[metrics]).",
        )
        parser.add_argument(
            "--log-format",
            choices=FORMATS,
            help="One line of text or one JSON object per event (default LEASEJOBS['LOG_FORMAT']).",
        )

        parser.add_argument(
            "--no-periodic",
            action="store_true",
            help="Never enqueue periodic jobs from this worker (by default every worker does, "
            "and each tick is still enqueued once).",
        )
        parser.add_argument(
            "--no-vacuum",
            action="store_true",
            help="Never VACUUM leasejobs_job from this worker (by default a worker whose role may "
            "does, when dead row versions pile up: LEASEJOBS['VACUUM_THRESHOLD']), nor store the "
            "admin overview's chart points (its vacuum thread's other step).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        _use_database(options["database"])
        worker_options = self._worker_options(options)
        log_format = options["log_format"] or conf.get("LOG_FORMAT")
        if log_format not in FORMATS:  # leasejobs.E006 says so first, unless checks were skipped
            raise CommandError(f"LEASEJOBS['LOG_FORMAT'] must be 'text' or 'json', not {log_format!r}.")
        _configure_logging(options["verbosity"], log_format)
        self._check_database()
        worker_options.connections = _connection_plan()
        discover()
        _tune_garbage_collector()
        worker = Worker(worker_options)
        worker.start_children()  # forks the zygote: before observe.start's metrics thread
        try:
            observe.start(worker.worker_id, worker_options.concurrency, options["metrics_port"])
        except (RuntimeError, OSError) as exc:
            raise CommandError(f"Cannot serve metrics: {exc}.") from None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: worker.request_stop())
        worker.run()

    def _worker_options(self, options: dict[str, Any]) -> WorkerOptions:
        queues = options["queues"]
        worker_id = options["worker_id"]
        try:
            for q in queues or []:
                validate_queue(q, "--queue")
            if worker_id is not None:
                validate_worker_id(worker_id, "--worker-id")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["wait_for_retries"] and not options["burst"]:
            raise CommandError("--wait-for-retries only makes sense with --burst; add --burst.")
        if options["heartbeat"] and options["no_heartbeat"]:
            raise CommandError("--heartbeat and --no-heartbeat contradict each other; give one.")
        result = WorkerOptions(
            queues=queues,
            concurrency=options["concurrency"],
            lease_seconds=options["lease"],
            heartbeat_seconds=options["heartbeat"],
            heartbeat=not options["no_heartbeat"],
            burst=options["burst"],
            wait_for_retries=options["wait_for_retries"],
            max_jobs=options["max_jobs"],
            grace_seconds=options["grace"],
            prefetch=options["prefetch"],
            periodic=not options["no_periodic"],
            vacuum=not options["no_vacuum"],
            max_jobs_per_child=options["max_jobs_per_child"],
            max_memory_per_child=(
                None if options["max_memory_per_child"] is None else options["max_memory_per_child"] * 2**20
            ),
        )
        if worker_id:
            result.worker_id = worker_id
        lease = result.lease_seconds
        if lease is None:
            lease = float(conf.get("LEASE_SECONDS"))
        if result.heartbeat_seconds is not None and result.heartbeat_seconds >= lease:
            raise CommandError(
                f"--heartbeat {result.heartbeat_seconds:g} must be shorter than the lease ({lease:g} s), "
                "or leases run out between heartbeats."
            )
        return result

    def _check_database(self) -> None:
        """Fail fast, in one sentence, when the database is unreachable or unmigrated.

        And warn, in one line, when autovacuum does not visit the job table.
        """
        params = connection_params()
        where = f"{params.get('host') or 'local socket'}:{params.get('port') or 5432}/{params.get('dbname')}"
        try:
            with psycopg.connect(**params) as conn:
                found = maintenance.table_exists(conn)
                unvacuumed = autovacuum.status_problem(conn)
        except psycopg.Error as exc:
            raise CommandError(
                f"Cannot reach the database at {where} ({_reason(exc)}). Check DATABASE_URL or "
                f"DATABASES[{db_alias()!r}] and that PostgreSQL is running."
            ) from None
        if not found:
            raise CommandError(
                f"The leasejobs tables are missing in {where}: run `python manage.py migrate` first."
            )
        if unvacuumed:
            logging.getLogger("leasejobs.worker").warning("%s Database: %s.", unvacuumed, where)


def _use_database(alias: str | None) -> None:
    """``--database``: this process's queue lives in ``alias`` (LEASEJOBS['DATABASE'] for it)."""
    if alias is not None:
        settings.LEASEJOBS = {**(getattr(settings, "LEASEJOBS", None) or {}), "DATABASE": alias}
    if db_alias() not in connections.settings:
        raise CommandError(f"The queue's database alias {db_alias()!r} is not in DATABASES.")


def _connection_plan() -> pooling.ConnectionPlan:
    """Detect a transaction pooler; refuse, in one sentence, settings that cannot work with it."""
    try:
        plan = pooling.plan()
    except pooling.PoolingError as exc:
        raise CommandError(str(exc)) from None
    except psycopg.Error as exc:
        raise CommandError(f"Cannot reach the LISTEN database ({_reason(exc)}).") from None
    if plan.pooled and (found := pooling.problems()):
        raise CommandError(found[0])
    return plan


def _reason(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


def _configure_logging(verbosity: int, log_format: str) -> None:
    """Show the worker's one-line events on stderr unless logging is configured.

    ``-v 0``: problems only (WARNING). ``-v 1``, the default: also start, stop,
    cancels and releases (INFO), unless LOGGING set another level. ``-v 2``:
    also a line per claimed and finished job (DEBUG).

    ``json`` also switches the handlers that configured logging put on the
    ``leasejobs`` logger or the root logger to ``JsonFormatter``: asking for
    JSON on the command line must give JSON whatever LOGGING says.
    """
    logger = logging.getLogger("leasejobs")
    if verbosity == 0:
        logger.setLevel(logging.WARNING)
    elif verbosity >= 2:
        logger.setLevel(logging.DEBUG)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        stream: logging.Handler = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(stream)
    if log_format == "json":
        for handler in [*logger.handlers, *logging.getLogger().handlers]:
            handler.setFormatter(JsonFormatter())


def _tune_garbage_collector() -> None:
    """Keep the cycle collector from walking what does not change.

    Everything imported so far (Django, the project, its tasks) lives as long
    as the process: frozen, a full collection looks only at what jobs made
    (each used to walk the whole project: about 0.1 s per 100,000 no-op jobs),
    and the children forked afterwards share those pages with the zygote
    instead of copying each one a collection would touch.
    A claim makes a few objects per job that stay alive until the job ends, so
    the default young-generation threshold collected in the middle of nearly
    every claim and moved those objects up a generation to be walked again;
    at 10,000 most of them are gone by the next collection. Together this
    cut the collector's cost per no-op job to a fraction (docs/performance.md).
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(10_000, older, oldest)
