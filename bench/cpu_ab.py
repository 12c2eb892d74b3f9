"""CPU per job of two leasejobs trees, alternating: the steady A/B on a noisy machine.

Its figures: docs/performance-history.md.

    .venv/bin/python bench/cpu_ab.py --tree base=/path/to/old/checkout:lj_bench_base \\
        --tree main=.:lj_bench --jobs 40000 --rounds 3 --levels warning,info

Each tree is a checkout with its own ``.venv`` and a migrated database of its
own on the same server (``postgresql://postgres@127.0.0.1:5432/<db>``, or
``--server``). Per run: queue ``--jobs`` no-op jobs due in an hour, ANALYZE,
start two ``runworker`` processes, wait until they listen, make the jobs due
(with a NOTIFY), wait until all are done, then read the CPU time of the two
worker processes, of their zygotes and children (where the bodies run) and
of their PostgreSQL backends from ``/proc`` (startup is not counted; the
finish and heartbeat connections, and children, that start during the drain
count whole). Wall-clock jobs/s come from the rows' own timestamps. Linux only.

``--workload io --concurrency 64``: each job waits ``--io-seconds`` (the bench's
``sleep`` task) in 64 children per worker, where the worker hears from its
children one body at a time rather than in batches.
"""

import argparse
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

HZ = os.sysconf("SC_CLK_TCK")
QUEUE = "leasejobs-bench"
WORKERS = 2


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of a process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / HZ


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a worker's zygote and children), from ``/proc``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{parent}/task/{task}/children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def value(conn: psycopg.Connection[tuple[Any, ...]], query: str, params: list[Any] | None = None) -> Any:
    """The first column of a statement that always returns one row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def backend_purposes(conn: psycopg.Connection[tuple[Any, ...]], known: list[int]) -> dict[int, str]:
    """The bench workers' backends not in ``known``, each with its connection's purpose
    (``application_name`` is "leasejobs PURPOSE WORKER_ID")."""
    return {
        pid: name.split()[1]
        for pid, name in conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE application_name LIKE 'leasejobs %%cpu-ab-%%' AND pid <> ALL(%s)",
            [known],
        )
    }


def bench_module(tree: Path) -> str:
    """Where the bench's tasks live in that tree: beside the library since issue 30, a package since 11."""
    if (tree / "bench/tasks.py").exists():
        return "bench.tasks"
    return "leasejobs.bench.tasks" if (tree / "leasejobs/bench/tasks.py").exists() else "leasejobs.bench"


class Workload(NamedTuple):
    """What each run's jobs do, and the workers' concurrency (None: runworker's default)."""

    task: str = "noop"
    args: tuple[float, ...] = ()
    concurrency: int | None = None


class Drain(NamedTuple):
    """What one drain cost, per job, and how fast it ran."""

    worker: float
    children: float
    backends: float
    rate: float
    #: The backends' µs/job by the purpose their connection names (claim,
    #: finish, heartbeat, vacuum, listen...): which statements to look at.
    by_purpose: dict[str, float]


