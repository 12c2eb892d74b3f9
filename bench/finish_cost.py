"""What the workflow settling costs ``FINISH`` on plain jobs (issue 31).

``python -m bench.finish_cost [--jobs N] [--batch B] [--rounds R]`` (from the
repository root, ``DATABASE_URL`` or ``LEASEJOBS_DB_NAME`` naming a database
no worker uses): N running plain jobs are finished B per statement with
``FINISH`` as it is, and with the same text without its ``settled`` part
(the statement as it was before workflows), alternating R rounds, through
one autocommit psycopg connection with prepared statements, as the
worker's finisher runs it. Prints the median time per statement of each.
"""

import argparse
import os
import statistics
import time

SETTLED_REF = " AND (SELECT count(*) FROM settled) >= 0"
QUEUE = "leasejobs-finish-cost"
WORKER = "finish-cost"


def without_settling(finish: str) -> str:
    """``FINISH`` without the workflow settling: its text before issue 31."""
    start = finish.index("settled AS (")
    end = finish.index("),\n", start) + 3
    text = finish[:start] + finish[end:]
    text = text.replace(", j.workflow_id\n", "\n", 1)
    text = text.replace(
        "\nWHERE (SELECT count(*) FROM woken) >= 0" + SETTLED_REF, " WHERE (SELECT count(*) FROM woken) >= 0"
    )
    assert "settle" not in text, text
    return text


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")
    import django

    django.setup()
    from bench.db import connect
    from leasejobs.db import sql

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    texts = {"before (no settling)": without_settling(sql.FINISH), "with settling": sql.FINISH}
    conn = connect()
    times: dict[str, list[float]] = {name: [] for name in texts}
    for _ in range(options.rounds):
        for name, text in texts.items():
            conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [QUEUE])
            conn.execute("VACUUM leasejobs_job")
            ids = [
                r[0]
                for r in conn.execute(
                    """
                    INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt,
                        max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids,
                        created_at, snoozes, lease_until, runs)
                    SELECT 'finish.cost', %s, 0, '[]', '{}', 'running', 1, 1, now(), %s, false, '', NULL,
                           NULL, now(), 0, now() + interval '1 hour', 1
                    FROM generate_series(1, %s) RETURNING id
                    """,
                    [QUEUE, WORKER, options.jobs],
                ).fetchall()
            ]
            spent = []
            for at in range(0, len(ids), options.batch):
                batch = ids[at : at + options.batch]
                n = len(batch)
                params = {
                    "ids": batch,
                    "attempts": [1] * n,
                    "statuses": ["done"] * n,
                    "results": ["null"] * n,
                    "last_errors": [None] * n,
                    "error_entries": [None] * n,
                    "retry_delays": [0.0] * n,
                    "run_deltas": [0] * n,
                    "snoozed": [False] * n,
                    "worker_id": WORKER,
                    "channel": "leasejobs-finish-cost",
                    "slotted": False,
                }
                started = time.perf_counter()
                rows = conn.execute(text, params, prepare=True).fetchall()
                spent.append(time.perf_counter() - started)
                assert len(rows) == n and all(r[2] for r in rows), rows[:3]
            times[name].append(statistics.median(spent) * 1e6)
    conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [QUEUE])
    print(f"FINISH of {options.batch} plain jobs per statement, {options.jobs:,} jobs per round:")
    for name, values in times.items():
        shown = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name}: median {statistics.median(values):.0f} us per statement (rounds: {shown})")
    a, b = (statistics.median(v) for v in times.values())
    print(f"  difference: {100 * (b - a) / a:+.1f} %")


if __name__ == "__main__":
    main()
