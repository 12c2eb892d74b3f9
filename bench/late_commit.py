"""Jobs that commit late (``leasejobs_bench --late-commit``).

A Django request that enqueues a job and then works on commits the job tens
of milliseconds after its INSERT stamped its ``run_at``, while jobs other
requests enqueued after it commit and are claimed first: the job lies behind
the place each worker claims on from (``leasejobs.worker.claim_start``).
This measures how soon such jobs start: ``--producers`` threads, each with
its own Django connection, enqueue one job at a time (``task.enqueue()``,
``ENQUEUE_PLAIN``) inside ``transaction.atomic()`` and commit it 0 to
``--commit-delay`` ms later (uniformly), each at ``PER_PRODUCER`` jobs a
second; the workers (the most of ``--workers``, at runworker's defaults)
take them. Pickup latency is counted from each job's commit (the database
clock read just after it) to its ``started_at``, through a clean phase and a
phase with a session idle in a transaction that holds an xid (the pinned
horizon of ``--pressure long-transaction``), the first two of ``--phases``.
"""

import random
import threading
import time
from typing import Any

from django.db import connection, transaction

from bench import pressure
from bench.run import Bench, _worker_args, percentile

#: Jobs a second each producer offers (a request rate, not a drain).
PER_PRODUCER = 100.0


class Producers:
    """Threads enqueueing one job per transaction, each committed 0 to ``delay_ms`` after its INSERT."""

    def __init__(self, b: Bench, count: int, delay_ms: float) -> None:
        self.task = b.tasks["noop"]
        self.delay_ms = delay_ms
        self.commits: dict[int, float] = {}  # job id -> the database clock just after its commit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, args=(n,), daemon=True) for n in range(count)]

    def __enter__(self) -> "Producers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _produce(self, seed: int) -> None:
        rnd = random.Random(seed)
        due = time.monotonic()
        try:
            while not self._stop.is_set():
                with transaction.atomic():
                    job = self.task.enqueue()
                    time.sleep(rnd.uniform(0, self.delay_ms) / 1000)
                with connection.cursor() as cursor:
                    cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
                    (committed,) = cursor.fetchone()
                with self._lock:
                    self.commits[job.pk] = committed
                due += 1 / PER_PRODUCER
                self._stop.wait(max(0.0, due - time.monotonic()))
        finally:
            connection.close()

    def committed_between(self, since: float, until: float) -> dict[int, float]:
        with self._lock:
            return {job_id: at for job_id, at in self.commits.items() if since <= at < until}


def latencies(b: Bench, commits: dict[int, float]) -> dict[str, Any]:
    """Pickup latency from commit to start, in ms, of these jobs (those not started are counted)."""
    rows = b.conn.execute(
        "SELECT id, extract(epoch FROM started_at)::float8 FROM leasejobs_job WHERE id = ANY(%s)",
        [list(commits)],
    ).fetchall()
    ms = sorted((started - commits[job_id]) * 1000 for job_id, started in rows if started is not None)
    return {
        "jobs": len(commits),
        "not_started": len(commits) - len(ms),
        **{f"p{q}": percentile(ms, q) if ms else None for q in (50, 99, 99.9)},
        "max": ms[-1] if ms else None,
        "over_1s": sum(1 for m in ms if m > 1000),
    }


def run(b: Bench, options: dict[str, Any], step: Any) -> dict[str, Any]:
    """The clean phase, then the pinned one, with ``--producers`` committing late."""
    producers, delay = options["producers"], options["commit_delay"]
    clean, pinned = options["phases"][0], options["phases"][1]
    workers = max(options["workers"])
    pressure.fresh_table(b)
    with b.workers(workers, _worker_args(options["concurrency"][0], options["prefetch"])) as group:
        with Producers(b, producers, delay) as offered:
            pressure.hold(pressure.WARMUP, group.check_alive)
            t0 = pressure.server_now(b)
            step(f"clean: {clean:g} s, {producers} producers committing 0 to {delay:g} ms late")
            pressure.hold(clean, group.check_alive)
            t1 = pressure.server_now(b)
            step(f"pinned (long-transaction): {pinned:g} s")
            with pressure.long_transaction(pinned):
                pressure.hold(pinned, group.check_alive)
                t2 = pressure.server_now(b)
        pressure.wait_drained(b, group)
        result = {
            "producers": producers,
            "commit_delay_ms": delay,
            "workers": workers,
            "clean": {**latencies(b, offered.committed_between(t0, t1)), "seconds": t1 - t0},
            # The first second of the pin is left out: jobs committed then were enqueued before it.
            "pinned": {**latencies(b, offered.committed_between(t1 + 1, t2)), "seconds": t2 - t1 - 1},
        }
    b.clear()
    return result


def render(result: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    lines = [
        f"late commits: {result['producers']} producers (at most {PER_PRODUCER:g} jobs/s each), each job "
        f"committed 0 to {result['commit_delay_ms']:g} ms after its INSERT; {result['workers']} worker(s); "
        "pickup latency from the commit",
        "",
        f"{'phase':8} {'jobs':>8} {'jobs/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'max ms':>9} "
        f"{'over 1 s':>9}",
    ]
    for phase in ("clean", "pinned"):
        f = result[phase]
        missing = f"  ({f['not_started']} not started)" if f["not_started"] else ""
        lines.append(
            f"{phase:8} {f['jobs']:>8,} {f['jobs'] / f['seconds']:>7,.0f} {ms(f['p50']):>8} "
            f"{ms(f['p99']):>8} {ms(f['p99.9']):>9} {ms(f['max']):>9} {f['over_1s']:>9,}{missing}"
        )
    return "\n".join(lines)
