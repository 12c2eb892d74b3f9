"""The admin as an operator uses it, through Django's test client.

Lease times are set from the database clock (``Now()`` in the INSERT), as the
worker sets them; actions are posted with the row tokens the changelist
rendered, as a browser would post them. Two tests drive real ``runworker``
processes to show an action reaching a running job.
"""

import datetime as dt
import html
import re
import time

import pytest
from django.contrib import admin as django_admin
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from leasejobs.admin import paginator
from leasejobs.models import Job, PeriodicSchedule, SideEffect
from tests.adminpages import (
    CHANGELIST,
    OVERVIEW,
    SCRIPT,
    SIDE_EFFECTS,
    act,
    cell,
    fresh,
    ids_on,
    make_job,
    page,
    row,
    running,
    secs,
    side_effects_on,
    staff,
    tokens_on,
)


@pytest.mark.django_db
def test_the_lease_cell_reads_held_expiring_expired_or_nothing(admin_client):
    began = time.monotonic()
    held = running(left=20)
    expiring = running(left=5, worker="w-slow")
    expired = running(left=-40, worker="w-dead", attempt=2)
    queued = make_job()
    text = page(admin_client)
    # The page reads the database clock when it is drawn: on a loaded machine some
    # seconds pass between the rows' writes and the page (CI once took 3).
    late = int(time.monotonic() - began) + 1

    def seconds(cell_text: str, pattern: str) -> int:
        found = re.fullmatch(pattern, cell_text)
        assert found, cell_text
        return int(found.group(1))

    assert 20 - late <= seconds(cell(text, held, "lease_display"), r"held by w-3f2a · (\d+) s left") <= 20
    assert 'leasejobs-lease-held"' in row(text, held)
    assert 5 - late <= seconds(cell(text, expiring, "lease_display"), r"held by w-slow · (\d+) s left") <= 5
    assert "leasejobs-lease-expiring" in row(text, expiring)
    ago = seconds(cell(text, expired, "lease_display"), r"expired (\d+) s ago · last holder w-dead")
    assert 40 <= ago <= 40 + late
    assert "leasejobs-lease-expired" in row(text, expired)
    assert cell(text, queued, "lease_display") == "—"
    # heartbeat age, from the same clock: a 30 s lease with 20 s left was renewed 10 s ago
    assert 10 <= seconds(cell(text, held, "heartbeat_display"), r"(\d+) s ago") <= 10 + late
    assert cell(text, queued, "heartbeat_display") == "—"
    assert cell(text, expired, "attempt_display") == "2 / 5"
    assert cell(text, queued, "status_display") == "Queued"


@pytest.mark.django_db
def test_a_cancel_request_shows_in_the_lease_cell(admin_client):
    job = running(left=20, cancel_requested=True)
    assert cell(page(admin_client), job, "lease_display").endswith("· cancel requested")


@pytest.mark.django_db
def test_the_changelist_shows_the_first_line_of_the_last_error(admin_client):
    job = make_job(status="failed", attempt=5, last_error="ValueError: card declined\nsecond line")
    long = make_job(status="failed", last_error="E" * 500)
    text = page(admin_client)
    assert cell(text, job, "error_display") == "ValueError: card declined"
    assert cell(text, long, "error_display") == "E" * 160 + "…"


@pytest.mark.django_db
def test_a_claim_not_yet_heartbeated_is_judged_from_its_claim(admin_client):
    """A claim leaves ``heartbeat_at`` empty until the attempt's first heartbeat: the
    lease's length and the heartbeat's age are then measured from the claim."""

    def claimed(ago: float, lease: float = 30) -> Job:
        return make_job(
            status="running",
            attempt=1,
            leased_by="w-new",
            started_at=Now() - secs(ago),
            lease_until=Now() + secs(lease - ago),
        )

    new, late = claimed(ago=5), claimed(ago=25)
    assert ids_on(page(admin_client, f"{CHANGELIST}?lease=held")) == {new.pk, late.pk}
    text = page(admin_client, f"{CHANGELIST}?lease=expiring")
    assert ids_on(text) == {late.pk}
    age = re.fullmatch(r"(\d+) s ago", cell(text, late, "heartbeat_display"))
    assert age and 25 <= int(age.group(1)) <= 27, cell(text, late, "heartbeat_display")


