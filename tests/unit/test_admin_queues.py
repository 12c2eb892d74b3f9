"""Queue controls in the admin: the overview's per-queue controls, pause and
resume actions, limits changed at run time, and the key a job waits on."""

import html

from django.db import connection

from leasejobs.models import Queue, Slot
from leasejobs.queues import controls
from tests.testapp.tasks import export

OVERVIEW = "/admin/leasejobs/joboverview/"
QUEUES = "/admin/leasejobs/queue/"


def text_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return html.unescape(response.content.decode())


def test_the_overview_shows_each_queue_paused_its_limits_places_in_use_and_rate_used(admin_client, db):
    controls.set_limits("pdf", concurrency=2)
    controls.set_limits("email", rate="100/m")
    controls.pause_queue("reports")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE leasejobs_slot SET job_id = 1, attempt = 1, held_until = now() + interval '1 minute' "
            "WHERE (kind, name, n) IN (('concurrency', 'pdf', 1), ('rate', 'email', 1), ('rate', 'email', 2))"
        )
    text = text_of(admin_client, OVERVIEW)
    section = text[text.index("Queue controls") :]
    assert "pdf" in section and "1 of 2" in section
    assert "email" in section and "2 of 100/m" in section
    assert "reports" in section and "paused" in section
    listing = text_of(admin_client, QUEUES)
    assert "1 of 2" in listing and "2 of 100/m" in listing


def test_pause_and_resume_are_admin_actions(admin_client, db):
    controls.pause_queue("mail")
    response = admin_client.post(QUEUES, {"action": "resume", "_selected_action": ["mail"]}, follow=True)
    assert response.status_code == 200
    assert Queue.objects.get(name="mail").paused is False
    admin_client.post(QUEUES, {"action": "pause", "_selected_action": ["mail"]}, follow=True)
    assert Queue.objects.get(name="mail").paused is True


def test_limits_changed_in_the_admin_win_over_settings_and_make_their_places(admin_client, db, settings):
    settings.LEASEJOBS = {**settings.LEASEJOBS, "QUEUES": {"pdf": {"concurrency": 2}}}
    controls.sync_settings()
    assert Queue.objects.get(name="pdf").limits_from_settings
    response = admin_client.post(
        f"{QUEUES}pdf/change/", {"name": "pdf", "concurrency": "4", "rate": "20/10s"}, follow=True
    )
    assert response.status_code == 200, response.content[:500]
    queue = Queue.objects.get(name="pdf")
    assert (queue.concurrency, queue.rate_count, queue.rate_seconds) == (4, 20, 10.0)
    assert not queue.limits_from_settings
    assert Slot.objects.filter(kind="concurrency", name="pdf").count() == 4
    assert Slot.objects.filter(kind="rate", name="pdf").count() == 20
    controls.sync_settings()  # a worker starting later keeps the admin's limits
    assert Queue.objects.get(name="pdf").concurrency == 4


def test_a_bad_rate_in_the_admin_is_refused_with_one_sentence(admin_client, db):
    controls.set_limits("pdf", concurrency=1)
    response = admin_client.post(f"{QUEUES}pdf/change/", {"name": "pdf", "concurrency": "1", "rate": "lots"})
    assert response.status_code == 200
    assert "is not of the form N/unit" in html.unescape(response.content.decode())
    assert Queue.objects.get(name="pdf").rate_count is None


def test_a_rate_window_too_long_for_postgresql_is_refused_in_the_admin(admin_client, db):
    controls.set_limits("pdf", concurrency=1, rate="5/m")
    response = admin_client.post(
        f"{QUEUES}pdf/change/", {"name": "pdf", "concurrency": "1", "rate": "1/99999999999d"}
    )
    assert response.status_code == 200
    assert "has a window longer than 366 days, the largest allowed" in html.unescape(
        response.content.decode()
    )
    assert Queue.objects.get(name="pdf").rate_seconds == 60.0


def test_the_job_page_shows_the_key_it_waits_on(admin_client, db):
    job = export.using(concurrency_key="account:42").enqueue("/dev/null", 0)
    text = text_of(admin_client, f"/admin/leasejobs/job/{job.pk}/change/")
    assert "account:42: 0 of 1 running" in text


def test_settings_already_in_the_table_are_not_written_again(db, settings):
    """A worker's start writes the queue table only when it differs (least-privileged roles only read it)."""
    settings.LEASEJOBS = {
        **settings.LEASEJOBS,
        "QUEUES": {"pdf": {"concurrency": 2}, "email": {"rate": "5/s"}},
    }
    controls.sync_settings()
    assert not controls.settings_differ(controls.configured())
    written = dict(Queue.objects.values_list("name", "updated_at"))
    controls.sync_settings()
    assert dict(Queue.objects.values_list("name", "updated_at")) == written
    settings.LEASEJOBS = {**settings.LEASEJOBS, "QUEUES": {"pdf": {"concurrency": 3}}}
    assert controls.settings_differ(controls.configured())
    controls.sync_settings()
    assert Queue.objects.get(name="pdf").concurrency == 3
    assert Queue.objects.get(name="email").rate_count is None  # gone from the settings
