"""Run the same no-op workload on leasejobs, PgQueuer and procrastinate, back to back.

Run it through ``run.sh`` (which makes the comparison virtualenv). What it
does, for each queue, on the PostgreSQL server of ``DATABASE_URL``:

- enqueue: 10,000 jobs one call each, then 10 calls of 1,000 (the peers'
  bulk APIs; leasejobs' ``bulk_enqueue``);
- processing: ``--jobs`` no-op jobs queued, then real worker processes of
  that queue drain them; jobs/s runs from the first claim to the last
  completion, from the timestamps each queue writes itself (leasejobs:
  ``started_at``/``finished_at``; PgQueuer: ``pgqueuer_log`` picked and
  successful; procrastinate: ``procrastinate_events`` started and
  succeeded). The configurations are each peer's default and the best one
  found in the project's peer benchmark (shared/research/peer-benchmark.md);
- leasejobs goes through ``manage.py leasejobs_bench --json``, which also
  measures the raw-SQL limit in the same run.

Each peer gets a database of its own (``leasejobs_compare_<peer>``, dropped and
created anew); leasejobs uses ``DATABASE_URL`` itself. The medians of
``--repeat`` runs are printed as one table; ``--json-out`` keeps everything.
"""

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the project: bench.host and bench.dbcost need no Django
from bench import dbcost  # noqa: E402
from bench.host import STEAL_SHOWN, cpu_ticks, steal_share  # noqa: E402

VENV_BIN = Path(sys.executable).parent

#: (label, processes, extra worker arguments) of a peer's worker processes.
Configs = list[tuple[str, int, list[str]]]

#: Each peer's default, then its best.
PGQUEUER_CONFIGS: Configs = [
    ("default (batch 10), 1 process", 1, ["--batch-size", "10"]),
    ("default (batch 10), 2 processes", 2, ["--batch-size", "10"]),
    ("batch 50, 2 processes (best)", 2, ["--batch-size", "50"]),
]
PROCRASTINATE_CONFIGS: Configs = [
    ("default (concurrency 1), 1 process", 1, ["--concurrency", "1"]),
    ("concurrency 16, 2 processes (best)", 2, ["--concurrency", "16"]),
]

#: --workload io: every queue runs 64 jobs at once per process, two processes.
IO_CONFIGS: dict[str, Configs] = {
    # batch_size alone does not bound PgQueuer's jobs in flight: max_concurrent_tasks does
    # (at least twice the batch).
    "pgqueuer": [
        ("batch 32, 64 at once, 2 processes", 2, ["--batch-size", "32", "--max-concurrent-tasks", "64"])
    ],
    "procrastinate": [("concurrency 64, 2 processes", 2, ["--concurrency", "64"])],
}
#: --workload cpu: each queue's default concurrency, one process and two. With
#: two, the workers want both of this machine's cores and PostgreSQL gets
#: none: one process shows what a worker makes of its own core.
CPU_CONFIGS: dict[str, Configs] = {
    "pgqueuer": [
        ("default (batch 10), 1 process", 1, ["--batch-size", "10"]),
        ("default (batch 10), 2 processes", 2, ["--batch-size", "10"]),
    ],
    "procrastinate": [
        ("default (concurrency 1), 1 process", 1, ["--concurrency", "1"]),
        ("default (concurrency 1), 2 processes", 2, ["--concurrency", "1"]),
    ],
}
#: Seconds of arrivals before a flow's window opens (--flow-ab), for the workers to reach
#: their steady state.
FLOW_WARMUP = 10.0
#: leasejobs' --concurrency (child processes) per worker in each of these workloads.
LEASEJOBS_CONCURRENCY = {"io": "64", "cpu": "4"}


class Work:
    """What each processing job does (``--workload``), and the ideal jobs/s of a configuration."""

    def __init__(self, kind: str, seconds: float) -> None:
        self.kind = kind
        self.seconds = seconds
        #: The peers' entrypoint or task name (leasejobs' bench tasks have the same).
        self.name = {"noop": "noop", "io": "sleep", "cpu": "spin"}[kind]

    def ideal(self, processes: int, concurrency: int, *, children: bool = False) -> float | None:
        """Every runner always waiting (io); every busy process one core, as many as the
        machine has (cpu). ``children``: each of a process's ``concurrency`` bodies runs
        in a child process of its own (leasejobs), so CPU-bound bodies use that many cores."""
        if self.kind == "io":
            return processes * concurrency / self.seconds
        if self.kind == "cpu":
            busy = processes * concurrency if children else processes
            return min(busy, os.cpu_count() or 1) / self.seconds
        return None

    def describe(self) -> str:
        if self.kind == "noop":
            return "no-op"
        what = "waiting (sleep)" if self.kind == "io" else "CPU-bound"
        return f"{what}, {self.seconds * 1000:g} ms"


