"""The admin's "retry all N failed jobs matching this filter": link, count, confirmation, fence."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db.models.functions import Now
from django.test import Client

from leasejobs.models import Job

CHANGELIST = "/admin/leasejobs/job/"
RETRY_FAILED = "/admin/leasejobs/job/retry-failed/"


def make_job(**fields) -> Job:
    # Every attempt so far started its body: runs counts them (max_attempts limits runs).
    fields.setdefault("runs", fields.get("attempt", 0))
    fields.setdefault("task_name", "shop.tasks.send_receipt")
    fields.setdefault("run_at", Now())
    if fields.get("status") == "failed":
        fields.setdefault("finished_at", Now())
    job = Job.objects.create(**fields)
    job.refresh_from_db()
    return job


def fresh(job: Job) -> Job:
    job.refresh_from_db()
    return job


def confirm(client: Client, query: str) -> tuple[str, dict[str, str]]:
    """The confirmation page for a changelist query, and the form it asks to post."""
    response = client.get(f"{RETRY_FAILED}?{query}")
    assert response.status_code == 200, response.content[:300]
    text = response.content.decode()
    form = dict(re.findall(r'<input type="hidden" name="(shown_at|count)" value="([^"]+)"', text))
    return text, form


def post(client: Client, query: str, form: dict[str, str]) -> list[str]:
    response = client.post(f"{RETRY_FAILED}?{query}", form, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == f"{CHANGELIST}?{query}"  # back to the same filter
    return [m.message for m in response.context["messages"]]


@pytest.mark.django_db
def test_the_changelist_links_to_retrying_what_its_filter_matches(admin_client):
    text = admin_client.get(f"{CHANGELIST}?queue=mail").content.decode()
    assert f'href="{RETRY_FAILED}?queue=mail">Retry all failed jobs matching this filter</a>' in text


@pytest.mark.django_db
def test_the_confirmation_counts_the_failed_jobs_the_filter_matches_and_retries_them(admin_client):
    mail = [make_job(status="failed", attempt=3, max_attempts=3, queue="mail") for _ in range(3)]
    other_queue = make_job(status="failed", attempt=1, queue="default")
    queued_mail = make_job(queue="mail")
    text, form = confirm(admin_client, "queue=mail")
    assert "Retry all 3 failed jobs matching this filter?" in text
    assert "<code>queue</code> = mail" in text
    assert form["count"] == "3"
    Job.objects.filter(pk=mail[0].pk).update(status="done")  # changed after the page was shown
    assert post(admin_client, "queue=mail", form) == [
        "Queued 2 of the 3 failed jobs to run now. 1 changed since the count was shown and were left alone."
    ]
    assert [fresh(j).status for j in mail] == ["done", "queued", "queued"]
    assert (fresh(mail[1]).attempt, fresh(mail[1]).max_attempts) == (3, 4)
    assert fresh(other_queue).status == "failed"
    assert fresh(queued_mail).status == "queued"


@pytest.mark.django_db
def test_a_job_that_failed_after_the_count_was_shown_is_not_retried(admin_client):
    shown = make_job(status="failed", attempt=1)
    _, form = confirm(admin_client, "status__exact=failed")
    later = make_job(status="failed", attempt=1)  # fails after the page: not in the count
    assert post(admin_client, "status__exact=failed", form) == ["Queued 1 of the 1 failed jobs to run now."]
    assert (fresh(shown).status, fresh(later).status) == ("queued", "failed")


@pytest.mark.django_db
def test_nothing_to_retry_goes_back_with_a_message(admin_client):
    response = admin_client.get(f"{RETRY_FAILED}?queue=empty", follow=True)
    assert [m.message for m in response.context["messages"]] == [
        "No failed job matches this filter; nothing to retry."
    ]


@pytest.mark.django_db
def test_a_filter_the_list_does_not_know_goes_back_with_a_message(admin_client):
    response = admin_client.get(f"{RETRY_FAILED}?no_such_field=1", follow=True)
    assert response.redirect_chain[-1][0] == CHANGELIST
    assert "That filter is not one the job list knows." in [m.message for m in response.context["messages"]]


@pytest.mark.django_db
def test_only_who_may_change_jobs_may_retry_them():
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_job"))
    client = Client()
    client.force_login(user)
    make_job(status="failed", attempt=1)
    assert "Retry all failed jobs" not in client.get(CHANGELIST).content.decode()
    assert client.get(RETRY_FAILED).status_code == 403
    assert (
        client.post(RETRY_FAILED, {"shown_at": "2100-01-01T00:00:00+00:00", "count": "1"}).status_code == 403
    )
    assert Job.objects.get().status == "failed"
