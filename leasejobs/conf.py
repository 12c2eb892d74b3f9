"""The ``LEASEJOBS`` setting, with its defaults.

Read at call time (not import time) so ``override_settings`` works in tests.
Unknown keys are reported by the system check ``leasejobs.E002`` (see
``leasejobs.checks``), once at start-up, not on every enqueue.
"""

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # How long a claim holds a job before another worker may take it over.
    "LEASE_SECONDS": 30,
    # Claims a job may have before a failure (or an expired lease) is final.
    "MAX_ATTEMPTS": 5,
    # Retry delay: RETRY_BACKOFF_SECONDS * 2**(attempt-1), jittered, capped
    # (the defaults of a task's RetryPolicy; see leasejobs.jobs.retry).
    "RETRY_BACKOFF_SECONDS": 2.0,
    "RETRY_BACKOFF_MAX_SECONDS": 3600.0,
    # How many times a job may ``raise Snooze(...)``; the snooze after that
    # fails it. Snoozes do not count toward MAX_ATTEMPTS.
    "MAX_SNOOZES": 100,
    # Extra modules to import for tasks, besides the ``tasks`` module of each app.
    "TASK_MODULES": [],
    # Encoded args + kwargs larger than this are refused at enqueue.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # How often an idle worker looks for due jobs when no NOTIFY arrives
    # (delayed jobs and retries become due without a notification).
    "POLL_INTERVAL_SECONDS": 1.0,
    # The LISTEN/NOTIFY channel that wakes workers on enqueue.
    "NOTIFY_CHANNEL": "leasejobs",
    # Most jobs a worker's children hold ahead of the ones they run (runworker
    # --prefetch). The worker shrinks it as jobs get slower, so that a job
    # given to a child starts within 20 ms (and a tenth of its lease): jobs
    # of a few tens of microseconds only reach it. 0: each child holds the
    # job it runs and no other.
    "PREFETCH": 1000,
    # Most bytes a worker holds at once of claimed jobs' arguments (waiting
    # or running) and of results and errors waiting to be written: with
    # large ones it claims fewer jobs ahead, so that a worker's memory
    # follows its settings, not its jobs (the first job of a claim is always
    # taken).
    "PREFETCH_BYTES": 16 * 1024 * 1024,
    # A body past its task's timeout_seconds (or whose worker stops) is
    # interrupted (BodyStopped is raised in it), and its process is killed if
    # it has not ended this many seconds later; only then is the attempt's
    # end written, and its place under a limit freed.
    "STOP_GRACE_SECONDS": 5.0,
    # Default limits per queue, across all workers (docs/queue-controls.md):
    # {"pdf": {"concurrency": 2}, "email": {"rate": "100/m"}}. Limits changed
    # at run time (admin, leasejobs.set_limits) win over these.
    "QUEUES": {},
    # Serve the worker's Prometheus metrics on this port (runworker
    # --metrics-port); None: off. Needs the leasejobs[metrics] extra.
    "METRICS_PORT": None,
    # OpenTelemetry spans for enqueue and attempts: None (on when
    # opentelemetry-api is installed and a tracer provider is set), or False.
    "OPENTELEMETRY": None,
    # While it works, a worker logs what it did (done=N failed=N ...) at INFO
    # this often.
    "SUMMARY_SECONDS": 60.0,
    # The worker's log lines: "text" or "json" (runworker --log-format).
    "LOG_FORMAT": "text",
    # Periodic schedules of tasks declared elsewhere (see leasejobs.periodic):
    # a list of dicts with task, cron, timezone, args, kwargs, name, catch_up,
    # max_catch_up, overlap, jitter_seconds.
    "PERIODIC": [],
    # The DATABASES alias holding the queue tables (runworker --database).
    # Transactional enqueue needs the queue in the same database as the rows.
    "DATABASE": "default",
    # Where the worker LISTENs when its queue database is reached through a
    # transaction pooler (PgBouncer, Supavisor, Neon), which cannot LISTEN: a
    # DATABASES alias or a postgres:// URL of a direct connection. Neither
    # set: the worker polls every POLL_INTERVAL_SECONDS instead.
    "LISTEN_DATABASE": None,
    "LISTEN_URL": None,
    # The worker VACUUMs leasejobs_job itself once this many dead row versions
    # (plus VACUUM_SCALE_FACTOR times the live rows) have piled up since the
    # table's last VACUUM: a backlog drained faster than autovacuum visits
    # slows every claim (docs/performance.md). None: never (runworker
    # --no-vacuum). Only a role that may VACUUM the table does.
    "VACUUM_THRESHOLD": 50_000,
    "VACUUM_SCALE_FACTOR": 0.1,
    # A walk from the claim index's front (what finds expired leases, jobs
    # given back and late commits) is costly when it took longer than this
    # many ms (less 0.2 ms a job it claimed); after three costly walks in a
    # row (a pinned xmin horizon) the next goes to a thread and a connection
    # of its own, beside the claims, until one is cheap. 0: always there.
    "FRONT_WALK_INLINE_MS": 5,
}


def get(name: str) -> Any:
    """Return one LEASEJOBS setting, falling back to its default."""
    user = getattr(settings, "LEASEJOBS", None) or {}
    return user.get(name, DEFAULTS[name])


def unknown_keys() -> list[str]:
    """Keys of LEASEJOBS that leasejobs does not know (typos, most likely)."""
    return sorted(set(getattr(settings, "LEASEJOBS", None) or {}) - set(DEFAULTS))


def db_alias() -> str:
    """The ``DATABASES`` alias holding the queue tables (``LEASEJOBS["DATABASE"]``).

    Its connection enqueues, runs side effects, the admin's actions and
    prunes; the worker's own connections copy its settings. Read at every
    call, like every setting, so ``runworker --database`` (which overrides
    the setting for its process) and ``override_settings`` apply.
    """
    return str(get("DATABASE"))


def task_modules() -> list[str]:
    """``LEASEJOBS["TASK_MODULES"]``, refused in one sentence unless it is a list of module paths.

    A bare string (``"myapp.tasks"``) would otherwise be imported letter by
    letter: ``No module named 'm'``. The system check ``leasejobs.E006`` says
    the same before anything is imported.
    """
    value = get("TASK_MODULES")
    if not isinstance(value, list | tuple) or not all(isinstance(m, str) and m.strip() for m in value):
        raise ValueError(
            "LEASEJOBS['TASK_MODULES'] must be a list of module paths, such as ['myapp.jobs'], "
            f"not {value!r}."
        )
    return list(value)
