"""A job's page as an operator reads it: the failure first, times to the second
with durations, the attempts and why each ended, no empty fields, and the
actions as buttons, fenced on the state the page showed.

Rows are written as a worker leaves them (times from the database clock);
one test drives a real ``runworker`` so the attempts read are a worker's own.
"""

import html
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from leasejobs.models import Job, SideEffect
from tests.adminpages import CHANGELIST, act, fresh, make_job, page, running, secs

TRACEBACK = 'Traceback (most recent call last):\n  File "shop/tasks.py", line 3\nValueError: card declined'


def staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="leasejobs", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def url(job: Job) -> str:
    return reverse("admin:leasejobs_job_change", args=[job.pk])


def act_url(job: Job) -> str:
    return reverse("admin:leasejobs_job_act", args=[job.pk])


def text_of(fragment: str) -> str:
    """What a person reads: tags dropped, entities decoded, whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


def fields_shown(text: str) -> list[str]:
    """The page's fields, top to bottom."""
    return re.findall(r'<div class="form-row field-(\w+)', text)


def field(text: str, name: str) -> str:
    """What one field of the page reads."""
    start = text.index(f'<div class="form-row field-{name}')
    ends = (text.find('<div class="form-row', start + 1), text.find("</fieldset>", start))
    end = min(i for i in ends if i > 0)
    return text_of(text[start:end])


def sections(text: str) -> list[str]:
    return re.findall(r'class="fieldset-heading">([^<]*)<', text)


def buttons(text: str) -> list[str]:
    """The actions a job's page offers, by the name they post."""
    form = re.search(r'<form class="leasejobs-job-actions".*?</form>', text, re.S)
    return re.findall(r'name="action" value="(\w+)"', form.group(0)) if form else []


def post_button(client, job: Job, action: str, seen: str | None = None, **extra) -> list[str]:
    """Press one of the page's buttons with the state the page showed; the messages left."""
    if seen is None:
        seen = re.search(r'name="leasejobs_seen" value="([^"]+)"', page(client, url(job))).group(1)
    data = {"action": action, "leasejobs_seen": seen, "leasejobs_release": "ask", **extra}
    response = client.post(act_url(job), data, follow=True)
    assert response.status_code == 200
    return [m.message for m in response.context["messages"]]


# -- what the page says -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_failed_job_shows_its_error_and_traceback_first(admin_client):
    job = make_job(
        status="failed",
        attempt=2,
        worker_ids=["w-a", "w-b"],
        run_at=Now() - secs(60),
        started_at=Now() - secs(12),
        finished_at=Now() - secs(2),
        last_error="ValueError: card declined",
        errors=[
            {
                "attempt": 1,
                "worker_id": "w-a",
                "exception_class": "builtins.KeyError",
                "traceback": "KeyError",
            },
            {
                "attempt": 2,
                "worker_id": "w-b",
                "exception_class": "builtins.ValueError",
                "traceback": TRACEBACK,
            },
        ],
    )
    text = page(admin_client, url(job))
    assert sections(text)[0] == "Why it failed"
    assert fields_shown(text)[:3] == ["last_error_display", "traceback_display", "status_display"]
    assert field(text, "last_error_display") == "Last error: ValueError: card declined"
    assert field(text, "traceback_display") == (
        f"Traceback: attempt 2 on w-b: builtins.ValueError {text_of(TRACEBACK)}"
    )
    assert re.search(r"<title>Job \d+: tests.testapp.tasks.add \|", text)


@pytest.mark.django_db
def test_times_are_to_the_second_with_how_long_it_waited_and_ran(admin_client):
    job = make_job(
        status="done",
        attempt=1,
        run_at=Now() - secs(125),
        started_at=Now() - secs(120),
        finished_at=Now() - secs(95),
        result={"ok": True},
    )
    Job.objects.filter(pk=job.pk).update(created_at=Now() - secs(130))  # enqueued, then due 5 s later
    times = field(page(admin_client, url(job)), "times_display")
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.fullmatch(
        rf"Times: created {stamp} 2 min 1[01] s ago due {stamp} claimed \(attempt 1\) {stamp} queued for 5 s "
        rf"done {stamp} ran for 25 s · 1 min 3[56] s ago",
        times,
    ), times