@pytest.mark.django_db
def test_filters_by_lease_state_status_and_queue(admin_client):
    held = running(left=25)
    expiring = running(left=3)
    expired = running(left=-1)
    queued = make_job(queue="receipts")
    failed = make_job(status="failed", queue="receipts")

    def shown(query: str) -> set[int]:
        return ids_on(page(admin_client, f"{CHANGELIST}?{query}"))

    assert shown("lease=held") == {held.pk, expiring.pk}
    assert shown("lease=expiring") == {expiring.pk}
    assert shown("lease=expired") == {expired.pk}
    assert shown("lease=none") == {queued.pk, failed.pk}
    assert shown("status__exact=failed") == {failed.pk}
    assert shown("queue=receipts") == {queued.pk, failed.pk}
    assert shown("queue=receipts&status__exact=queued") == {queued.pk}
    archived = make_job(status="done", queue="archive")
    text = page(admin_client)
    assert "expiring soon (under 1/3 of its lease left)" in text
    offered = re.search(r'data-filter-title="queue".*?</details>', text, re.S).group(0)
    assert re.findall(r">(\w+)</a>", offered) == ["All", "default", "receipts"]  # queues with work
    # a queue without work is reached from its jobs' queue cells
    assert '<a href="?queue=archive">archive</a>' in row(text, archived)
    assert shown("queue=archive") == {archived.pk}


@pytest.mark.django_db
def test_search_by_id_idempotency_key_or_part_of_a_task_name(admin_client):
    a = make_job(task_name="tests.testapp.tasks.receipt", idempotency_key="order:42")
    b = make_job(task_name="tests.testapp.tasks.naive_receipt", idempotency_key=str(10**6))
    c = make_job(task_name="tests.testapp.tasks.add", idempotency_key="add:order:42_twice")

    def found(term: str) -> set[int]:
        return ids_on(page(admin_client, f"{CHANGELIST}?q={term}"))

    assert found(str(a.pk)) == {a.pk}
    assert found(str(10**6)) == {b.pk}  # a numeric key
    assert found("order:42") == {a.pk}  # an exact key wins over anything containing it
    assert found("receipt") == {a.pk, b.pk}  # part of registered tasks' names
    assert found("NAIVE_RECEIPT") == {b.pk}
    assert found("tasks.add") == {c.pk}
    assert found("9" * 30) == set()  # past bigint: no error, no match
    assert found("no_such_task") == set()


@pytest.mark.django_db
def test_a_task_name_search_finds_names_scheduled_common_or_given_in_full(admin_client):
    # Tasks no longer in the code: found by part of their name when a periodic schedule
    # names them or the table's statistics count them common, and by their full name always.
    gone = [make_job(task_name="shop.tasks.render_pdf") for _ in range(3)]
    scheduled = make_job(task_name="shop.tasks.nightly_report")
    rare = make_job(task_name="shop.tasks.weekly_digest")
    PeriodicSchedule.objects.create(
        name="nightly",
        task_name="shop.tasks.nightly_report",
        cron="0 3 * * *",
        timezone="UTC",
        signature="x",
        declared_at=Now(),
        last_tick=Now(),
    )

    def found(term: str) -> set[int]:
        return ids_on(page(admin_client, f"{CHANGELIST}?q={term}"))

    assert found("nightly") == {scheduled.pk}
    assert found("render_pdf") == set()  # not registered, scheduled or known common yet
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leasejobs_job")  # sees this transaction's rows
    assert found("render_pdf") == {j.pk for j in gone}
    assert found("weekly") == set()  # one job of a task the project no longer has
    assert found("shop.tasks.weekly_digest") == {rare.pk}  # its full name finds it


@pytest.mark.django_db
def test_the_changelist_is_a_handful_of_queries_whatever_the_rows(
    admin_client, django_assert_max_num_queries
):
    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(url).status_code == 200
        return len(captured)

    make_job()
    running(left=10)
    small = {url: queries(url) for url in (CHANGELIST, f"{CHANGELIST}?status__exact=queued&lease=none")}
    Job.objects.bulk_create(
        [
            Job(task_name="t", run_at=Now(), status=s, finished_at=Now() if s in ("done", "failed") else None)
            for s in ["done", "failed", "queued", "running"] * 80
        ]
    )
    for url, before in small.items():
        with django_assert_max_num_queries(8):
            assert admin_client.get(url).status_code == 200
        assert queries(url) == before, f"{url}: the query count grew with the rows"