def peer_dsn(base: str, peer: str) -> str:
    """``base`` with its database replaced by ``leasejobs_compare_<peer>``."""
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/leasejobs_compare_{peer}"))


def recreate_database(base: str, dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def run_workers(commands: list[list[str]], env: dict[str, str], timeout: float) -> None:
    """Start worker processes that exit once the queue is empty; wait for all."""
    procs = [
        subprocess.Popen(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for cmd in commands
    ]
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"{commands[0][:3]}... did not drain the queue in {timeout:.0f} s") from None
        if proc.returncode != 0:
            tail = out.decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(commands[0][:4])} exited {proc.returncode}:\n{tail}")


def analyze(dsn: str, table: str) -> None:
    """Fresh statistics for a peer's queue table before its workers start.

    Right after a bulk enqueue the statistics still describe an empty table,
    and a queue whose statements do not guard against that gets poor plans
    (procrastinate drained 10,000 jobs 3 times slower). Autovacuum would
    analyze within a minute; the peers get it at once. leasejobs does not
    (its statements find their rows through the same indexes either way).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ANALYZE {table}")


def wait_connected(dsn: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until a worker is connected to ``dsn``, and a second more for it to LISTEN.

    (A PgQueuer worker's one connection runs its dequeue after LISTEN, so
    ``pg_stat_activity`` never shows it waiting in LISTEN.)
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not one_row(
            conn,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )[0]:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the worker did not connect within 30 s")
            time.sleep(0.1)
    time.sleep(1.0)


def latencies(ms: list[float]) -> dict[str, float]:
    """p50, p95, p99 (linear between closest ranks, as leasejobs_bench) and max, in ms."""
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return {"jobs": len(ms), "p50": cuts[49], "p95": cuts[94], "p99": cuts[98], "max": max(ms)}


def one_row(
    conn: psycopg.Connection[tuple[Any, ...]], query: str, params: tuple[Any, ...] | None = None
) -> tuple[Any, ...]:
    """The row of a statement that always returns one (an aggregate)."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row


def chunks(jobs: int, chunk: int) -> list[int]:
    """The sizes of the calls that enqueue ``jobs`` at most ``chunk`` at a time."""
    return [min(chunk, jobs - start) for start in range(0, jobs, chunk)]


def timed(fn: Callable[[], object], jobs: int) -> float:
    started = time.perf_counter()
    fn()
    return jobs / (time.perf_counter() - started)


# -- PgQueuer ---------------------------------------------------------------------