def one_run(tree: Path, url: str, jobs: int, level: str, load: Workload) -> Drain:
    """The CPU per job of one drain, and its jobs/s."""
    module = bench_module(tree)
    python = str(tree / ".venv/bin/python")
    env = dict(os.environ, DATABASE_URL=url, PYTHONPATH=str(tree))
    env["DJANGO_SETTINGS_MODULE"] = "demo_site.settings"
    template = (
        f"import django; django.setup()\nfrom {module} import register_tasks\n"
        "from leasejobs.models import Job\nJob.objects.all().delete()\n"
        f"register_tasks()[{load.task!r}].bulk_enqueue([({load.args!r}, {{}})])\n"
    )
    subprocess.run([python, "-c", template], env=env, cwd=tree, check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        template_id = value(
            conn, "UPDATE leasejobs_job SET status = 'done', finished_at = now() RETURNING id"
        )
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = 'leasejobs_job' AND column_name <> 'id' ORDER BY ordinal_position"
            )
        ]
        values = {"status": "'queued'", "finished_at": "NULL", "run_at": "now() + interval '1 hour'"}
        conn.execute(
            f"INSERT INTO leasejobs_job ({', '.join(columns)})"
            f" SELECT {', '.join(values.get(c, 't.' + c) for c in columns)}"
            " FROM leasejobs_job AS t, generate_series(1, %s) WHERE t.id = %s",
            [jobs, template_id],
        )
        conn.execute("VACUUM ANALYZE leasejobs_job")
        code = (
            f"import sys, django; django.setup(); from {module} import worker_main; worker_main(sys.argv[1:])"
        )
        verbosity = "0" if level == "warning" else "1"
        more = [] if load.concurrency is None else ["--concurrency", str(load.concurrency)]
        procs = [
            subprocess.Popen(
                [python, "-c", code, "--queue", QUEUE, "--worker-id", f"cpu-ab-{i}", "-v", verbosity, *more],
                env=env,
                cwd=tree,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(WORKERS)
        ]
        try:
            deadline = time.monotonic() + 60
            while True:
                listening = value(
                    conn,
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'leasejobs %%cpu-ab-%%' AND query LIKE 'LISTEN%%'",
                )
                if listening >= WORKERS:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the workers did not start listening within 60 s")
                time.sleep(0.1)
            time.sleep(1)
            purposes = backend_purposes(conn, [])
            backends = list(purposes)
            children = [c for p in procs for c in descendants(p.pid)]
            pids = [p.pid for p in procs] + children + backends
            before = {pid: cpu_seconds(pid) for pid in pids}
            conn.execute("UPDATE leasejobs_job SET run_at = now() WHERE status = 'queued'")
            conn.execute("SELECT pg_notify('leasejobs', %s)", [QUEUE])
            deadline = time.monotonic() + 600
            while value(conn, "SELECT count(*) FROM leasejobs_job WHERE status <> 'done'"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the drain did not end within 600 s")
                time.sleep(0.05)
            # The finish and heartbeat connections open at their first use, during the drain:
            # all of their CPU is the drain's.
            purposes.update(backend_purposes(conn, backends))
            backends = list(purposes)
            children += [c for p in procs for c in descendants(p.pid) if c not in children]
            before.update({pid: 0.0 for pid in backends + children if pid not in before})
            pids = [p.pid for p in procs] + children + backends
            after = {pid: cpu_seconds(pid) for pid in pids}

            def used(group: list[int]) -> float:
                return sum(
                    a - b for p in group if (b := before[p]) is not None and (a := after[p]) is not None
                )

            span = value(
                conn,
                "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8"
                " FROM leasejobs_job WHERE id <> %s",
                [template_id],
            )
            by_purpose = {
                purpose: 1e6 * used([pid for pid, named in purposes.items() if named == purpose]) / jobs
                for purpose in sorted(set(purposes.values()))
            }
            return Drain(
                1e6 * used([p.pid for p in procs]) / jobs,
                1e6 * used(children) / jobs,
                1e6 * used(backends) / jobs,
                jobs / span,
                by_purpose,
            )
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR:DATABASE (twice)")
    parser.add_argument("--server", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="warning,info")
    parser.add_argument("--workload", choices=["noop", "io"], default="noop")
    parser.add_argument("--io-seconds", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=None, help="runworker's --concurrency")
    args = parser.parse_args()
    load = (
        Workload("sleep", (args.io_seconds,), args.concurrency)
        if args.workload == "io"
        else Workload(concurrency=args.concurrency)
    )
    trees = {}
    for spec in args.tree:
        name, rest = spec.split("=", 1)
        directory, database = rest.rsplit(":", 1)
        trees[name] = (Path(directory).resolve(), f"{args.server}/{database}")
    results: dict[tuple[str, str], list[Drain]] = {}
    for _ in range(args.rounds):
        for level in args.levels.split(","):
            for name, (tree, url) in trees.items():
                d = one_run(tree, url, args.jobs, level, load)
                results.setdefault((level, name), []).append(d)
                print(
                    f"{name} {level}: worker {d.worker:.1f} µs/job, children {d.children:.1f},"
                    f" backends {d.backends:.1f} ({purposes_line(d.by_purpose)}),"
                    f" total {d.worker + d.children + d.backends:.1f}; {d.rate:,.0f} jobs/s",
                    flush=True,
                )
    print("medians:")
    for (level, name), runs in results.items():
        print(
            f"  {level:8s} {name}: worker {statistics.median(r[0] for r in runs):.1f}"
            f"  children {statistics.median(r[1] for r in runs):.1f}"
            f"  backends {statistics.median(r[2] for r in runs):.1f}"
            f"  total {statistics.median(r[0] + r[1] + r[2] for r in runs):.1f} µs/job;"
            f" {statistics.median(r[3] for r in runs):,.0f} jobs/s"
        )
        purposes = sorted({purpose for r in runs for purpose in r.by_purpose})
        medians = {p: statistics.median(r.by_purpose.get(p, 0.0) for r in runs) for p in purposes}
        print(f"  {'':8s} {' ' * len(name)}  backends by purpose: {purposes_line(medians)}")


def purposes_line(by_purpose: dict[str, float]) -> str:
    """``claim 14.1, finish 15.0, ...``: the backends' µs/job by purpose."""
    return ", ".join(f"{purpose} {us:.1f}" for purpose, us in by_purpose.items())


if __name__ == "__main__":
    main()
