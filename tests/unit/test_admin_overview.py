"""The overview's workers and stuck jobs, and the Queues and periodic pages,
as an operator reads them (Django's test client; times from the database clock)."""

import html
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext

from leasejobs.admin import overview
from leasejobs.models import Job, Queue
from leasejobs.queues import controls
from tests.adminpages import OVERVIEW, make_job, page, running, secs

QUEUES = "/admin/leasejobs/queue/"
SET_PAUSED = "/admin/leasejobs/queue/set-paused/"
PERIODIC = "/admin/leasejobs/periodicschedule/"

pytestmark = pytest.mark.django_db


def plain(text: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text))).strip()


def worker_row(worker_id: str, beat_seconds_ago: float, interval: float = 10) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_worker VALUES "
            "(%s, 'host-1', 1, now(), now() - make_interval(secs => %s), %s)",
            [worker_id, beat_seconds_ago, interval],
        )


def workers_table(text: str) -> list[str]:
    table = re.search(r'<table class="leasejobs-workers">.*?</table>', text, re.S).group(0)
    return [plain(r) for r in re.findall(r"<tr[ >].*?</tr>", table, re.S)[1:]]


def staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="leasejobs", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


# -- the overview -------------------------------------------------------------------------


def test_the_card_and_the_table_agree_on_live_workers_and_flag_the_late_one(admin_client):
    worker_row("w-idle", 3)  # live, holds nothing
    worker_row("w-busy", 1)  # live, holds two leases
    worker_row("w-late", 45)  # beats every 10 s: two intervals missed
    running(left=20, worker="w-busy")
    running(left=25, worker="w-busy")
    running(left=22, worker="w-old")  # holds a lease, no row of its own (an older worker)
    text = page(admin_client, f"{OVERVIEW}?refresh=0")
    rows = workers_table(text)
    # Worker rows were written with the transaction's clock, jobs with their
    # statement's (Now()): the lease holder's age may read a second less.
    rows[2] = re.sub(r"^w-old 1 [78] s ago$", "w-old 1 8 s ago", rows[2])
    assert rows == [
        "w-busy 2 1 s ago",
        "w-idle 0 3 s ago",
        "w-old 1 8 s ago",  # its jobs' last heartbeat
        "w-late 0 45 s ago late",
    ]
    card = plain(re.search(r"<h3>Live workers</h3>.*?</div>", text, re.S).group(0))
    assert card == "Live workers 3 heartbeating; 2 holding a lease; 1 late"
    assert 'title="late: it beats every 10 s"' in text


def test_workers_and_stuck_jobs_come_before_the_charts(admin_client):
    running(left=-40, worker="w-gone", task_name="shop.render")  # expired
    late = running(left=4, lease=30, worker="w-slow", task_name="shop.slow")  # a heartbeat missed
    running(left=25, worker="w-ok")
    text = page(admin_client, f"{OVERVIEW}?refresh=0")
    markers = ("Workers</h2>", "<h2>Expired leases", "<h2>Heartbeat late", "<h2>Jobs by queue", "Over time:")
    order = [text.index(marker) for marker in markers]
    assert order == sorted(order)
    section = plain(text[text.index("Heartbeat late") : text.index("Jobs by queue")])
    assert re.search(rf"{late.pk} shop.slow default 1 held by w-slow · [34] s left", section), section
    assert "w-ok" not in section


def test_a_paused_queue_is_flagged_in_the_queue_table(admin_client):
    make_job(queue="mail")
    controls.pause_queue("mail")
    text = page(admin_client, f"{OVERVIEW}?refresh=0")
    table = plain(text[text.index("Jobs by queue") : text.index("Paused and limited queues")])
    assert re.search(r" mail paused 1 0 0 ", table), table
    assert 'href="/admin/leasejobs/queue/">Queues</a> page' in text


def test_the_overview_reads_its_tables_in_six_queries_whatever_the_rows():
    """Queues, finished jobs, throughput, workers, stuck jobs, queue controls (the charts
    are their own, per bucket: see tests/unit/test_charts.py)."""

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            overview.snapshot()
        return len(captured)

    running(left=20)
    assert queries() == 6
    for n in range(20):
        running(left=-5 if n % 2 else 3, worker=f"w-{n}", queue=f"q{n % 4}")
        worker_row(f"w-{n}", n)
        controls.set_limits(f"q{n % 4}", concurrency=2)
    assert queries() == 6


# -- the Queues page ---------------------------------------------------------------------