@pytest.mark.django_db
def test_a_big_table_is_never_counted_row_by_row(admin_client, monkeypatch):
    """Past EXACT_UP_TO rows the count is the planner's: reltuples, or EXPLAIN for a filter."""
    monkeypatch.setattr(paginator, "EXACT_UP_TO", 10)
    Job.objects.bulk_create(
        [Job(task_name="t", run_at=Now(), status="done", finished_at=Now()) for _ in range(120)]
    )
    make_job(status="failed")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE leasejobs_job")

    for url, expected in (
        (CHANGELIST, r"about 1\d\d jobs \(estimated\)"),
        (f"{CHANGELIST}?status__exact=done", r"about \d+ jobs \(estimated\)"),
    ):
        with CaptureQueriesContext(connection) as captured:
            text = page(admin_client, url)
        assert re.search(expected, text), url
        counts = [q["sql"] for q in captured if "COUNT(" in q["sql"].upper()]
        assert all("LIMIT 11" in sql for sql in counts), counts  # bounded, never the whole table
        assert len(ids_on(text)) == 100
    # a small result is counted exactly
    assert re.search(r"\b1 job\b", page(admin_client, f"{CHANGELIST}?status__exact=failed"))


# -- the job page -------------------------------------------------------------------


@pytest.mark.django_db
def test_the_job_page_shows_everything_read_only(admin_client):
    job = make_job(
        status="failed",
        attempt=2,
        args=[1, {"order": "A-1"}],
        kwargs={"priority": "high"},
        result={"sent": True},
        leased_by="w-1",
        worker_ids=["w-1", "w-2"],
        last_error="RuntimeError: smtp down",
        errors=[
            {
                "attempt": 2,
                "worker_id": "w-2",
                "exception_class": "builtins.RuntimeError",
                "traceback": 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError: smtp down',
            }
        ],
    )
    SideEffect.objects.create(job=job, key="receipt:A-1", fencing_token=2, data={"mail": "m-1"})
    SideEffect.objects.create(job=job, key="pdf:A-1", fencing_token=1)
    url = reverse("admin:leasejobs_job_change", args=[job.pk])
    text = html.unescape(page(admin_client, url))

    assert '<pre class="leasejobs-json">[\n  1,\n  {\n    "order": "A-1"\n  }\n]</pre>' in text
    assert '"priority": "high"' in text and '"sent": true' in text
    assert 'File "x.py"' in text and "builtins.RuntimeError" in text
    assert "attempt 1: w-1" in text and "attempt 2: w-2" in text
    assert side_effects_on(text) == [("receipt:A-1", 2), ("pdf:A-1", 1)]
    assert 'name="_save"' not in text  # nothing to save
    # a hand-made save is refused: a form save would write a stale row over a worker's
    assert admin_client.post(url, {"status": "done"}).status_code == 403
    assert fresh(job).status == "failed"
    assert admin_client.get(f"{CHANGELIST}add/").status_code == 403


# -- actions ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_release_makes_a_running_job_claimable_at_once_and_keeps_its_token(admin_client):
    job = running(left=-30, attempt=3)
    messages = act(admin_client, "release_lease", [job])
    assert messages == ["Released 1 of 1 selected job."]
    job = fresh(job)
    assert (job.status, job.lease_until, job.attempt) == ("queued", None, 3)
    assert Job.objects.filter(pk=job.pk, run_at__lte=Now()).exists()  # due: the next claim takes it


@pytest.mark.django_db
def test_release_leaves_a_job_claimed_again_since_the_page_was_shown(admin_client):
    stale = running(left=-5, attempt=1)
    still = running(left=-5, attempt=1)
    done = make_job(status="done", attempt=1)
    tokens = tokens_on(page(admin_client))
    # a worker takes the expired job over while the operator reads the page
    Job.objects.filter(pk=stale.pk).update(attempt=2, lease_until=Now() + secs(30), leased_by="w-new")

    messages = act(admin_client, "release_lease", [stale, still, done], tokens)
    assert messages == [
        "Released 1 of 3 selected jobs. 1 has changed since the page was shown and has been left alone. "
        "1 was not running."
    ]
    stale = fresh(stale)
    assert (stale.status, stale.attempt, stale.leased_by) == ("running", 2, "w-new")
    assert fresh(still).status == "queued"
    assert fresh(done).status == "done"