@pytest.mark.django_db
def test_a_running_job_shows_its_lease_left_and_its_heartbeat(admin_client):
    job = running(left=20, lease=30, worker="w-3f2a", run_at=Now() - secs(3), worker_ids=["w-3f2a"])
    Job.objects.filter(pk=job.pk).update(created_at=Now() - secs(5))
    text = page(admin_client, url(job))
    times = field(text, "times_display")
    assert re.search(r"claimed \(attempt 1\) \S+ \S+ UTC queued for 3 s · running for [01] s", times), times
    assert re.search(r"last heartbeat \S+ \S+ UTC 1[01] s ago", times), times
    assert re.search(r"lease until \S+ \S+ UTC (19|20) s left", times), times
    assert re.fullmatch(r"Lease: held by w-3f2a · (19|20) s left", field(text, "lease_display"))
    assert field(text, "cancel_requested_display") == "Cancel requested: no"
    assert "icon-no.svg" not in text and "icon-yes.svg" not in text


def clock_of(job: Job, column: str) -> str:
    """A time the row holds, to the second, as the page shows it. Read from the row, not
    recomputed: Django's ``Now()`` is each statement's own time, seconds apart on a loaded machine."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT to_char({column}, 'HH24:MI:SS') FROM leasejobs_job WHERE id = %s", [job.pk])
        (text,) = cursor.fetchone()
    return text


@pytest.mark.django_db
def test_the_attempts_say_why_each_ended_from_what_the_row_records(admin_client):
    # Attempt 1 by w-a lost its lease (no error entry, no outcome of its own);
    # attempt 2 by w-b failed; attempt 3 by w-c, claimed 40 s ago, is done.
    job = make_job(
        status="done",
        attempt=3,
        worker_ids=["w-a", "w-b", "w-c"],
        started_at=Now() - secs(40),
        finished_at=Now() - secs(30),
        errors=[
            {"attempt": 2, "worker_id": "w-b", "exception_class": "builtins.ValueError", "traceback": "x"}
        ],
    )
    claimed = clock_of(job, "started_at")
    text = page(admin_client, url(job))
    items = [text_of(li) for li in re.findall(r"<li class=\"leasejobs-attempt-\w+\">(.*?)</li>", text)]
    assert items[0] == "attempt 1: w-a · lost its lease (expired and taken over, or given back)"
    assert items[1] == "attempt 2: w-b · failed: builtins.ValueError; retried"
    assert re.fullmatch(rf"attempt 3: w-c · claimed at {claimed}; done at \d\d:\d\d:\d\d", items[2]), items[2]
    # Taken over from the attempt before: the next claim's time is when.
    job2 = make_job(status="running", attempt=2, worker_ids=["w-a", "w-b"], started_at=Now() - secs(40))
    Job.objects.filter(pk=job2.pk).update(lease_until=Now() + secs(30), heartbeat_at=Now(), leased_by="w-b")
    first = text_of(
        re.search(r"<li class=\"leasejobs-attempt-lost\">(.*?)</li>", page(admin_client, url(job2))).group(1)
    )
    assert first == (
        "attempt 1: w-a · lost its lease (expired and taken over, or given back); "
        f"attempt 2 took the job over at {clock_of(job2, 'started_at')}"
    )


@pytest.mark.django_db
def test_an_expired_lease_says_when_it_was_lost(admin_client):
    job = running(left=-40, worker="w-dead", attempt=1, worker_ids=["w-dead"])
    lost = clock_of(job, "lease_until")
    items = re.findall(r"<li class=\"leasejobs-attempt-expired\">(.*?)</li>", page(admin_client, url(job)))
    assert re.fullmatch(
        # "ago" is read at the request, by the database's clock: a loaded machine adds seconds.
        rf"attempt 1: w-dead · claimed at \S+; lost its lease at {lost} \([45]\d s ago\): "
        r"no heartbeat in time, any worker may take it over",
        text_of(items[0]),
    )


@pytest.mark.django_db
def test_empty_fields_and_empty_tables_are_left_out(admin_client):
    queued = make_job(task_name="shop.tasks.send_receipt")
    text = page(admin_client, url(queued))
    shown = fields_shown(text)
    for empty in (
        "idempotency_key",
        "concurrency_display",
        "result_display",
        "last_error_display",
        "errors_display",
        "lease_display",
        "timeline_display",
        "traceback_display",
        "retry_policy",
        "trace_context",
        "snoozes",
    ):
        assert empty not in shown, empty
    assert "Errors" not in sections(text) and "Attempts" not in sections(text)
    assert "field-fencing_token" not in text  # no empty inline table
    assert field(text, "cancel_requested_display") == "Cancel requested: no"
    done = make_job(status="done", attempt=1, idempotency_key="order:7", result={"sent": True})
    SideEffect.objects.create(job=done, key="receipt:7", fencing_token=1)
    text = page(admin_client, url(done))
    assert field(text, "idempotency_key") == "Idempotency key: order:7"
    assert "cancel_requested_display" not in fields_shown(text)  # finished, never asked
    assert "field-fencing_token" in text


@pytest.mark.django_db
def test_a_job_page_is_a_handful_of_queries(admin_client):
    job = make_job(status="failed", attempt=1, last_error="boom")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page(admin_client, url(job))
        return len(captured)

    before = queries()
    for n in range(30):
        SideEffect.objects.create(job=job, key=f"k{n}", fencing_token=1)
    make_job(status="failed")
    assert queries() <= before + 1  # the side-effect table itself
    assert before <= 6


# -- the buttons ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_page_offers_the_actions_that_apply_now():
    changer = staff("changer", "view_job", "change_job")
    assert buttons(page(changer, url(make_job(status="failed", attempt=1)))) == ["retry_now"]
    assert buttons(page(changer, url(make_job(run_at=Now() + secs(600))))) == ["retry_now", "cancel"]
    assert buttons(page(changer, url(make_job()))) == ["cancel"]
    assert buttons(page(changer, url(running(left=20)))) == ["cancel", "release_lease"]
    assert buttons(page(changer, url(make_job(status="done", attempt=1)))) == []
    viewer = staff("viewer", "view_job")
    job = make_job(status="failed", attempt=1)
    assert buttons(page(viewer, url(job))) == []
    assert (
        viewer.post(act_url(job), {"action": "retry_now", "leasejobs_seen": f"{job.pk}:failed:1"}).status_code
        == 403
    )
    assert fresh(job).status == "failed"


@pytest.mark.django_db
def test_retry_from_the_page_queues_the_job_and_comes_back(admin_client):
    job = make_job(status="failed", attempt=2, max_attempts=2, finished_at=Now())
    response = admin_client.post(
        act_url(job), {"action": "retry_now", "leasejobs_seen": f"{job.pk}:failed:2"}
    )
    assert response.status_code == 302 and response["Location"] == url(job)
    assert (fresh(job).status, fresh(job).attempt) == ("queued", 2)


@pytest.mark.django_db
def test_a_button_pressed_on_a_stale_page_changes_nothing(admin_client):
    job = make_job()
    seen = re.search(r'name="leasejobs_seen" value="([^"]+)"', page(admin_client, url(job))).group(1)
    Job.objects.filter(pk=job.pk).update(status="running", attempt=1)  # a worker claimed it meanwhile
    messages = post_button(admin_client, job, "cancel", seen=seen)
    assert messages == [
        "Cancelled 0 queued jobs and asked 0 running jobs to stop of 1 selected job. "
        "1 has changed since the page was shown and has been left alone."
    ]
    assert (fresh(job).status, fresh(job).cancel_requested) == ("running", False)


@pytest.mark.django_db
def test_cancel_from_the_page_asks_a_running_body_to_stop(admin_client):
    job = running(left=20)
    messages = post_button(admin_client, job, "cancel")
    assert messages[0].startswith("Cancelled 0 queued jobs and asked 1 running job to stop")
    assert fresh(job).cancel_requested
    assert field(page(admin_client, url(job)), "cancel_requested_display") == (
        "Cancel requested: yes: the worker's next heartbeat asks the body to stop"
    )


# -- releasing a healthy lease asks first -------------------------------------------------


def question(response) -> str:
    assert response.status_code == 200
    assert response.templates[0].name == "admin/leasejobs/job/release_confirm.html"
    return text_of(response.content.decode())


def answer(client, response, post_to: str):
    """Confirm the question: post its form back as it is."""
    text = response.content.decode()
    form = re.search(r'<form method="post">(.*?)</form>', text, re.S).group(1)
    data: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form):
        data.setdefault(name, []).append(html.unescape(value))
    return client.post(post_to, data, follow=True)


@pytest.mark.django_db
def test_releasing_a_healthy_lease_from_the_page_asks_and_says_what_happens_to_the_body(admin_client):
    job = running(left=25, worker="w-busy", attempt=1)
    seen = f"{job.pk}:running:1"
    asked = admin_client.post(
        act_url(job), {"action": "release_lease", "leasejobs_seen": seen, "leasejobs_release": "ask"}
    )
    said = question(asked)
    assert "Release a lease that is still held?" in said
    assert "This job's worker still holds its lease and heartbeats: its body is running." in said
    assert (
        "The worker's next heartbeat finds the lease gone and stops the body; "
        "its writes (side effects, result, finish) are fenced off meanwhile." in said
    )
    assert re.search(rf"{job.pk} tests.testapp.tasks.add default 1 held by w-busy · 2[45] s left", said)
    assert fresh(job).status == "running"  # nothing yet
    done = answer(admin_client, asked, act_url(job))
    assert [m.message for m in done.context["messages"]] == ["Released 1 of 1 selected job."]
    assert done.redirect_chain[-1][0] == url(job)
    assert (fresh(job).status, fresh(job).lease_until) == ("queued", None)


@pytest.mark.django_db
def test_an_expired_or_late_lease_is_released_without_a_question(admin_client):
    expired = running(left=-5)
    assert post_button(admin_client, expired, "release_lease") == ["Released 1 of 1 selected job."]
    late = running(left=3, lease=30)  # under a third left: a heartbeat was missed
    assert post_button(admin_client, late, "release_lease") == ["Released 1 of 1 selected job."]


@pytest.mark.django_db
def test_releasing_healthy_leases_from_the_list_asks_then_acts_as_the_list_showed(admin_client):
    healthy = running(left=25, worker="w-busy")
    expired = running(left=-5, worker="w-gone")
    done = make_job(status="done", attempt=1)
    text = page(admin_client)
    assert '<input type="hidden" name="leasejobs_release" value="ask">' in text
    tokens = dict(re.findall(r'name="leasejobs_seen" value="((\d+):[^"]+)"', text)[::-1])
    tokens = {int(pk): token for token, pk in tokens.items()}
    data = {
        "action": "release_lease",
        "index": "0",
        "_selected_action": [str(j.pk) for j in (healthy, expired, done)],
        "leasejobs_seen": [tokens[j.pk] for j in (healthy, expired, done)],
        "leasejobs_release": "ask",
    }
    asked = admin_client.post(CHANGELIST, data)
    said = question(asked)
    assert f"{healthy.pk} tests.testapp.tasks.add" in said and f"{expired.pk} tests" not in said
    assert (fresh(healthy).status, fresh(expired).status) == ("running", "running")
    released = answer(admin_client, asked, CHANGELIST)
    assert [m.message for m in released.context["messages"]] == [
        "Released 2 of 3 selected jobs. 1 was not running."
    ]
    assert (fresh(healthy).status, fresh(expired).status, fresh(done).status) == ("queued", "queued", "done")


@pytest.mark.django_db
def test_a_script_posting_the_action_is_not_asked(admin_client):
    """Without leasejobs_release=ask (a script, an older page) the action runs as before."""
    job = running(left=25)
    assert act(admin_client, "release_lease", [job]) == ["Released 1 of 1 selected job."]
    assert fresh(job).status == "queued"


# -- with a real worker ------------------------------------------------------------------------
