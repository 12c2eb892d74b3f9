"""Workers through PgBouncer against workers on direct connections (docs/scaling.md).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/lj_scratch \\
        .venv/bin/python bench/pooler.py --workers 16 --concurrency 4 --jobs 20000 --pool 8

For each way in (direct, pgbouncer): enqueue ``--jobs`` no-op bench jobs,
start ``--workers`` ``runworker --burst`` processes, wait until they exit,
and report jobs/s (first start to last finish, database clock) and the
most server connections (client backends of the database) seen at once.
Run it on a scratch database that no other worker uses.
"""

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")

import django  # noqa: E402

django.setup()

import psycopg  # noqa: E402

from bench.tasks import QUEUE, register_tasks  # noqa: E402
from localworkers import database_url  # noqa: E402
from tests.pgbouncer import PgBouncer  # noqa: E402

WORKER = "import sys, django; django.setup(); from bench.tasks import worker_main; worker_main(sys.argv[1:])"


def peak_connections(url: str, dbname: str, stop: threading.Event, peak: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'"
                " AND pid <> pg_backend_pid()",
                [dbname],
            ).fetchone()
            assert row is not None
            peak[0] = max(peak[0], int(row[0]))
            time.sleep(0.05)


def run(way: str, worker_url: str, args: argparse.Namespace) -> dict[str, float]:
    direct = database_url()
    dbname = direct.rsplit("/", 1)[1]
    noop = register_tasks()["noop"]
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [QUEUE])
    left = args.jobs
    while left:
        noop.bulk_enqueue([((), {})] * min(left, 5000))
        left -= min(left, 5000)
    env = {
        **os.environ,
        "DATABASE_URL": worker_url,
        "LEASEJOBS_LISTEN_URL": direct,
        "DJANGO_DISABLE_SERVER_SIDE_CURSORS": "1",
        "LEASEJOBS_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(ROOT),
    }
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=peak_connections, args=(direct, dbname, stop, peak))
    sampler.start()
    argv = ["--burst", "--queue", QUEUE, "--concurrency", str(args.concurrency)]
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, *argv], env=env, stdin=subprocess.DEVNULL)
        for _ in range(args.workers)
    ]
    try:
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        stop.set()
        sampler.join()
    with psycopg.connect(direct) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE attempt <> 1),"
            " extract(epoch FROM max(finished_at) - min(started_at)) FROM leasejobs_job WHERE queue = %s",
            [QUEUE],
        ).fetchone()
    assert row is not None
    done, twice, seconds = row
    assert codes == [0] * len(procs), codes
    assert (done, twice) == (args.jobs, 0), (done, twice)
    return {"jobs_per_s": args.jobs / float(seconds), "peak_server_connections": peak[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--pool", type=int, default=8)
    args = parser.parse_args()
    direct = database_url()
    host, port = "127.0.0.1", int(direct.rsplit(":", 1)[1].split("/")[0])
    bouncer = PgBouncer(host, port, pool_size=args.pool, max_clients=args.workers * 8 + 50)
    try:
        for way, url in (("direct", direct), ("pgbouncer", bouncer.url(direct.rsplit("/", 1)[1]))):
            result = run(way, url, args)
            print(
                f"{way:9} {args.workers} workers x c{args.concurrency}, {args.jobs:,} jobs: "
                f"{result['jobs_per_s']:,.0f} jobs/s, at most {result['peak_server_connections']} "
                "server connections" + (f" (pool {args.pool} + LISTEN)" if way == "pgbouncer" else ""),
                flush=True,
            )
    finally:
        bouncer.remove()


if __name__ == "__main__":
    main()
