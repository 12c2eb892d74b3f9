"""What a large limit costs a claim (issue 28, item 8): ``claim`` and ``drain``.

``claim``: a queue under ``--rate`` (default ``100000/d``, a daily API
quota: 100,000 places) with ``--jobs`` queued; ``--claims`` limited claims
of ``--size`` jobs each, run as the worker runs them (``WorkerStore``, its
claim connection), each timed, and each also run under ``EXPLAIN (ANALYZE,
WAL)`` (rolled back) for the WAL it writes, which counts this statement
only (``pg_current_wal_lsn`` counts every database of the server). Also
the place rows one claim leaves locked, read from the rows' ``xmax``.
``--held`` places are held (for a day) before the claims, as after a busy
morning.

``drain``: ``--plain`` no-op jobs of queue ``plain`` beside ``--limited``
jobs of queue ``quota`` under ``--rate`` (``none``: no limit), drained by
one ``runworker --burst --concurrency 4``; prints each queue's span, first
start to last finish, from the database's times.

    DJANGO_SETTINGS_MODULE=tests.settings LEASEJOBS_DB_NAME=lj_bench \\
        .venv/bin/python bench/queue_controls/big_rate.py claim
    ... big_rate.py drain --plain 3000 --limited 1000 --rate 100000/d
    ... big_rate.py drain --plain 3000 --limited 0 --rate none

Deletes every job, queue control and place of that database first.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
django.setup()

import psycopg  # noqa: E402
from django.db import connection  # noqa: E402

from leasejobs.db import sql  # noqa: E402
from leasejobs.db.connection import connection_params  # noqa: E402
from leasejobs.db.store import CLAIM_SETTINGS, LIMITED_SCAN_MIN, WorkerStore, claim_params  # noqa: E402
from leasejobs.queues import controls  # noqa: E402
from tests.testapp.tasks import add  # noqa: E402


def query(statement: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def reset() -> None:
    query("DELETE FROM leasejobs_job")
    query("DELETE FROM leasejobs_slot")
    query("DELETE FROM leasejobs_queue")


def claim(args: argparse.Namespace) -> None:
    reset()
    controls.set_limits("quota", rate=args.rate)
    add.using(queue="quota").bulk_enqueue([((1, 2), {})] * args.jobs)
    if args.held:
        query(
            "UPDATE leasejobs_slot SET held_until = now() + interval '1 day' WHERE kind = 'rate' AND n <= %s",
            [args.held],
        )
    query("VACUUM ANALYZE leasejobs_slot")
    query("ANALYZE leasejobs_job")
    params = claim_params(
        limit=args.size, counted=args.size, queues=None, lease_seconds=30, task_leases={}, worker_id="bench"
    )
    params["scan"] = max(args.size * 4, LIMITED_SCAN_MIN)
    options = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())
    with psycopg.connect(**connection_params(), options=options) as conn:
        for _ in range(3):
            explain = "EXPLAIN (ANALYZE, WAL, BUFFERS, FORMAT JSON) " + sql.CLAIM_LIMITED
            [(plan,)] = conn.execute(explain, params)
            conn.rollback()
            top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
            print(
                f"EXPLAIN (ANALYZE, WAL), rolled back: {top.get('WAL Bytes', 0):,} WAL bytes in "
                f"{top.get('WAL Records', 0):,} records, "
                f"{top['Shared Hit Blocks'] + top['Shared Read Blocks']:,} buffers, "
                f"{top['Actual Total Time']:.1f} ms"
            )
        # One committed claim: the place rows it locked, read back from xmax.
        taken = conn.execute(sql.CLAIM_LIMITED, params).fetchall()
        [(xid,)] = conn.execute("SELECT pg_current_xact_id()::text").fetchall()
        conn.commit()
    [(written, locked)] = query(
        # A row the claim updated keeps its lock on the new version (xmax): not "locked only".
        "SELECT count(*) FILTER (WHERE xmin::text = %s), "
        "count(*) FILTER (WHERE xmax::text = %s AND xmin::text <> %s) FROM leasejobs_slot",
        [xid, xid, xid],
    )
    print(f"one committed claim took {len(taken)} jobs: {written} place rows written, {locked} locked only")
    store = WorkerStore("bench", heartbeat_timeout=5.0)
    times = []
    claimed = 0
    for _ in range(args.claims):
        start = time.perf_counter()
        rows = store.claim(
            limit=args.size, counted=args.size, queues=None, lease_seconds=30, task_leases={}, limited=True
        )
        claimed += len(rows)
        times.append((time.perf_counter() - start) * 1000)
    store.close()
    print(
        f"{args.claims} claims of {args.size} ({claimed} jobs taken) under {args.rate}, "
        f"{args.held} places held: "
        f"median {statistics.median(times):.1f} ms, max {max(times):.1f} ms"
    )


def drain(args: argparse.Namespace) -> None:
    reset()
    if args.rate != "none":
        controls.set_limits("quota", rate=args.rate)
    add.using(queue="quota").bulk_enqueue([((1, 2), {})] * args.limited)
    add.using(queue="plain").bulk_enqueue([((1, 2), {})] * args.plain)
    query("ANALYZE leasejobs_job")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runworker", "-v", "0", "--burst", "--concurrency", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc.wait(timeout=900)
    print(f"worker ran {time.monotonic() - started:.1f} s")
    for queue, n, seconds in query(
        "SELECT queue, count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM leasejobs_job WHERE status = 'done' GROUP BY queue ORDER BY queue"
    ):
        print(f"{queue:8} {n:7,} jobs in {seconds:6.2f} s = {n / float(seconds):8,.0f} jobs/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("claim")
    one.add_argument("--rate", default="100000/d")
    one.add_argument("--jobs", type=int, default=1000)
    one.add_argument("--claims", type=int, default=10)
    one.add_argument("--size", type=int, default=4)
    one.add_argument("--held", type=int, default=0)
    one.set_defaults(run=claim)
    two = sub.add_parser("drain")
    two.add_argument("--rate", default="100000/d")
    two.add_argument("--plain", type=int, default=3000)
    two.add_argument("--limited", type=int, default=1000)
    two.set_defaults(run=drain)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