@pytest.mark.django_db
def test_cancel_cancels_a_queued_job_and_asks_a_running_one_to_stop(admin_client):
    queued = make_job()
    job = running(left=20)
    failed = make_job(status="failed")
    messages = act(admin_client, "cancel", [queued, job, failed])
    assert messages == [
        "Cancelled 1 queued job and asked 1 running job to stop of 3 selected jobs."
        " 1 was not queued or running."
    ]
    queued = fresh(queued)
    assert queued.status == "cancelled" and queued.finished_at is not None
    job = fresh(job)
    assert (job.status, job.cancel_requested, job.attempt) == ("running", True, 1)
    assert fresh(failed).status == "failed"


@pytest.mark.django_db
def test_cancel_leaves_a_queued_job_that_a_worker_claimed_meanwhile(admin_client):
    job = make_job()
    tokens = tokens_on(page(admin_client))
    Job.objects.filter(pk=job.pk).update(status="running", attempt=1, lease_until=Now() + secs(30))
    messages = act(admin_client, "cancel", [job], tokens)
    assert messages == [
        "Cancelled 0 queued jobs and asked 0 running jobs to stop of 1 selected job. "
        "1 has changed since the page was shown and has been left alone."
    ]
    job = fresh(job)
    assert (job.status, job.cancel_requested) == ("running", False)


@pytest.mark.django_db
def test_retry_now_queues_failed_and_cancelled_jobs_without_lowering_the_token(admin_client):
    failed = make_job(status="failed", attempt=5, max_attempts=5, finished_at=Now(), last_error="boom")
    cancelled = make_job(status="cancelled", attempt=1, cancel_requested=True, finished_at=Now())
    later = make_job(run_at=Now() + secs(3600))
    done = make_job(status="done", attempt=1)
    messages = act(admin_client, "retry_now", [failed, cancelled, later, done])
    assert messages == ["Queued 3 to run now of 4 selected jobs. 1 was not failed, cancelled or queued."]

    failed = fresh(failed)
    assert (failed.status, failed.attempt, failed.max_attempts, failed.finished_at) == ("queued", 5, 6, None)
    assert failed.last_error == "boom"  # history stays
    cancelled = fresh(cancelled)
    assert (cancelled.status, cancelled.cancel_requested, cancelled.max_attempts) == ("queued", False, 5)
    due = Job.objects.filter(run_at__lte=Now(), status="queued").values_list("pk", flat=True)
    assert {failed.pk, cancelled.pk, later.pk} <= set(due)
    assert fresh(done).status == "done"


@pytest.mark.django_db
def test_retry_leaves_a_job_that_changed_since_the_page_was_shown(admin_client):
    job = make_job(status="failed", attempt=2)
    tokens = tokens_on(page(admin_client))
    Job.objects.filter(pk=job.pk).update(status="queued", finished_at=None)  # someone else retried it
    Job.objects.filter(pk=job.pk).update(status="running", attempt=3)  # and a worker took it
    messages = act(admin_client, "retry_now", [job], tokens)
    assert "1 has changed since the page was shown" in messages[0]
    assert (fresh(job).status, fresh(job).attempt) == ("running", 3)


@pytest.mark.django_db
def test_select_across_is_refused(admin_client):
    job = running(left=-5)
    messages = act(admin_client, "release_lease", [job], select_across="1")
    assert messages[0].startswith("Select the jobs on this page")
    assert fresh(job).status == "running"


# -- actions without the page's state: a plain admin POST, a script, a call from code --


def post_without_state(client: Client, action: str, jobs: list[Job]) -> list[str]:
    """A standard Django admin action POST: only the selected ids, no row state."""
    return act(client, action, jobs, tokens={})


def call_from_code(action: str, queryset) -> list[str]:
    """The action function called directly, as a script would: a bare request, no POST data."""
    from django.contrib import admin as django_admin
    from django.contrib.messages.storage.fallback import FallbackStorage
    from django.test import RequestFactory

    from leasejobs.admin import actions

    request = RequestFactory().get(CHANGELIST)
    request.user = User.objects.get_or_create(username="script", is_staff=True, is_superuser=True)[0]
    request.session = {}
    request._messages = FallbackStorage(request)
    getattr(actions, action)(django_admin.site._registry[Job], request, queryset)
    return [m.message for m in request._messages]


