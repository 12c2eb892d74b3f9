"""The integration half of tests/unit/test_admin.py: its tests that start workers or commit."""

from django.urls import reverse

from tests.adminpages import (
    act,
    fresh,
    page,
    side_effects_on,
)
from tests.helpers import wait_until
from tests.testapp.models import BodyRun, Sent
from tests.testapp.tasks import receipt, until_cancelled

# -- the job page -------------------------------------------------------------------


# -- actions ----------------------------------------------------------------------------


# -- actions without the page's state: a plain admin POST, a script, a call from code --


# -- escaping ------------------------------------------------------------------------


# -- the overview -------------------------------------------------------------------------


# -- side effects --------------------------------------------------------------------------


# -- with real workers ------------------------------------------------------------------------


def test_cancel_reaches_the_running_body_through_the_heartbeat(start_worker, admin_client):
    job = until_cancelled.enqueue(30)
    start_worker("--heartbeat", "0.2")
    wait_until(lambda: BodyRun.objects.filter(job_id=job.id).exists(), what="the body starts")
    assert act(admin_client, "cancel", [job])[0].startswith("Cancelled 0 queued jobs and asked 1 running job")
    wait_until(
        lambda: fresh(job).status == "cancelled", timeout=10, what="the worker ends the job as cancelled"
    )
    assert fresh(job).result == "stopped"


def test_release_fences_off_the_holder_and_the_receipt_goes_out_once(start_worker, admin_client):
    """Released mid-body: another attempt takes the job; the holder's side effect is refused."""
    job = receipt.enqueue("A-7", first_attempt_seconds=3)
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: BodyRun.objects.filter(job_id=job.id, attempt=1).exists(), what="attempt 1 starts")
    assert act(admin_client, "release_lease", [job]) == ["Released 1 of 1 selected job."]
    wait_until(lambda: fresh(job).status == "done", timeout=15, what="the job finishes")
    job = fresh(job)
    assert job.attempt == 2
    assert list(Sent.objects.filter(job_id=job.id).values_list("attempt", flat=True)) == [2]
    # attempt 1 wakes from its slow PDF: its side effect and its finish are fenced off
    worker.wait_for_log(rf"stale write rejected job={job.id} attempt=1")
    worker.wait_for_log(rf"lease lost job={job.id} attempt=1")
    assert list(Sent.objects.filter(job_id=job.id).values_list("attempt", flat=True)) == [2]
    assert (fresh(job).status, fresh(job).attempt) == ("done", 2)
    # the job page shows which attempt wrote the side effect
    text = page(admin_client, reverse("admin:leasejobs_job_change", args=[job.pk]))
    assert side_effects_on(text) == [("receipt:A-7", 2)]
