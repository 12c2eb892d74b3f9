"""``manage.py leasejobs_jobs list|retry|cancel``: filters, dry run, and the fence.

The race test runs the command as a real process while another connection
holds a matched job in an uncommitted claim: the command's write waits on
the row, then finds it claimed and leaves it alone.
"""

import datetime as dt
import subprocess
import sys
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from leasejobs.connection import connection_params
from leasejobs.models import Job
from tests.helpers import ROOT, wait_until, worker_env
from tests.test_admin import make_job


def run(*args: str) -> str:
    out = StringIO()
    call_command("leasejobs_jobs", *args, stdout=out)
    return out.getvalue()


def now(job: Job) -> Job:
    job.refresh_from_db()
    return job


@pytest.fixture
def jobs(db):
    declined = make_job(status="failed", attempt=5, max_attempts=5, last_error="PaymentDeclined: card 42")
    timeout = make_job(
        status="failed", attempt=3, max_attempts=3, last_error="TimeoutError: smtp", queue="mail"
    )
    old = make_job(status="failed", attempt=1, max_attempts=1, last_error="PaymentDeclined: card 7")
    Job.objects.filter(pk=old.pk).update(created_at=Now() - dt.timedelta(days=3))
    queued = make_job(task_name="shop.tasks.render_pdf")
    done = make_job(status="done", attempt=1)
    return {"declined": declined, "timeout": timeout, "old": now(old), "queued": queued, "done": done}


def ids(output: str) -> list[int]:
    return [int(line.split("\t")[0]) for line in output.splitlines() if "\t" in line]


def test_list_filters_by_status_task_queue_age_and_error_text(jobs):
    assert ids(run("list")) == sorted((j.id for j in jobs.values()), reverse=True)
    assert ids(run("list", "--status", "failed,done", "--queue", "default")) == [
        jobs["done"].id,
        jobs["old"].id,
        jobs["declined"].id,
    ]
    assert ids(run("list", "--task", "shop.tasks.render_pdf")) == [jobs["queued"].id]
    assert ids(run("list", "--error", "paymentdeclined")) == [jobs["old"].id, jobs["declined"].id]
    assert ids(run("list", "--older-than", "1d")) == [jobs["old"].id]
    assert jobs["old"].id not in ids(run("list", "--newer-than", "1h"))
    assert run("list", "--queue", "mail").endswith("1 job(s) match; the newest 1 shown.\n")


def test_a_dry_run_prints_the_count_and_changes_nothing(jobs):
    assert run("retry", "--error", "PaymentDeclined", "--dry-run") == "2 job(s) would be retried (dry run).\n"
    assert now(jobs["declined"]).status == "failed"


def test_retry_queues_the_matching_failed_jobs_now_with_one_more_attempt(jobs):
    assert (
        run("retry", "--error", "PaymentDeclined", "--newer-than", "1h") == "1 job(s) retried of 1 matched.\n"
    )
    declined = now(jobs["declined"])
    assert (declined.status, declined.attempt, declined.max_attempts) == ("queued", 5, 6)
    assert now(jobs["old"]).status == "failed"  # too old for the filter
    assert now(jobs["timeout"]).status == "failed"  # another error


def test_cancel_cancels_the_matching_queued_jobs(jobs):
    assert run("cancel", "--task", "shop.tasks.render_pdf") == "1 job(s) cancelled of 1 matched.\n"
    assert now(jobs["queued"]).status == "cancelled"


def test_a_change_without_a_filter_is_refused_unless_asked_for(jobs):
    with pytest.raises(CommandError, match="retry changes every failed job when no filter is given"):
        run("retry")
    assert run("retry", "--all") == "3 job(s) retried of 3 matched.\n"


def test_bad_filters_are_refused_by_the_parser(jobs):
    with pytest.raises(CommandError, match="invalid status"):
        run("list", "--status", "stuck")


def test_a_job_claimed_between_match_and_write_is_left_alone(transactional_db):
    """A real race: the command matches two failed jobs; a "worker" holds one of
    them in an uncommitted claim; when that commits, the command's fenced
    write no longer matches it."""
    first = make_job(status="failed", attempt=2, max_attempts=2, last_error="boom")
    raced = make_job(status="failed", attempt=2, max_attempts=2, last_error="boom")
    with psycopg.connect(**connection_params()) as other:
        other.execute(
            "UPDATE leasejobs_job SET status = 'running', attempt = attempt + 1 WHERE id = %s", [raced.id]
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