@pytest.mark.django_db
@pytest.mark.parametrize("how", [post_without_state, call_from_code])
def test_release_without_the_page_state_acts_on_the_current_state(admin_client, how):
    job = running(left=-5, attempt=2)
    other = running(left=-5, attempt=1)
    done = make_job(status="done", attempt=1)
    if how is post_without_state:
        messages = how(admin_client, "release_lease", [job, done])
    else:
        messages = how("release_lease", Job.objects.filter(pk__in=[job.pk, done.pk]))
    assert messages == ["Released 1 of 2 selected jobs. 1 was not running."]
    job = fresh(job)
    assert (job.status, job.lease_until, job.attempt) == ("queued", None, 2)
    assert fresh(other).status == "running"  # not in the queryset: left alone
    assert fresh(done).status == "done"


@pytest.mark.django_db
@pytest.mark.parametrize("how", [post_without_state, call_from_code])
def test_cancel_without_the_page_state_acts_on_the_current_state(admin_client, how):
    queued = make_job()
    job = running(left=20)
    other = make_job()
    if how is post_without_state:
        messages = how(admin_client, "cancel", [queued, job])
    else:
        messages = how("cancel", Job.objects.filter(pk__in=[queued.pk, job.pk]))
    assert messages == ["Cancelled 1 queued job and asked 1 running job to stop of 2 selected jobs."]
    assert fresh(queued).status == "cancelled"
    assert (fresh(job).status, fresh(job).cancel_requested) == ("running", True)
    assert (fresh(other).status, fresh(other).cancel_requested) == ("queued", False)


@pytest.mark.django_db
@pytest.mark.parametrize("how", [post_without_state, call_from_code])
def test_retry_now_without_the_page_state_acts_on_the_current_state(admin_client, how):
    failed = make_job(status="failed", attempt=3, max_attempts=3, finished_at=Now())
    cancelled = make_job(status="cancelled", attempt=1, cancel_requested=True, finished_at=Now())
    other = make_job(status="failed", attempt=1, max_attempts=1, finished_at=Now())
    job = running(left=20)
    if how is post_without_state:
        messages = how(admin_client, "retry_now", [failed, cancelled, job])
    else:
        messages = how("retry_now", Job.objects.filter(pk__in=[failed.pk, cancelled.pk, job.pk]))
    assert messages == ["Queued 2 to run now of 3 selected jobs. 1 was not failed, cancelled or queued."]
    failed = fresh(failed)
    assert (failed.status, failed.attempt, failed.max_attempts) == ("queued", 3, 4)
    assert (fresh(cancelled).status, fresh(cancelled).cancel_requested) == ("queued", False)
    assert fresh(job).status == "running"
    assert fresh(other).status == "failed"  # not in the queryset: left alone


@pytest.mark.django_db
def test_the_page_state_of_rows_outside_the_queryset_changes_nothing(admin_client):
    """Tokens for jobs not selected are ignored: the action's queryset decides the rows."""
    chosen = make_job(status="failed", attempt=1)
    bystander = make_job(status="failed", attempt=1)
    tokens = tokens_on(page(admin_client))
    data = {
        "action": "retry_now",
        "index": "0",
        "_selected_action": [str(chosen.pk)],
        "leasejobs_seen": [tokens[chosen.pk], tokens[bystander.pk]],
    }
    response = admin_client.post(CHANGELIST, data, follow=True)
    assert [m.message for m in response.context["messages"]] == ["Queued 1 to run now of 1 selected job."]
    assert (fresh(chosen).status, fresh(bystander).status) == ("queued", "failed")


@pytest.mark.django_db
def test_actions_need_the_change_permission():
    job = running(left=-5)
    viewer = staff("view_job")
    text = page(viewer)
    assert ids_on(text) == {job.pk}
    assert "release_lease" not in text and 'name="action"' not in text
    viewer.post(
        CHANGELIST,
        {
            "action": "release_lease",
            "_selected_action": [str(job.pk)],
            "leasejobs_seen": [f"{job.pk}:running:1"],
            "index": "0",
        },
    )
    assert fresh(job).status == "running"
    # the overview is for viewers too; the job page is read-only for all
    assert viewer.get(OVERVIEW).status_code == 200
    assert viewer.get(reverse("admin:leasejobs_job_change", args=[job.pk])).status_code == 200


