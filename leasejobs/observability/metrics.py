"""The worker's Prometheus metrics (extra ``leasejobs[metrics]``: prometheus-client).

Imported only when a worker serves metrics (``runworker --metrics-port`` or
``LEASEJOBS["METRICS_PORT"]``), through ``leasejobs.observability.observe``. Names follow
the Prometheus conventions: a ``leasejobs_`` prefix, base units (seconds),
``_total`` on counters. docs/observability.md lists them all.

Labelled children are cached per (queue, task): a ``labels()`` call takes a
lock and builds a tuple, which is measurable at tens of thousands of jobs a
second.
"""

from prometheus_client import Counter, Gauge, Histogram, start_http_server

#: Statement latencies: a claim, heartbeat or finish takes about a millisecond
#: on a healthy server, a second is already bad.
STATEMENT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Job run and queue times: from no-op jobs to hour-long ones.
JOB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

LABELS = ("queue", "task")

claimed = Counter("leasejobs_jobs_claimed_total", "Jobs claimed by this worker.", LABELS)
finished = Counter(
    "leasejobs_jobs_finished_total",
    "Outcomes written by this worker (outcome: done, retried, failed, cancelled).",
    (*LABELS, "outcome"),
)
run_seconds = Histogram("leasejobs_job_run_seconds", "Time a job body ran.", LABELS, buckets=JOB_BUCKETS)
queue_seconds = Histogram(
    "leasejobs_job_queue_seconds",
    "Time from a job's run_at (when it was due) to its start.",
    LABELS,
    buckets=JOB_BUCKETS,
)
leases_lost = Counter(
    "leasejobs_leases_lost_total",
    "Attempts that found their lease gone (taken over, or no longer running).",
    LABELS,
)
stale_writes = Counter(
    "leasejobs_stale_writes_rejected_total",
    "Writes refused by the fence: a stale finish or side effect of an attempt that lost its job.",
    LABELS,
)
statement_seconds = Histogram(
    "leasejobs_statement_seconds",
    "Time of the worker's claim, heartbeat and finish statements.",
    ("statement",),
    buckets=STATEMENT_BUCKETS,
)
heartbeat_lag = Histogram(
    "leasejobs_heartbeat_lag_seconds",
    "How late a heartbeat tick ran after it was due.",
    buckets=STATEMENT_BUCKETS,
)
vacuum_seconds = Histogram(
    "leasejobs_vacuum_seconds",
    "Time of each VACUUM of leasejobs_job this worker ran (its _count: how many).",
    buckets=(*STATEMENT_BUCKETS, 10.0, 30.0, 60.0),
)
threads_busy = Gauge("leasejobs_threads_busy", "Job bodies running now (each in a child process).")
threads = Gauge("leasejobs_threads", "Bodies this worker runs at once (--concurrency).")
child_deaths = Counter(
    "leasejobs_child_deaths_total", "Child processes that died while they held jobs (a signal, an exit)."
)

claim_seconds = statement_seconds.labels("claim")
heartbeat_seconds = statement_seconds.labels("heartbeat")
finish_seconds = statement_seconds.labels("finish")

_children: dict[tuple[object, str, str], object] = {}


def child(metric: Counter | Histogram, queue: str, task: str) -> object:
    """``metric.labels(queue, task)``, cached."""
    key = (metric, queue, task)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(queue, task)
    return found


def outcome_child(queue: str, task: str, outcome: str) -> object:
    """``finished.labels(queue, task, outcome)``, cached."""
    key = (finished, queue, task + "\0" + outcome)
    found = _children.get(key)
    if found is None:
        found = _children[key] = finished.labels(queue, task, outcome)
    return found


def serve(port: int, concurrency: int) -> None:
    """Serve every metric of the default registry on ``port`` (all interfaces), in a thread."""
    threads.set(concurrency)
    start_http_server(port)
