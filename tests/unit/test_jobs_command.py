"""``manage.py leasejobs_jobs list|retry|cancel``: filters, dry run, and the fence.

The race test runs the command as a real process while another connection
holds a matched job in an uncommitted claim: the command's write waits on
the row, then finds it claimed and leaves it alone.
"""

import datetime as dt
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now

from leasejobs.management.commands.leasejobs_jobs import HEADER
from leasejobs.models import Job
from tests.adminpages import make_job


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
    lines = output.splitlines()
    assert lines[0] == HEADER, output
    return [int(line.split("\t")[0]) for line in lines[1:] if "\t" in line]


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


def test_list_starts_with_a_header_naming_its_columns(jobs):
    lines = run("list", "--queue", "mail").splitlines()
    assert lines[0] == "id\tstatus\tattempt\tqueue\ttask\tcreated (UTC)\tlast error"
    assert len(lines[1].split("\t")) == len(lines[0].split("\t"))


def test_bad_filters_are_refused_by_the_parser_in_a_sentence(jobs):
    with pytest.raises(CommandError) as refused:
        run("list", "--status", "stuck")
    assert str(refused.value) == (
        "Error: argument --status: 'stuck' is not a job status: give queued, running, done, failed, "
        "cancelled, or several with commas."
    )
    with pytest.raises(CommandError) as refused:
        run("list", "--older-than", "1x")
    assert str(refused.value) == (
        "Error: argument --older-than: '1x' is not a duration: give a number with a unit "
        "(s, m, h, d or w), such as 7d, 12h or 30m."
    )