@pytest.mark.django_db
def test_a_user_without_job_permissions_sees_nothing():
    job = running(left=-5)
    nobody = staff()
    assert nobody.get(CHANGELIST).status_code == 403
    assert nobody.get(OVERVIEW).status_code == 403
    assert (
        nobody.post(CHANGELIST, {"action": "release_lease", "_selected_action": [str(job.pk)]}).status_code
        == 403
    )
    assert fresh(job).status == "running"
    anonymous = Client()
    response = anonymous.get(OVERVIEW)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_changers_see_the_three_actions_and_no_delete():
    make_job()
    text = page(staff("view_job", "change_job"))
    actions = re.findall(r'<option value="(\w+)">', text)
    assert actions == ["retry_now", "cancel", "release_lease"]


# -- escaping ------------------------------------------------------------------------


@pytest.mark.django_db
def test_markup_in_errors_arguments_queues_and_worker_ids_renders_inert(admin_client):
    job = make_job(
        task_name=f"t{SCRIPT}",
        queue=f"q{SCRIPT}",
        status="running",
        attempt=1,
        leased_by=f"w{SCRIPT}",
        lease_until=Now() - secs(5),
        heartbeat_at=Now() - secs(35),
        args=[SCRIPT],
        kwargs={SCRIPT: SCRIPT},
        last_error=f"ValueError: {SCRIPT}",
        errors=[{"attempt": 1, "worker_id": SCRIPT, "exception_class": SCRIPT, "traceback": SCRIPT}],
    )
    SideEffect.objects.create(job=job, key=f"k{SCRIPT}", fencing_token=1, data=[SCRIPT])
    for url in (
        CHANGELIST,
        f"{CHANGELIST}?queue=q{SCRIPT}",
        reverse("admin:leasejobs_job_change", args=[job.pk]),
        OVERVIEW,
        SIDE_EFFECTS,
    ):
        text = page(admin_client, url)
        assert "<script>alert" not in text, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, url


# -- the overview -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_overview_counts_queues_leases_workers_and_throughput(admin_client):
    make_job(queue="receipts", run_at=Now() - secs(125))  # due for 2 min 5 s
    make_job(queue="receipts", run_at=Now() + secs(600))  # later
    running(left=20, worker="w-live", queue="receipts")
    running(left=3, worker="w-live", queue="pdf")
    expired = running(left=-40, worker="w-gone", queue="pdf", task_name="shop.render")
    for minutes_ago, status in ((0.5, "done"), (3, "done"), (10, "failed"), (30, "done")):
        make_job(queue="pdf", status=status, finished_at=Now() - dt.timedelta(minutes=minutes_ago))

    text = page(admin_client, OVERVIEW)
    assert '<meta http-equiv="refresh" content="5">' in text
    plain = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))
    assert "Held leases 2 1 expiring soon" in plain
    assert "Expired leases 1" in plain
    assert re.search(r"Oldest due job 2 min [5-7] s waiting in receipts", plain)
    assert "last 1 min 1 1.0/min last 5 min 2 0.4/min last 15 min 3 0.2/min" in plain
    assert "1 failed in the last 15 min" in plain
    # queue; due, later; running: all, held, expiring, expired; oldest due; done, failed, cancelled
    assert re.search(r" pdf 0 0 2 1 1 1 — 2 1 0 ", plain)
    assert re.search(r" receipts 1 1 1 1 0 0 2 min [5-7] s 0 0 0 ", plain)
    workers = plain.split("Worker Jobs held Last heartbeat")[1].split("Expired leases")[0]
    assert re.fullmatch(r" w-live 2 (9|10|11) s ago ", workers)  # w-gone holds no live lease
    assert re.search(rf"{expired.pk} shop.render pdf 1 expired 4[01] s ago · last holder w-gone", plain)
    assert "Refreshes every 5 s" in plain
    assert "refresh" not in page(admin_client, f"{OVERVIEW}?refresh=0").split("<body")[0]


@pytest.mark.django_db
def test_the_overview_is_linked_from_the_admin_index_and_the_changelist(admin_client):
    assert f'href="{OVERVIEW}"' in page(admin_client, "/admin/")
    assert f'href="{OVERVIEW}"' in page(admin_client)
    assert "No job queued, running or finished" in page(admin_client, OVERVIEW)


