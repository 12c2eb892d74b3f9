"""Throughput with limits on: ``mixed`` (a limited queue beside an unlimited one,
drained by the same workers) and ``rate`` (a burst under a rate limit: the most
claims in any window, from the database's claim times).

    DJANGO_SETTINGS_MODULE=tests.settings LEASEJOBS_DB_NAME=lj_bench \\
        .venv/bin/python bench/queue_controls/limits.py mixed --plain 20000 --limited 2000 --concurrency 4
    ... limits.py rate --jobs 10000 --rate 100/m --seconds 150

Deletes every job, queue control and place of that database first.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
django.setup()

from django.db import connection  # noqa: E402

from leasejobs.queues import controls  # noqa: E402
from tests.testapp.tasks import add  # noqa: E402


def workers(n: int, *args: str) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runworker", "-v", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(n)
    ]


def query(statement: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def mixed(args: argparse.Namespace) -> None:
    controls.set_limits("limited", concurrency=args.concurrency)
    add.using(queue="plain").bulk_enqueue([((1, 2), {})] * args.plain)
    add.using(queue="limited").bulk_enqueue([((1, 2), {})] * args.limited)
    query("ANALYZE leasejobs_job")
    for proc in workers(2, "--burst", "--concurrency", "4"):
        proc.wait(timeout=900)
    for queue, n, seconds in query(
        "SELECT queue, count(*), extract(epoch FROM max(finished_at) - min(started_at)) "
        "FROM leasejobs_job WHERE status = 'done' GROUP BY queue ORDER BY queue"
    ):
        print(f"{queue:8} {n:7,} jobs in {seconds:6.2f} s = {n / float(seconds):8,.0f} jobs/s")


def rate(args: argparse.Namespace) -> None:
    count, window = controls.parse_rate(args.rate)
    controls.set_limits("email", rate=args.rate)
    add.using(queue="email").bulk_enqueue([((1, 2), {})] * args.jobs)
    procs = workers(2, "--concurrency", "8")
    time.sleep(args.seconds)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=60)
    [(claims, most, span)] = query(
        """
        SELECT count(*),
               (SELECT max(n) FROM (
                    SELECT (SELECT count(*) FROM leasejobs_job AS b
                            WHERE b.started_at >= a.started_at
                              AND b.started_at < a.started_at + make_interval(secs => %s)) AS n
                    FROM leasejobs_job AS a WHERE a.started_at IS NOT NULL) AS w),
               extract(epoch FROM max(started_at) - min(started_at))
        FROM leasejobs_job WHERE started_at IS NOT NULL
        """,
        [window],
    )
    print(
        f"{args.jobs:,} queued under {args.rate}, 2 workers x 8 runners, {args.seconds:g} s: {claims} claims "
        f"over {float(span):.1f} s; most in any {window:g} s window: {most} (limit {count})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("mixed")
    m.add_argument("--plain", type=int, default=20000)
    m.add_argument("--limited", type=int, default=2000)
    m.add_argument("--concurrency", type=int, default=4)
    r = sub.add_parser("rate")
    r.add_argument("--jobs", type=int, default=10000)
    r.add_argument("--rate", default="100/m")
    r.add_argument("--seconds", type=float, default=150)
    args = parser.parse_args()
    query("DELETE FROM leasejobs_job; DELETE FROM leasejobs_queue; DELETE FROM leasejobs_slot")
    {"mixed": mixed, "rate": rate}[args.what](args)


if __name__ == "__main__":
    main()
