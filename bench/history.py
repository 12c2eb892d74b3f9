"""Table and index size per million finished jobs, and vacuum at 10M finished rows (docs/scaling.md).

    .venv/bin/python bench/history.py --url postgres://postgres@127.0.0.1:5432/lj_scratch --rows 10000000

Needs a migrated scratch database that nothing else uses (it fills and empties
``leasejobs_job``). Prints one line per step: sizes after 1M and after
``--rows`` finished jobs; a VACUUM after a churn of 100,000 jobs (queued,
then done) with the finished rows kept; ``leasejobs_prune`` of those rows;
the same churn and VACUUM on the pruned table.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent

FINISHED = """
INSERT INTO leasejobs_job (
    task_name, queue, priority, args, kwargs, status, attempt, runs, max_attempts, run_at, leased_by,
    cancel_requested, last_error, errors, worker_ids, result, created_at, started_at, finished_at
)
SELECT 'app.tasks.send_receipt', 'default', 0, jsonb_build_array(g), '{}', 'done', 1, 1, 5,
       now() - interval '8 days' + g * interval '10 us', 'web-1-4242-abcdef', false, '', NULL,
       NULL, '{"created": true}', now() - interval '8 days',
       now() - interval '8 days', now() - interval '8 days' + g * interval '10 us'
FROM generate_series(%(first)s, %(last)s) AS g
"""

CHURN = [
    """
    INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, runs,
        max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at)
    SELECT 'app.tasks.churn', 'default', 0, '[]', '{}', 'queued', 0, 0, 5, now(), '', false, '', NULL,
           NULL, now()
    FROM generate_series(1, 100000)
    """,
    """
    UPDATE leasejobs_job SET status = 'running', attempt = 1, runs = 1, leased_by = 'w',
        lease_until = now() + interval '30 s', started_at = now()
    WHERE task_name = 'app.tasks.churn' AND status = 'queued'
    """,
    """
    UPDATE leasejobs_job SET status = 'done', lease_until = NULL, finished_at = now(), result = 'null'
    WHERE task_name = 'app.tasks.churn' AND status = 'running'
    """,
]

SIZES = """
SELECT pg_relation_size('leasejobs_job'), pg_indexes_size('leasejobs_job'),
       pg_total_relation_size('leasejobs_job') - pg_relation_size('leasejobs_job')
       - pg_indexes_size('leasejobs_job')
"""


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args()
    with psycopg.connect(args.url, autocommit=True) as conn:

        def step(what: str, statement: str, params: dict[str, int] | None = None) -> float:
            started = time.monotonic()
            conn.execute(statement, params)
            seconds = time.monotonic() - started
            print(f"{what}: {seconds:.1f} s", flush=True)
            return seconds

        def sizes(label: str, rows: int) -> None:
            row = conn.execute(SIZES).fetchone()
            assert row is not None
            table, indexes, toast = row
            per = 1_000_000 / rows
            print(
                f"{label}: table {mb(table)}, indexes {mb(indexes)}, toast+fsm+vm {mb(toast)}; "
                f"per million jobs: table {mb(table * per)}, indexes {mb(indexes * per)}",
                flush=True,
            )
            for name, size in conn.execute(
                "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index"
                " WHERE indrelid = 'leasejobs_job'::regclass ORDER BY 2 DESC"
            ).fetchall():
                print(f"    {name}: {mb(size)}", flush=True)

        conn.execute("TRUNCATE leasejobs_job CASCADE")
        done = 0
        for target in (1_000_000, args.rows):
            while done < target:
                chunk = min(1_000_000, target - done)
                step(
                    f"insert finished {done + 1:,}..{done + chunk:,}",
                    FINISHED,
                    {"first": done + 1, "last": done + chunk},
                )
                done += chunk
            step(f"VACUUM ANALYZE at {done:,} finished", "VACUUM ANALYZE leasejobs_job")
            sizes(f"{done:,} finished jobs", done)
        for statement in CHURN:
            step("churn 100,000 jobs", statement)
        step(f"VACUUM after the churn, {done:,} finished rows kept", "VACUUM leasejobs_job")
        env = {**os.environ, "DATABASE_URL": args.url, "LEASEJOBS_LOG_LEVEL": "WARNING"}
        started = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "leasejobs_prune",
                "--older-than",
                "7d",
                "--batch-size",
                "10000",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(
            f"leasejobs_prune --older-than 7d --batch-size 10000: {time.monotonic() - started:.1f} s ({out})",
            flush=True,
        )
        step("VACUUM after the prune", "VACUUM leasejobs_job")
        sizes("after prune + VACUUM (space kept for reuse)", max(1, done))
        for statement in CHURN:
            step("churn 100,000 jobs", statement)
        step("VACUUM after the churn, pruned table", "VACUUM leasejobs_job")
        conn.execute("TRUNCATE leasejobs_job CASCADE")


if __name__ == "__main__":
    main()
