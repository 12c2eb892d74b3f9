"""The integration half of tests/unit/test_jobs_command.py: its tests that start workers or commit."""

import subprocess
import sys

import psycopg

from leasejobs.db.connection import connection_params
from tests.adminpages import make_job
from tests.helpers import ROOT, wait_until, worker_env
from tests.unit.test_jobs_command import now


def test_a_job_claimed_between_match_and_write_is_left_alone(transactional_db):
    """A real race: the command matches two failed jobs; a "worker" holds one of
    them in an uncommitted claim; when that commits, the command's fenced
    write no longer matches it."""
    first = make_job(status="failed", attempt=2, max_attempts=2, last_error="boom")
    raced = make_job(status="failed", attempt=2, max_attempts=2, last_error="boom")
    with psycopg.connect(**connection_params()) as other:
        other.execute(
            "UPDATE leasejobs_job SET status = 'running', finished_at = NULL, attempt = attempt + 1"
            " WHERE id = %s",
            [raced.id],
        )  # uncommitted: the command still reads the job as failed, attempt 2
        command = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "leasejobs_jobs", "retry", "--error", "boom"],
            cwd=ROOT,
            env=worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            with psycopg.connect(**connection_params(), autocommit=True) as watcher:
                wait_until(
                    lambda: watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND query LIKE '%%UPDATE leasejobs_job%%'"
                    ).fetchone()[0],
                    timeout=60,
                    what="the command's write waiting on the claimed row",
                )
            other.commit()
            output, _ = command.communicate(timeout=60)
        finally:
            if command.poll() is None:
                command.kill()
                command.wait(timeout=10)
    assert output == "1 job(s) retried of 2 matched. 1 changed since they were matched and were left alone.\n"
    assert (now(first).status, now(raced).status, now(raced).attempt) == ("queued", "running", 3)