def costed(dsn: str, jobs: int, drain: Callable[[], float], costs: list[dict[str, Any]]) -> float:
    """Run ``drain`` (enqueue and process ``jobs`` jobs), appending its database cost per job to ``costs``.

    The peers' workers exit at the end of a drain, taking their backends'
    CPU time with them: it is read for leasejobs only (``leasejobs_bench``).
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        checkpointed = dbcost.checkpoint(conn)
        before = dbcost.read(conn)
        rate = drain()
        time.sleep(1.1)  # a backend still open reports its counters at most a second later
        costs.append(dbcost.per_job(before, dbcost.read(conn), {}, {}, jobs, checkpointed=checkpointed))
    return rate


class PgQueuerBench:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        #: The database's cost per job of each processing run (``costed``), in order.
        self.costs: list[dict[str, Any]] = []
        self.env = {**os.environ, "PEER_DSN": dsn, "PYTHONPATH": str(HERE)}
        subprocess.run([str(VENV_BIN / "pgq"), "--pg-dsn", dsn, "install"], check=True, capture_output=True)

    def reset(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
            conn.execute("VACUUM ANALYZE pgqueuer")

    async def _enqueue(self, jobs: int, chunk: int | None, work: Work | None = None) -> float:
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(self.dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            name = work.name if work else "noop"
            payload = str(work.seconds).encode() if work and work.kind != "noop" else None
            started = time.perf_counter()
            if chunk is None:
                for _ in range(jobs):
                    await queries.enqueue(name, payload)
            else:
                for n in chunks(jobs, chunk):
                    await queries.enqueue([name] * n, [payload] * n, [0] * n)
            return jobs / (time.perf_counter() - started)
        finally:
            await conn.close()

    def enqueue(self, jobs: int, chunk: int | None = None, work: Work | None = None) -> float:
        self.reset()
        return asyncio.run(self._enqueue(jobs, chunk, work))

    async def _stamps(self, jobs: int, rate: float) -> None:
        """Enqueue ``jobs`` stamp jobs at ``rate`` per second, each carrying its enqueue call's time;
        how long each call took goes to ``enqueue_ms``."""
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(self.dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            next_at = time.monotonic()
            for _ in range(jobs):
                next_at += 1 / rate
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                began = time.perf_counter()
                await queries.enqueue("stamp", str(time.time()).encode())
                self.enqueue_ms.append((time.perf_counter() - began) * 1000)
        finally:
            await conn.close()

    def latency(self, jobs: int, rate: float, args: list[str]) -> dict[str, float]:
        """Enqueue-to-start latency with one idle worker, as ``leasejobs_bench`` measures its own."""
        self.reset()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "latency"
            path.touch()
            env = {**self.env, "PEER_LATENCY_FILE": str(path)}
            cmd = [sys.executable, str(HERE / "run_pgqueuer.py"), "peers:pgqueuer_factory", *args]
            proc = subprocess.Popen(
                cmd, cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            try:
                wait_connected(self.dsn, proc)
                self.enqueue_ms: list[float] = []
                asyncio.run(self._stamps(jobs, rate))
                deadline = time.monotonic() + 30
                while len(path.read_text().split()) < jobs:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("PgQueuer did not run the latency jobs within 30 s")
                    time.sleep(0.05)
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            figures = latencies([float(x) * 1000 for x in path.read_text().split()])
            figures["enqueue_p50"] = statistics.median(self.enqueue_ms)
            return figures

    def process(self, jobs: int, processes: int, args: list[str], work: Work | None = None) -> float:
        self.reset()
        return costed(self.dsn, jobs, lambda: self._drain(jobs, processes, args, work), self.costs)

    def _drain(self, jobs: int, processes: int, args: list[str], work: Work | None) -> float:
        asyncio.run(self._enqueue(jobs, 1000, work))
        analyze(self.dsn, "pgqueuer")
        cmd = [sys.executable, str(HERE / "run_pgqueuer.py"), "peers:pgqueuer_factory", "--mode", "drain"]
        run_workers([cmd + args] * processes, self.env, timeout=600)
        with psycopg.connect(self.dsn) as conn:
            done, seconds = one_row(
                conn,
                "SELECT count(*) FILTER (WHERE status = 'successful'),"
                " extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
                "                  - min(created) FILTER (WHERE status = 'picked'))"
                " FROM pgqueuer_log",
            )
        if done != jobs:
            raise RuntimeError(f"PgQueuer finished {done} of {jobs} jobs")
        return jobs / float(seconds)

    async def _arrive(self, rate: float, stop: threading.Event) -> None:
        """No-op jobs at ``rate`` per second until ``stop``, one bulk enqueue every 10 ms, as
        ``leasejobs_bench``'s arrivals offer them (``bench/run.py``, ``_arriving``)."""
        import asyncpg
        from pgqueuer import Queries
        from pgqueuer.db import AsyncpgDriver

        conn = await asyncpg.connect(self.dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            owed, next_at = 0.0, time.monotonic()
            while not stop.is_set():
                next_at += 0.01
                owed += rate * 0.01
                if (n := int(owed)) > 0:
                    await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
                    owed -= n
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await conn.close()

    def flow(self, rate: float, seconds: float, processes: int, args: list[str]) -> dict[str, Any]:
        """The database's cost per job finished while jobs arrive and leave at ``rate`` per
        second for ``seconds`` (after ``FLOW_WARMUP``, a checkpoint just before the window), as
        ``leasejobs_bench --pressure none`` measures leasejobs' clean phase."""
        self.reset()
        stop = threading.Event()
        producer = threading.Thread(target=lambda: asyncio.run(self._arrive(rate, stop)), name="arrivals")
        cmd = [sys.executable, str(HERE / "run_pgqueuer.py"), "peers:pgqueuer_factory", *args]
        procs = [
            subprocess.Popen(cmd, cwd=HERE, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            for _ in range(processes)
        ]
        try:
            for proc in procs:
                wait_connected(self.dsn, proc)
            producer.start()
            time.sleep(FLOW_WARMUP)
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                checkpointed = dbcost.checkpoint(conn)
                before = dbcost.read(conn)
                began = one_row(conn, "SELECT now()")[0]
                time.sleep(seconds)
                after = dbcost.read(conn)
                ended = one_row(conn, "SELECT now()")[0]
                finished = one_row(
                    conn,
                    "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
                    " AND created >= %s AND created < %s",
                    (began, ended),
                )[0]
        finally:
            stop.set()
            if producer.is_alive():
                producer.join()
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if not finished:
            raise RuntimeError("PgQueuer finished no job in the flow's window")
        cost = dbcost.per_job(before, after, {}, {}, int(finished), checkpointed=checkpointed)
        cost["jobs_per_s"] = finished / seconds
        return cost


# -- procrastinate ----------------------------------------------------------------


class ProcrastinateBench:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        #: The database's cost per job of each processing run (``costed``), in order.
        self.costs: list[dict[str, Any]] = []
        self.env = {**os.environ, "PEER_DSN": dsn, "PYTHONPATH": str(HERE)}
        self.cli = [str(VENV_BIN / "procrastinate"), "--app", "peers.procrastinate_app"]
        schema = [*self.cli, "schema", "--apply"]
        subprocess.run(schema, check=True, capture_output=True, env=self.env, cwd=HERE)

    def reset(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE procrastinate_jobs, procrastinate_events CASCADE")
            conn.execute("VACUUM ANALYZE procrastinate_jobs")

    def enqueue(self, jobs: int, chunk: int | None = None, work: Work | None = None) -> float:
        self.reset()
        return self._defer(jobs, chunk, work)

    def _defer(self, jobs: int, chunk: int | None, work: Work | None) -> float:
        from bench.compare import peers

        app = peers.procrastinate_sync_app(self.dsn)
        kwargs = {"seconds": work.seconds} if work and work.kind != "noop" else {}
        with app.open():
            deferrer = app.configure_task(work.name if work else "noop")
            if chunk is None:
                return timed(lambda: [deferrer.defer(**kwargs) for _ in range(jobs)], jobs)
            return timed(lambda: [deferrer.batch_defer(*[kwargs] * n) for n in chunks(jobs, chunk)], jobs)

    def process(self, jobs: int, processes: int, args: list[str], work: Work | None = None) -> float:
        self.reset()
        return costed(self.dsn, jobs, lambda: self._drain(jobs, processes, args, work), self.costs)

    def _drain(self, jobs: int, processes: int, args: list[str], work: Work | None) -> float:
        self._defer(jobs, 1000, work)
        analyze(self.dsn, "procrastinate_jobs")
        cmd = [*self.cli, "--log-level", "warning", "worker", "--one-shot", *args]
        run_workers([cmd] * processes, self.env, timeout=900)
        with psycopg.connect(self.dsn) as conn:
            done, seconds = one_row(
                conn,
                "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
                " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
                "                  - min(at) FILTER (WHERE type = 'started'))"
                " FROM procrastinate_events",
            )
        if done != jobs:
            raise RuntimeError(f"procrastinate finished {done} of {jobs} jobs")
        return jobs / float(seconds)


# -- leasejobs ----------------------------------------------------------------------


def run_leasejobs_bench(args: argparse.Namespace, *options: str) -> dict[str, Any]:
    """``manage.py leasejobs_bench --json --jobs N`` with ``options``, in the project's virtualenv."""
    cmd = [
        args.leasejobs_python,
        str(args.project / "manage.py"),
        "leasejobs_bench",
        "--json",
        "--jobs",
        str(args.jobs),
    ]
    out = subprocess.run([*cmd, *options], cwd=args.project, capture_output=True, text=True)
    if out.returncode != 0:
        # Its own error (a database missing, say) is the last line of what it printed.
        said = (out.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise SystemExit(f"leasejobs_bench exited {out.returncode}: {said}")
    return dict(json.loads(out.stdout))


def leasejobs(args: argparse.Namespace, work: Work) -> dict[str, Any]:
    cmd = ["--repeat", str(args.repeat), "--worker-log-level", args.leasejobs_log_level]
    if work.kind == "noop" and args.latency_jobs:
        cmd += ["--latency-jobs", str(args.latency_jobs), "--latency-rate", str(args.latency_rate)]
    else:
        cmd += ["--latency-jobs", "0"]
    if work.kind == "noop":
        cmd += [
            "--workers", "1,2",
            "--concurrency", args.leasejobs_concurrency,
            "--enqueue-jobs", str(args.enqueue_jobs),
            "--raw-sql", "--raw-batches", "1,10,50", "--raw-clients", "1,2",
        ]  # fmt: skip
    else:
        cmd += [
            "--workers", "2" if work.kind == "io" else "1,2",
            "--concurrency", LEASEJOBS_CONCURRENCY[work.kind],
            "--enqueue-jobs", "0",
            "--workload", work.kind,
            f"--{work.kind}-seconds", str(work.seconds),
        ]  # fmt: skip
    return run_leasejobs_bench(args, *cmd)


def leasejobs_defaults(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, Any]]:
    """One processing run of leasejobs at ``runworker``'s defaults (2 processes), per log level:
    the jobs/s and the database's cost per job."""
    options = ["--repeat", "1", "--workers", "2", "--concurrency", "4", "--worker-log-level", "info,warning"]
    results = run_leasejobs_bench(args, *options, "--enqueue-jobs", "0", "--latency-jobs", "0")
    rates = {f["log_level"]: f["median"] for f in results["processing"]}
    return rates, {f["log_level"]: f.get("database") for f in results["processing"]}


def latency_ab(args: argparse.Namespace, base: str) -> dict[str, Any]:
    """Idle enqueue-to-start latency of leasejobs (``runworker``'s defaults, one process) and
    PgQueuer (its default, one process), alternating, ``--latency-ab`` rounds.

    A few hundred jobs at 20 a second measure mostly how fast an idle machine
    wakes its processes, which drifts by half a millisecond within minutes
    here: only rounds taken back to back compare the two.
    """
    dsn = peer_dsn(base, "pgqueuer")
    recreate_database(base, dsn)
    pgqueuer = PgQueuerBench(dsn)
    jobs, rate = args.latency_jobs or 200, args.latency_rate
    rounds: list[dict[str, Any]] = []
    for i in range(args.latency_ab):
        print(f"... round {i + 1} of {args.latency_ab}: leasejobs, then PgQueuer", file=sys.stderr)
        ours = run_leasejobs_bench(
            args,
            "--jobs",
            "0",
            "--enqueue-jobs",
            "0",
            "--latency-jobs",
            str(jobs),
            "--latency-rate",
            str(rate),
        )["latency_ms"]
        peer = pgqueuer.latency(jobs, rate, ["--batch-size", "10"])
        rounds.append({"leasejobs": ours, "pgqueuer": peer})
    print(
        f"\nidle enqueue-to-start latency, {jobs} jobs at {rate:g}/s per run, one process each, alternating\n"
    )
    print(
        "round  leasejobs p50 / p95 / p99 ms (enqueue call)  PgQueuer p50 / p95 / p99 ms (enqueue call)"
        "  p50 ratio"
    )
    ratios = []
    for i, r in enumerate(rounds, 1):
        a, b = r["leasejobs"], r["pgqueuer"]
        ratios.append(a["p50"] / b["p50"])
        print(
            f"{i:>5}  {a['p50']:>12.2f} / {a['p95']:.2f} / {a['p99']:.2f} ({a['enqueue_p50']:.2f})"
            f"  {b['p50']:>11.2f} / {b['p95']:.2f} / {b['p99']:.2f} ({b['enqueue_p50']:.2f})"
            f"  {ratios[-1]:>9.2f}"
        )
    medians = {
        (q, f): statistics.median(r[q][f] for r in rounds)
        for q in ("leasejobs", "pgqueuer")
        for f in ("p50", "enqueue_p50")
    }
    print(
        f"\nmedian p50: leasejobs {medians['leasejobs', 'p50']:.2f} ms, PgQueuer"
        f" {medians['pgqueuer', 'p50']:.2f} ms; median ratio {statistics.median(ratios):.2f}"
        f"\nof which the enqueue call (p50): leasejobs {medians['leasejobs', 'enqueue_p50']:.2f} ms,"
        f" PgQueuer {medians['pgqueuer', 'enqueue_p50']:.2f} ms; the rest (the difference):"
        f" leasejobs {medians['leasejobs', 'p50'] - medians['leasejobs', 'enqueue_p50']:.2f} ms,"
        f" PgQueuer {medians['pgqueuer', 'p50'] - medians['pgqueuer', 'enqueue_p50']:.2f} ms"
    )
    return {"jobs": jobs, "rate": rate, "rounds": rounds}


def ab_defaults(args: argparse.Namespace, base: str) -> dict[str, Any]:
    """leasejobs at its defaults against PgQueuer's best configuration, alternating, ``--ab`` rounds.

    A round is one run of each, back to back, so that both see the same
    machine: on a shared machine the speed drifts within minutes, and medians
    taken a quarter of an hour apart compare two machines.
    """
    dsn = peer_dsn(base, "pgqueuer")
    recreate_database(base, dsn)
    pgqueuer = PgQueuerBench(dsn)
    best = PGQUEUER_CONFIGS[-1]
    rounds: list[dict[str, Any]] = []
    for i in range(args.ab):
        print(
            f"... round {i + 1} of {args.ab}: leasejobs (INFO, -v 0), then PgQueuer {best[0]}",
            file=sys.stderr,
        )
        leasejobs_rates, leasejobs_costs = leasejobs_defaults(args)
        peer = pgqueuer.process(args.jobs, best[1], best[2])
        rounds.append(
            {
                "info": leasejobs_rates["info"],
                "warning": leasejobs_rates["warning"],
                "pgqueuer": peer,
                "database": {"leasejobs": leasejobs_costs["info"], "pgqueuer": pgqueuer.costs[-1]},
            }
        )
    ratios = [r["info"] / r["pgqueuer"] for r in rounds]
    of_quiet = [r["info"] / r["warning"] for r in rounds]
    print(f"\n{args.jobs:,} no-op jobs per run, two worker processes each, rounds alternating\n")
    print("round  leasejobs INFO  leasejobs -v 0  PgQueuer best  INFO/PgQueuer  INFO/-v 0")
    for i, (r, ratio, quiet) in enumerate(zip(rounds, ratios, of_quiet, strict=True), 1):
        print(
            f"{i:>5}  {r['info']:>14,.0f}  {r['warning']:>14,.0f}  {r['pgqueuer']:>13,.0f}"
            f"  {ratio:>13.2f}  {quiet:>9.0%}"
        )
    median_ratio, median_quiet = statistics.median(ratios), statistics.median(of_quiet)
    print(f"\nmedian INFO/PgQueuer {median_ratio:.2f}, median INFO/-v 0 {median_quiet:.0%}")
    print("\nthe database per job, enqueue to finish (bench/dbcost.py), medians of the rounds")
    for queue in ("leasejobs", "pgqueuer"):
        costs = [r["database"][queue] for r in rounds if r["database"][queue]]
        if costs:
            print(f"  {queue:<10}  {database_text(dbcost.median(costs))}")
    return {
        "pgqueuer_config": best[0],
        "rounds": rounds,
        "median_ratio": median_ratio,
        "median_of_quiet": median_quiet,
    }


def flow_ab(args: argparse.Namespace, base: str) -> dict[str, Any]:
    """The database's cost per job in a steady flow: leasejobs at its defaults (2 processes)
    against PgQueuer's best configuration, no-op jobs arriving at ``--flow-rate`` per second
    in bulk inserts every 10 ms, a ``--flow-seconds`` window after a checkpoint, alternating
    ``--flow-ab`` rounds.

    A processing run enqueues every job before the first claim, so pages fill
    before any update needs room in them; in a flow, as production runs jobs,
    each job is inserted, claimed and finished within milliseconds.
    """
    dsn = peer_dsn(base, "pgqueuer")
    recreate_database(base, dsn)
    pgqueuer = PgQueuerBench(dsn)
    best = PGQUEUER_CONFIGS[-1]
    rate, seconds = args.flow_rate, args.flow_seconds
    rounds: list[dict[str, Any]] = []
    for i in range(args.flow_ab):
        print(f"... round {i + 1} of {args.flow_ab}: leasejobs, then PgQueuer {best[0]}", file=sys.stderr)
        ours = run_leasejobs_bench(
            args,
            "--pressure",
            "none",
            "--rate",
            str(rate),
            "--phases",
            f"{seconds:g},1,1",
            "--workers",
            "2",
            "--concurrency",
            "4",
        )
        peer = pgqueuer.flow(rate, seconds, best[1], best[2])
        rounds.append({"leasejobs": ours["clean_database"], "pgqueuer": peer})
    print(f"\nno-op jobs arriving at {rate:,.0f}/s, {seconds:g} s windows, two worker processes each\n")
    ratios = []
    for i, r in enumerate(rounds, 1):
        a, b = r["leasejobs"], r["pgqueuer"]
        ratios.append(a["wal_bytes"] / b["wal_bytes"])
        print(f"round {i}  leasejobs  {database_text(a)}")
        print(f"         PgQueuer   {database_text(b)}  ({b['jobs_per_s']:,.0f} jobs/s)")
        print(f"         WAL ratio  {ratios[-1]:.2f}")
    median = statistics.median(ratios)
    print(f"\nmedian WAL per job, leasejobs / PgQueuer: {median:.2f}")
    return {
        "rate": rate,
        "seconds": seconds,
        "pgqueuer_config": best[0],
        "rounds": rounds,
        "median_ratio": median,
    }


def database_text(d: dict[str, Any]) -> str:
    """WAL, full-page images, transactions and row versions per job; PostgreSQL CPU where read."""
    text = (
        f"WAL {d['wal_bytes']:>6,.0f} B  FPI {d['wal_fpi'] or 0:.3f}  transactions {d['xacts']:.2f}"
        f"  row versions {d['rows_written']:.2f} ({d['dead_rows']:.2f} dead)"
    )
    if d.get("pg_cpu_us") is not None:
        text += f"  PostgreSQL CPU {d['pg_cpu_us']:.1f} µs"
    return text + ("" if d["checkpointed"] else "  (no checkpoint before)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--enqueue-jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--project", type=Path, default=HERE.parent.parent)
    parser.add_argument("--leasejobs-python", default=str(HERE.parent.parent / ".venv" / "bin" / "python"))
    parser.add_argument("--leasejobs-concurrency", default="4")
    parser.add_argument("--leasejobs-log-level", default="warning,info", help="warning, info or both")
    parser.add_argument("--only", choices=["leasejobs", "pgqueuer", "procrastinate"], action="append")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--workload",
        choices=["noop", "io", "cpu"],
        default="noop",
        help="noop (the default); io: each job waits --io-seconds, 64 at a time per process; "
        "cpu: each job spends --cpu-seconds of CPU in pure Python, one process and two. No enqueue figures.",
    )
    parser.add_argument(
        "--latency-jobs",
        type=int,
        default=200,
        help="Jobs for the idle enqueue-to-start latency of leasejobs and PgQueuer (200; 0 skips).",
    )
    parser.add_argument("--latency-rate", type=float, default=20.0, help="Latency jobs per second (20).")
    parser.add_argument("--io-seconds", type=float, default=0.05)
    parser.add_argument("--cpu-seconds", type=float, default=0.005)
    parser.add_argument(
        "--ab",
        type=int,
        metavar="ROUNDS",
        help="Only leasejobs at runworker's defaults (2 processes, INFO and -v 0) against PgQueuer's "
        "best configuration, one run each per round, alternating ROUNDS times.",
    )
    parser.add_argument(
        "--latency-ab",
        type=int,
        metavar="ROUNDS",
        help="Only the idle enqueue-to-start latency of leasejobs and PgQueuer, one run each per "
        "round, alternating ROUNDS times (--latency-jobs jobs at --latency-rate).",
    )
    parser.add_argument(
        "--flow-ab",
        type=int,
        metavar="ROUNDS",
        help="Only the database's cost per job in a steady flow (--flow-rate jobs/s, --flow-seconds "
        "windows): leasejobs at its defaults against PgQueuer's best, alternating ROUNDS times.",
    )
    parser.add_argument(
        "--flow-rate", type=float, default=2000.0, help="Jobs per second of --flow-ab (2,000)."
    )
    parser.add_argument("--flow-seconds", type=float, default=60.0, help="Window of --flow-ab, s (60).")
    args = parser.parse_args()
    work = Work(args.workload, {"io": args.io_seconds, "cpu": args.cpu_seconds}.get(args.workload, 0.0))
    base = os.environ.get("DATABASE_URL")
    if not base:
        sys.exit("Set DATABASE_URL to a PostgreSQL database (leasejobs uses it; the peers get their own).")
    load = os.getloadavg()
    run_ticks = cpu_ticks()
    if args.latency_ab:
        figures = latency_ab(args, base)
        if args.json_out:
            args.json_out.write_text(json.dumps({"load_before": load, "latency_ab": figures}, indent=2))
        return
    if args.flow_ab:
        flow = flow_ab(args, base)
        if args.json_out:
            args.json_out.write_text(
                json.dumps({"load_before": load, "flow_ab": flow}, indent=2, default=str)
            )
        return
    if args.ab:
        ab = ab_defaults(args, base)
        if args.json_out:
            args.json_out.write_text(json.dumps({"load_before": load, "jobs": args.jobs, "ab": ab}, indent=2))
        return
    only = set(args.only or ["leasejobs", "pgqueuer", "procrastinate"])
    rows: list[tuple[str, str, str, float, list[float]]] = []  # what, queue, config, median, runs
    ideals: dict[tuple[str, str], float | None] = {}  # (queue, config): the workload's ideal jobs/s
    results: dict[str, Any] = {
        "load_before": load,
        "jobs": args.jobs,
        "repeat": args.repeat,
        "workload": {"kind": work.kind, "seconds": work.seconds},
    }

    steals: dict[tuple[str, str], float] = {}  # (queue, config): the most the host took in one run
    costs: dict[tuple[str, str], dict[str, Any]] = {}  # (queue, config): the database per job

    def measure(queue: str, config: str, what: str, fn: Callable[[], float]) -> None:
        print(f"... {queue}: {what}, {config}", file=sys.stderr, flush=True)
        runs = []
        for _ in range(args.repeat):
            ticks = cpu_ticks()
            runs.append(fn())
            if (stolen := steal_share(ticks, cpu_ticks())) is not None:
                steals[(queue, config)] = max(stolen, steals.get((queue, config), 0.0))
        rows.append((what, queue, config, statistics.median(runs), runs))

    if "leasejobs" in only:
        print("... leasejobs: manage.py leasejobs_bench --json", file=sys.stderr, flush=True)
        lj = results["leasejobs"] = leasejobs(args, work)
        if "enqueue" in lj:
            rows.append(("enqueue single", "leasejobs", "task.enqueue()", lj["enqueue"]["single"], []))
            for key, cursors in (
                ("bare_insert_django", "one cursor"),
                ("bare_insert_django_cursor_each", "a cursor each"),
                ("bare_insert_django_notify", "one cursor, with enqueue()'s NOTIFY"),
            ):
                if key in lj["enqueue"]:
                    config = f"one row, Django's connection, {cursors}"
                    rows.append(("enqueue single", "bare INSERT", config, lj["enqueue"][key], []))
            rows.append(("enqueue bulk", "leasejobs", "bulk_enqueue, 1,000/call", lj["enqueue"]["bulk"], []))
            if "bulk_ids" in lj["enqueue"]:
                ids = lj["enqueue"]["bulk_ids"]
                rows.append(("enqueue bulk", "leasejobs", "bulk_enqueue_ids, 1,000/call", ids, []))
        if "raw_insert" in lj:
            raw = lj["raw_insert"]
            rows.append(("enqueue single", "raw SQL limit", "prepared INSERT, one row", raw["single"], []))
            rows.append(("enqueue bulk", "raw SQL limit", "INSERT of 1,000 rows", raw["bulk"], []))
        for f in lj["processing"]:
            config = f"concurrency {f['concurrency']}, {f['workers']} process(es), {f['log_level'].upper()}"
            rows.append(("processing", "leasejobs", config, f["median"], f["runs"]))
            if f.get("database"):
                costs[("leasejobs", config)] = f["database"]
            ideals[("leasejobs", config)] = work.ideal(f["workers"], f["concurrency"], children=True)
            if stolen := [x for x in f.get("steal", []) if x is not None]:
                steals[("leasejobs", config)] = max(stolen)
        for r in lj.get("raw_sql", []):
            config = f"{r['batch']} per statement, {r['clients']} client(s)"
            rows.append(("processing", "raw SQL limit", config, r["median"], r["runs"]))
    peers: list[tuple[str, PgQueuerBench | ProcrastinateBench, Configs]] = []
    configs_by_peer = {"noop": None, "io": IO_CONFIGS, "cpu": CPU_CONFIGS}[work.kind]
    if "pgqueuer" in only:
        dsn = peer_dsn(base, "pgqueuer")
        recreate_database(base, dsn)
        configs = configs_by_peer["pgqueuer"] if configs_by_peer else PGQUEUER_CONFIGS
        peers.append(("PgQueuer 1.6", PgQueuerBench(dsn), configs))
    if "procrastinate" in only:
        dsn = peer_dsn(base, "procrastinate")
        recreate_database(base, dsn)
        configs = configs_by_peer["procrastinate"] if configs_by_peer else PROCRASTINATE_CONFIGS
        peers.append(("procrastinate 3.10", ProcrastinateBench(dsn), configs))
    latency: list[tuple[str, str, dict[str, float]]] = []  # queue, config, figures
    if "latency_ms" in results.get("leasejobs", {}):
        latency.append(("leasejobs", "runworker defaults, 1 process", results["leasejobs"]["latency_ms"]))
    for name, peer, configs in peers:
        if work.kind == "noop" and args.latency_jobs and isinstance(peer, PgQueuerBench):
            print(f"... {name}: latency, default (batch 10), 1 process", file=sys.stderr, flush=True)
            figures = peer.latency(args.latency_jobs, args.latency_rate, ["--batch-size", "10"])
            latency.append((name, "default (batch 10), 1 process", figures))
        if args.enqueue_jobs and work.kind == "noop":
            n = args.enqueue_jobs
            measure(name, "one call per job", "enqueue single", functools.partial(peer.enqueue, n))
            measure(name, "1,000 per call", "enqueue bulk", functools.partial(peer.enqueue, n, 1000))
        for config, processes, extra in configs:
            run = functools.partial(peer.process, args.jobs, processes, extra, work)
            measure(name, config, "processing", run)
            ideals[(name, config)] = work.ideal(processes, int(extra[-1]))
            costs[(name, config)] = dbcost.median(peer.costs[-args.repeat :])

    results["latency"] = [{"queue": q, "config": c, **f} for q, c, f in latency]
    results["rows"] = [
        {"what": w, "queue": q, "config": c, "median": m, "runs": r, "ideal": ideals.get((q, c)),
         "steal": steals.get((q, c))}
        for w, q, c, m, r in rows
    ]  # fmt: skip
    print(
        f"\n{args.jobs:,} {work.describe()} jobs per processing run, median of {args.repeat}, "
        f"load before {' '.join(f'{x:.2f}' for x in load)}\n"
    )
    width_q = max(len(r[1]) for r in rows)
    width_c = max(len(r[2]) for r in rows)
    for what in ("processing", "enqueue single", "enqueue bulk"):
        print(what)
        for _, q, c, median, runs in sorted((r for r in rows if r[0] == what), key=lambda r: -r[3]):
            detail = f"  (runs: {', '.join(f'{x:,.0f}' for x in runs)})" if runs else ""
            if ideal := ideals.get((q, c)):
                detail += f"  {median / ideal:.0%} of the ideal {ideal:,.0f}"
            if what == "processing" and steals.get((q, c), 0.0) >= STEAL_SHOWN:
                detail += f"  host steal up to {steals[(q, c)]:.0%} of all CPUs' time in a run"
            print(f"  {q:<{width_q}}  {c:<{width_c}}  {median:>9,.0f} jobs/s{detail}")
        print()
    if costs:
        print("the database per job, enqueue to finish (bench/dbcost.py)")
        for (q, c), cost in costs.items():
            print(f"  {q:<{width_q}}  {c:<{width_c}}  {database_text(cost)}")
        print()
    results["database"] = [{"queue": q, "config": c, **cost} for (q, c), cost in costs.items()]
    if latency:
        print(f"idle enqueue-to-start latency, {args.latency_jobs} jobs at {args.latency_rate:g}/s")
        for q, c, f in latency:
            print(
                f"  {q:<{width_q}}  {c:<{width_c}}  p50 {f['p50']:.1f}  p95 {f['p95']:.1f}"
                f"  p99 {f['p99']:.1f}  max {f['max']:.1f} ms"
            )
        print()
    results["steal"] = steal_share(run_ticks, cpu_ticks())
    if results["steal"] is not None:
        print(
            f"CPU time taken by the host (steal) during the whole run: {results['steal']:.1%} of all CPUs' "
            "time (CPU only: it says nothing of the disk)"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
