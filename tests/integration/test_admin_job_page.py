"""The integration half of tests/unit/test_admin_job_page.py: its tests that start workers or commit."""

import re

from django.db import connection

from leasejobs.models import Job
from tests.adminpages import fresh, page
from tests.helpers import wait_until
from tests.testapp.models import BodyRun
from tests.testapp.tasks import flaky, receipt
from tests.unit.test_admin_job_page import act_url, answer, question, text_of, url

# -- what the page says -------------------------------------------------------------------


# -- the buttons ----------------------------------------------------------------------------


# -- releasing a healthy lease asks first -------------------------------------------------


# -- with a real worker ------------------------------------------------------------------------


def test_the_attempts_of_a_worker_run_job_read_as_what_happened(start_worker, admin_client):
    """A lease released mid-body from the job page, then a job that fails once and is retried."""
    job = receipt.enqueue("A-9", first_attempt_seconds=3)
    retried = flaky.enqueue(1)
    worker = start_worker("--concurrency", "2", "--heartbeat", "0.5")
    wait_until(lambda: BodyRun.objects.filter(job_id=job.id, attempt=1).exists(), what="attempt 1 starts")
    asked = admin_client.post(
        act_url(job),
        {"action": "release_lease", "leasejobs_seen": f"{job.id}:running:1", "leasejobs_release": "ask"},
    )
    question(asked)
    answer(admin_client, asked, act_url(job))
    wait_until(lambda: fresh(job).status == "done", timeout=15, what="the job finishes")
    wait_until(lambda: Job.objects.get(pk=retried.id).status == "done", timeout=15, what="the retry finishes")
    worker.wait_for_log(rf"lease lost job={job.id} attempt=1")

    job = fresh(job)
    first, second = job.attempt_workers
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_char(started_at, 'HH24:MI:SS') FROM leasejobs_job WHERE id = %s", [job.id])
        (taken_over,) = cursor.fetchone()
    items = [
        text_of(li)
        for li in re.findall(r"<li class=\"leasejobs-attempt-\w+\">(.*?)</li>", page(admin_client, url(job)))
    ]
    assert items[0] == (
        f"attempt 1: {first} · lost its lease (expired and taken over, or given back); "
        f"attempt 2 took the job over at {taken_over}"
    )
    assert re.fullmatch(rf"attempt 2: {second} · claimed at {taken_over}; done at \d\d:\d\d:\d\d", items[1])
    items = [
        text_of(li)
        for li in re.findall(
            r"<li class=\"leasejobs-attempt-\w+\">(.*?)</li>",
            page(admin_client, url(Job.objects.get(pk=retried.id))),
        )
    ]
    assert re.fullmatch(r"attempt 1: \S+ · failed: builtins.ValueError; retried", items[0])
    assert re.fullmatch(r"attempt 2: \S+ · claimed at \S+; done at \S+", items[1])
