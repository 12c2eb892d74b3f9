"""What the claim's first look costs while the xmin horizon is pinned: from its index's front, or from a key.

    .venv/bin/python bench/pinned_front.py --url postgres://postgres@127.0.0.1:5432/lj_scratch

Needs a migrated database; it adds ``--jobs`` jobs to a queue of its own
(``pinned-front``) and deletes them at the end. One session holds an xid
(``BEGIN; SELECT txid_current();``) while ``--finished`` of the jobs are
claimed and finished in batches of 1,000, as workers would (two updates
each, their row versions left dead and not removable). Then the claim's
first step, the first unfinished job in claim order, is run under
``EXPLAIN (ANALYZE, BUFFERS)`` on a connection set up as the claim's: once
from the front of the claim's index, as every claim starts today, and once
from the key of the last job claimed (``(run_at, id)`` after it, within the
priority). Then the worker's front look (``FRONT_LOOK``, which walks from
the front to that key). Prints the three, as JSON: buffers touched and
milliseconds, the third of three runs of each.

The ``WHERE`` names ``status`` and ``finished_at IS NULL`` both, so the look
stays on the claim's index whichever predicate it has (``bench/pressure.py``'s
``PROBE`` does the same).
"""

import argparse
import json
from typing import Any

import psycopg

from leasejobs.db.sql.claim import FRONT_LOOK
from leasejobs.db.store import LOOKUP_PLANS

QUEUE = "pinned-front"
#: The claim connection's plan settings (``leasejobs.db.store.CLAIM_SETTINGS``).
CLAIM_OPTIONS = " ".join(f"-c {name}={value}" for name, value in LOOKUP_PLANS.items())

FRONT = """
SELECT id FROM leasejobs_job WHERE status IN ('queued', 'running') AND finished_at IS NULL
ORDER BY priority DESC, run_at, id LIMIT 1
"""
FROM_KEY = """
SELECT id FROM leasejobs_job WHERE status IN ('queued', 'running') AND finished_at IS NULL
  AND priority = 0 AND (run_at, id) > (%s, %s)
ORDER BY priority DESC, run_at, id LIMIT 1
"""
INSERT = """
INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, runs, snoozes,
    max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at)
SELECT 'bench.pinned_front', %(queue)s, 0, '[]', '{}', 'queued', 0, 0, 0,
       1, now() + g * interval '1 us', '', false, '', NULL, NULL, now()
FROM generate_series(1, %(jobs)s) AS g
"""
CLAIM = """
UPDATE leasejobs_job SET status = 'running', attempt = 1, runs = 1, leased_by = 'w',
    started_at = clock_timestamp(), lease_until = now() + interval '30 s'
WHERE queue = %s AND id >= %s AND id < %s
"""
FINISH = """
UPDATE leasejobs_job SET status = 'done', lease_until = NULL, finished_at = clock_timestamp(), result = 'null'
WHERE queue = %s AND id >= %s AND id < %s
"""


def look(
    conn: psycopg.Connection[Any], query: str, params: list[Any] | dict[str, Any] | None = None
) -> dict[str, float]:
    """Buffers and milliseconds of ``query``, the third of three runs (hint bits set by then)."""
    plan: dict[str, Any] = {}
    for _ in range(3):
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
        assert row is not None
        plan = row[0][0]
    return {
        "buffers": plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"],
        "ms": round(plan["Execution Time"], 3),
    }


def look_params(run_at: Any, job_id: int) -> dict[str, Any]:
    """``FRONT_LOOK``'s parameters for a worker whose one key (priority 0) is this job."""
    return {
        "after_priorities": [0],
        "after_run_ats": [str(run_at)],
        "after_ids": [job_id],
        "queues": [QUEUE],
        "job_id": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--finished", type=int, default=150_000)
    args = parser.parse_args()
    with (
        psycopg.connect(args.url, autocommit=True) as conn,
        psycopg.connect(args.url, autocommit=True) as pin,
        psycopg.connect(args.url, autocommit=True, options=CLAIM_OPTIONS) as claim,
    ):
        conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [QUEUE])
        conn.execute("VACUUM leasejobs_job")
        pin.execute("BEGIN")
        pin.execute("SELECT txid_current()")
        try:
            conn.execute(INSERT, {"queue": QUEUE, "jobs": args.jobs})
            row = conn.execute("SELECT min(id) FROM leasejobs_job WHERE queue = %s", [QUEUE]).fetchone()
            assert row is not None
            first = int(row[0])
            for low in range(first, first + args.finished, 1000):
                high = min(low + 1000, first + args.finished)
                conn.execute(CLAIM, [QUEUE, low, high])
                conn.execute(FINISH, [QUEUE, low, high])
            last = conn.execute(
                "SELECT run_at, id FROM leasejobs_job WHERE id = %s", [first + args.finished - 1]
            ).fetchone()
            assert last is not None
            result = {
                "jobs": args.jobs,
                "finished_while_pinned": args.finished,
                "from_the_front": look(claim, FRONT),
                "from_the_last_claimed_key": look(claim, FROM_KEY, list(last)),
                "front_look": look(claim, FRONT_LOOK, look_params(*last)),
            }
        finally:
            pin.execute("ROLLBACK")
        print(json.dumps(result))
        conn.execute("DELETE FROM leasejobs_job WHERE queue = %s", [QUEUE])
        conn.execute("VACUUM leasejobs_job")


if __name__ == "__main__":
    main()