def test_the_queues_page_lists_every_queue_that_has_jobs_with_its_controls(admin_client):
    for queue in ("default", "receipts", "pdf", "stock", "payments", "emails", "reports"):
        make_job(queue=queue)
    make_job(queue="archive", status="done", attempt=1, finished_at=Now() - secs(3600))  # long finished
    controls.set_limits("pdf", concurrency=2)
    text = page(admin_client, QUEUES)
    assert "<title>Queues |" in text and "Select queue to change" not in text
    rows = re.findall(r'<th scope="row"><a href="[^"]*">([^<]+)</a></th>', text)
    assert rows == ["default", "emails", "payments", "pdf", "receipts", "reports", "stock"]
    intro = plain(re.search(r'<p class="leasejobs-intro">.*?</p>', text, re.S).group(0))
    assert "A queue runs unpaused and unlimited until it is controlled here" in intro
    assert "Limit adds a row for it (or opens its row)" in intro
    assert text.count(">Pause</button>") == 7
    assert f'href="{QUEUES}add/?name=receipts">Limit</a>' in text  # a new row
    assert f'href="{QUEUES}pdf/change/">Limit</a>' in text  # its own row
    assert re.search(r"pdf 1 0 0 0 active 0 of 2 — changed at run time", plain(text))


def test_pausing_a_queue_without_a_row_makes_one_and_resuming_clears_it(admin_client):
    make_job(queue="receipts")
    response = admin_client.post(SET_PAUSED, {"name": "receipts", "paused": "1"}, follow=True)
    assert [m.message for m in response.context["messages"]] == [
        "Paused receipts: its queued jobs wait, its running jobs finish."
    ]
    assert Queue.objects.get(name="receipts").paused
    assert ">Resume</button>" in response.content.decode()
    admin_client.post(SET_PAUSED, {"name": "receipts", "paused": "0"})
    assert not Queue.objects.get(name="receipts").paused


def test_a_bad_queue_name_is_refused_in_one_sentence(admin_client):
    response = admin_client.post(SET_PAUSED, {"name": "", "paused": "1"}, follow=True)
    (message,) = [m.message for m in response.context["messages"]]
    assert (
        message == "Nothing was changed: queue name '' must be a non-empty string of at most 100 characters."
    )
    assert not Queue.objects.exists()


def test_the_limit_link_opens_a_row_for_that_queue(admin_client):
    make_job(queue="receipts")
    assert 'value="receipts"' in page(admin_client, f"{QUEUES}add/?name=receipts")
    admin_client.post(f"{QUEUES}add/", {"name": "receipts", "concurrency": "3", "rate": ""})
    assert Queue.objects.get(name="receipts").concurrency == 3
    assert "0 of 3" in plain(page(admin_client, QUEUES))


def test_who_may_only_view_queues_sees_them_without_controls():
    make_job(queue="receipts")
    viewer = staff("viewer", "view_queue")
    text = page(viewer, QUEUES)
    assert "receipts" in text and ">Pause</button>" not in text and ">Limit</a>" not in text
    assert viewer.post(SET_PAUSED, {"name": "receipts", "paused": "1"}).status_code == 403
    assert not Queue.objects.exists()
    assert staff("nobody").get(QUEUES).status_code == 403


def test_the_queues_page_is_a_fixed_number_of_queries(admin_client):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page(admin_client, QUEUES)
        return len(captured)

    make_job(queue="a")
    before = queries()
    for n in range(12):
        make_job(queue=f"q{n}")
        controls.set_limits(f"q{n}", concurrency=2)
    assert queries() == before <= 5


def test_an_empty_queues_page_says_how_to_start():
    text = page(staff("adder", "view_queue", "add_queue"), QUEUES)
    assert "No queue has jobs or controls yet." in plain(text)
    assert "add a row to pause or limit a queue before its first job" in plain(text)


# -- the periodic page -------------------------------------------------------------------


def test_an_empty_periodic_page_says_how_to_add_a_schedule(admin_client):
    text = plain(page(admin_client, PERIODIC))
    assert "Periodic schedules" in text and "Select periodic schedule" not in text
    assert "No periodic schedule yet. Schedules are declared in code, not added here" in text
    assert '@periodic("0 7 * * *", timezone="Europe/Paris") above a task\'s @task' in text
    assert 'LEASEJOBS["PERIODIC"]' in text


def test_a_periodic_page_with_schedules_does_not_repeat_the_help(admin_client):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_periodic_schedule VALUES "
            "('digest', 'myapp.tasks.digest', '*/15 * * * *', 'UTC', 'sig', now(), now(), NULL, 0, 0, "
            "now(), now())"
        )
    text = plain(page(admin_client, PERIODIC))
    assert "digest" in text and "No periodic schedule yet" not in text


def test_jobs_are_made_here_only_by_the_queue(admin_client):
    """Nothing on these pages writes a job: a guard against a control that enqueues."""
    page(admin_client, QUEUES)
    page(admin_client, f"{OVERVIEW}?refresh=0")
    assert not Job.objects.exists()


def test_markup_in_queue_names_and_worker_ids_renders_inert(admin_client):
    script = "<script>alert(1)</script>"
    make_job(queue=f"q{script}")
    running(left=20, worker=f"w{script}", queue=f"q{script}")
    worker_row(f"v{script}", 45)
    controls.pause_queue(f"p{script}")
    for url in (QUEUES, f"{OVERVIEW}?refresh=0"):
        text = page(admin_client, url)
        assert "<script>alert" not in text, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, url