# -- side effects --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_side_effect_list_shows_key_job_token_and_time(admin_client):
    job = make_job(status="done", attempt=2)
    SideEffect.objects.create(job=job, key="receipt:7", fencing_token=2)
    SideEffect.objects.create(job=None, key="receipt:6", fencing_token=1)
    text = page(admin_client, SIDE_EFFECTS)
    assert f'<a href="/admin/leasejobs/job/{job.pk}/change/">#{job.pk}</a>' in text
    assert "— (job pruned)" in text
    assert re.search(r'<td class="field-fencing_token">2</td>', text)
    assert "receipt:7" in page(admin_client, f"{SIDE_EFFECTS}?q=receipt:7")
    assert "receipt:6" not in page(admin_client, f"{SIDE_EFFECTS}?q=receipt:7")
    assert "receipt:7" in page(admin_client, f"{SIDE_EFFECTS}?q={job.pk}")
    assert f'href="{SIDE_EFFECTS}add/"' not in text


# -- with real workers ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_search_for_a_rare_task_reads_the_pages_its_bloom_index_names_not_the_table():
    # 200,000 jobs of four tasks and three of a rare one: the search's rows come from a
    # bitmap of the task-name bloom index, never a scan of the whole table.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt,"
            " max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids,"
            " created_at, finished_at)"
            " SELECT CASE WHEN g % 70000 = 1 THEN 'shop.tasks.weekly_digest'"
            "             ELSE 'shop.tasks.t' || g % 4 END,"
            " 'default', 0, '[]', '{}', 'done', 1, 5, now(), '', false, '', '[]', '[]', now(), now()"
            " FROM generate_series(1, 200000) AS g"
        )
        cursor.execute("ANALYZE leasejobs_job")
        cursor.execute("SELECT brin_summarize_new_values('leasejobs_job_task_bloom')")
    found, _ = django_admin.site._registry[Job].get_search_results(
        None, Job.objects.order_by("-id"), "shop.tasks.weekly_digest"
    )
    assert found.count() == 3
    plan = found[:101].explain()
    assert "leasejobs_job_task_bloom" in plan and "Seq Scan" not in plan, plan


@pytest.mark.django_db
def test_the_task_bloom_summaries_are_stored_whole_so_a_job_never_decompresses_one():
    # Every job's insert and every finish that moves its row adds its task name to its
    # range's summary: a compressed summary is decompressed each time (migration 0014).
    # 20,000 jobs of 200 tasks, the summaries read off the index's pages (pageinspect).
    with connection.cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        cursor.execute(
            "INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt,"
            " max_attempts, run_at, leased_by, cancel_requested, last_error, created_at, finished_at)"
            " SELECT 'shop.tasks.t' || g % 200, 'default', 0, '[]', '{}', 'done', 1, 5, now(), '',"
            " false, '', now(), now()"
            " FROM generate_series(1, 20000) AS g"
        )
        cursor.execute("SELECT brin_summarize_new_values('leasejobs_job_task_bloom')")
        cursor.execute(
            "SELECT n, h.lower, h.upper, h.special,"
            " (SELECT array_agg(value) FROM brin_page_items(p.page, 'leasejobs_job_task_bloom'))"
            " FROM generate_series(1, pg_relation_size('leasejobs_job_task_bloom') / 8192 - 1) AS n,"
            " LATERAL (SELECT get_raw_page('leasejobs_job_task_bloom', n::int) AS page) AS p,"
            " LATERAL page_header(p.page) AS h"
            " WHERE brin_page_type(p.page) = 'regular'"
        )
        pages = cursor.fetchall()
        cursor.execute("DROP EXTENSION pageinspect")
    summaries = [value for *_, values in pages for value in values]
    assert len(summaries) >= 2, pages  # 20,000 jobs fill several ranges of 128 pages
    for n, lower, upper, special, values in pages:
        items = (lower - 24) // 4  # the page header, then a line pointer per summary
        stored = (special - upper) / items
        bits = max(int(re.search(r"nbits: (\d+)", v)[1]) for v in values)
        assert stored >= bits / 8, f"page {n}: {stored:.0f} B stored per summary of {bits} bits"
