"""The admin end to end, in a real headless Chromium, at the widths people use.

Debian's ``chromium`` package drives it through Playwright for Python; no
browser is downloaded (``playwright install`` is never run), so the tests
need ``/usr/bin/chromium`` (``.ci/run`` installs it when missing) and fail
with a clear message without it rather than skipping.

Every page is looked at with the admin's sidebar open, at 1280, 1440 and
1920 px: what a person sees is measured in the browser (a lease cell's
height in lines, where the key columns end against the viewport, where the
overview's worker table starts against the fold).

Screenshots are saved under each test's tmp_path; set
``LEASEJOBS_ADMIN_SCREENSHOTS=docs`` to write the ones the docs show
(``docs/admin-screenshot.png``, ``docs/admin-overview.png``, the charts
alone, ``docs/admin-charts.png``, a failed job's page, ``docs/admin-job.png``,
the question before a healthy lease is released, ``docs/admin-release.png``,
the Queues page, ``docs/admin-queues.png``, and the job list at 1280 px,
``docs/admin-jobs-1280.png``).
"""

import datetime as dt
import os
import re
import shutil
from pathlib import Path

import pytest
from django.db import connection
from django.db.models.functions import Now

from leasejobs.models import Job

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ROOT = Path(__file__).resolve().parents[2]


def _job(**fields) -> Job:
    fields.setdefault("run_at", Now())
    return Job.objects.create(**fields)


def _running(task: str, worker: str, left: float, attempt: int = 1, lease: float = 30) -> Job:
    return _job(
        task_name=task,
        queue="receipts",
        status="running",
        attempt=attempt,
        leased_by=worker,
        lease_until=Now() + dt.timedelta(seconds=left),
        heartbeat_at=Now() - dt.timedelta(seconds=lease - left),
        started_at=Now(),
    )


def _a_queue_at_3_am() -> Job:
    """A small queue with every lease state in it; returns the stuck job."""
    ago = Now() - dt.timedelta(minutes=3)
    _job(task_name="shop.tasks.render_pdf", queue="pdf", status="done", attempt=1, finished_at=ago, result={})
    _job(
        task_name="shop.tasks.charge_card",
        queue="payments",
        status="failed",
        attempt=5,
        finished_at=ago,
        last_error="CardDeclined: card ending 4242 was declined\nTraceback (most recent call last): ...",
    )
    _job(task_name="shop.tasks.send_receipt", queue="receipts", status="done", attempt=2, finished_at=ago)
    # Leases of two minutes: a loaded CI machine took over 8 s to reach the
    # "expired" filter, and a live lease must not expire before the test looks.
    _running("shop.tasks.send_receipt", "web-1-4121-9c1e2a", left=104, lease=120)
    _running("shop.tasks.render_pdf", "web-2-77-0f3a91", left=88, attempt=2, lease=120)
    stuck = _running("shop.tasks.send_receipt", "web-3-12-5d2b07", left=-95, attempt=2)
    _running("shop.tasks.render_pdf", "web-3-12-5d2b07", left=-80, attempt=1)
    _job(task_name="shop.tasks.send_receipt", queue="receipts", status="queued")
    _job(task_name="shop.tasks.sync_stock", queue="stock", run_at=Now() + dt.timedelta(minutes=10))
    _job(task_name="shop.tasks.sync_stock", queue="stock", status="cancelled", attempt=1, finished_at=ago)
    return stuck


#: An hour of history: per minute, a wave of finished jobs (one in 25 failed),
#: queue times that grow with the load, two queues whose backlog builds up
#: and drains, and a lost lease now and then.
AN_HOUR = """
INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
    run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at, started_at, finished_at)
SELECT 'shop.tasks.send_receipt', q.queue, 0, '[]', '{}',
       CASE WHEN j % 25 = 0 THEN 'failed' ELSE 'done' END,
       CASE WHEN j % 40 = 0 THEN 2 ELSE 1 END, 5,
       t - make_interval(secs => w * (1 + (j % 10) / 4.0)), '', false, '', '[]', '[]',
       t - interval '1 minute', t, t + interval '2 seconds'
FROM generate_series(1, 60) AS m,
LATERAL (SELECT now() - make_interval(mins => m) AS t,
                0.2 + 3 * (1 + sin(m / 6.0)) AS w) AS shape,
LATERAL generate_series(1, (30 + 20 * sin(m / 6.0))::int) AS j,
LATERAL (SELECT (ARRAY['receipts', 'pdf'])[1 + j % 2] AS queue) AS q;
INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
    run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at)
SELECT 'shop.tasks.render_pdf', 'pdf', 0, '[]', '{}', 'queued', 0, 5,
       now() - make_interval(mins => g % 25), '', false, '', '[]', '[]', now() - interval '1 hour'
FROM generate_series(1, 40) AS g;
"""


def test_an_operator_finds_an_expired_lease_and_releases_it(live_server, django_user_model, tmp_path):
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: this test drives Debian's Chromium. Install it with "
            "`apt-get install chromium` (.ci/run does when it is missing)."
        )
    from playwright.sync_api import expect, sync_playwright

    django_user_model.objects.create_superuser("operator", "op@example.com", "night-shift")
    with connection.cursor() as cursor:
        cursor.execute(AN_HOUR)  # first: its ids are lower, so the jobs below top the changelist
    stuck = _a_queue_at_3_am()
    shots = tmp_path

    # No ORM call inside the Playwright block: its event loop would make
    # Django refuse synchronous database access.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(f"{live_server.url}/admin/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "night-shift")
            page.click("input[type=submit]")
            page.get_by_role("link", name="Jobs", exact=True).click()
            expect(page.locator("#nav-sidebar")).to_be_visible()  # the sidebar stays open

            # Find the jobs whose lease expired: the lease filter shows just them.
            lease_filter = page.locator('#changelist-filter details[data-filter-title="lease state"]')
            lease_filter.get_by_role("link", name="expired", exact=True).click()
            leases = page.locator("#result_list tbody td.field-lease_display")
            expect(leases).to_have_count(2)
            for lease in leases.all():
                expect(lease).to_contain_text(re.compile(r"^expired .* ago · last holder web-3-12-5d2b07$"))

            # Back to all jobs; release it from there, so the page shows the result among the rest.
            lease_filter.get_by_role("link", name="All", exact=True).click()
            row = page.locator("#result_list tbody tr", has=page.locator(f'input[value="{stuck.pk}"]'))
            # Expired 95 s before the test began; a loaded machine takes a few seconds to get here.
            lease_cell = row.locator("td.field-lease_display")
            expect(lease_cell).to_contain_text(re.compile(r"expired 1 min [3-5]\d s"))
            row.locator("input.action-select").check()
            page.select_option("select[name=action]", "release_lease")
            page.click("div.actions button[name=index]")  # "Go" (Django 5.2) or "Run" (6.1)

            expect(page.locator("ul.messagelist")).to_have_text("Released 1 of 1 selected job.")
            expect(row.locator("td.field-status_display")).to_have_text("Queued")
            expect(row.locator("td.field-lease_display")).to_have_text("—")
            page.screenshot(path=str(shots / "admin-screenshot.png"))

            page.goto(f"{live_server.url}/admin/")
            page.get_by_role("link", name="Overview", exact=True).click()
            expect(page.locator("h1")).to_have_text("Queue overview")
            page.screenshot(path=str(shots / "admin-overview.png"), full_page=True)

            # The charts: four drawn figures with labelled axes, each with its numbers in a table.
            expect(page.locator("#leasejobs-over-time")).to_have_text("Over time: last hour, per minute")
            figures = page.locator("figure.leasejobs-figure")
            expect(figures).to_have_count(4)
            throughput = page.locator("#leasejobs-chart-throughput")
            expect(throughput.locator("svg[role=img]")).to_be_visible()
            expect(throughput.locator("figcaption")).to_have_text(
                "Jobs finished and failed (jobs per minute)"
            )
            expect(throughput.locator("svg polyline")).to_have_count(2)
            expect(throughput.locator("svg text", has_text="jobs per minute")).to_be_visible()
            expect(page.locator("#leasejobs-chart-backlog svg text.leasejobs-legend")).to_have_text(
                ["pdf", "receipts"]
            )
            table = throughput.locator("details table")
            expect(table).to_be_hidden()
            throughput.locator("summary").click()
            expect(table).to_be_visible()
            expect(table.locator("tbody tr")).to_have_count(60)
            throughput.locator("summary").click()
            page.locator(".leasejobs-charts").screenshot(path=str(shots / "admin-charts.png"))
            page.get_by_role("link", name="last day, per 15 minutes").click()
            expect(page.locator("#leasejobs-over-time")).to_have_text("Over time: last day, per 15 minutes")
            expect(page.locator("#leasejobs-chart-queue_time svg polyline")).to_have_count(2)
        finally:
            browser.close()

    stuck.refresh_from_db()
    assert (stuck.status, stuck.attempt, stuck.lease_until) == ("queued", 2, None)
    target = os.environ.get("LEASEJOBS_ADMIN_SCREENSHOTS")
    if target:
        # The docs' overview is the width test's, which has workers both live and late.
        for name in ("admin-screenshot.png", "admin-charts.png"):
            shutil.copyfile(shots / name, ROOT / target / name)


# -- the widths people use ------------------------------------------------------------------

#: Laptop and desktop screens (width, height), the admin's sidebar open.
SCREENS = [(1280, 800), (1440, 900), (1920, 1080)]

LONG_TASK = "shop.billing.tasks.generate_monthly_invoice_pdf_for_customer"
LONG_WORKER = "ip-10-0-12-34.eu-west-1.compute.internal-2231-9f8e7d"
LONG_ERROR = (
    "stripe.error.CardError: Your card was declined. This transaction requires authentication, "
    "and the customer did not respond in time for order 2024-0001-ABC"
)


def _a_busy_shop() -> dict[str, Job]:
    """Seven queues with work, long task and worker names, a failed job, workers live and late."""
    jobs = {"stuck": _a_queue_at_3_am()}
    for queue in ("default", "emails", "reports"):
        _job(task_name="shop.tasks.sync_stock", queue=queue)
    jobs["failed"] = _job(
        task_name=LONG_TASK,
        queue="pdf",
        status="failed",
        attempt=3,
        runs=3,
        worker_ids=["vm-28196-5ee61f", LONG_WORKER, "vm-28197-0a1b2c"],
        started_at=Now() - dt.timedelta(seconds=40),
        finished_at=Now() - dt.timedelta(seconds=38),
        last_error=f"{LONG_ERROR}\nTraceback (most recent call last): ...",
        errors=[
            {
                "attempt": a,
                "worker_id": w,
                "exception_class": "stripe.error.CardError",
                "traceback": f'Traceback (most recent call last):\n  File "shop/billing.py"\n{LONG_ERROR}',
            }
            for a, w in ((2, LONG_WORKER), (3, "vm-28197-0a1b2c"))
        ],
    )
    jobs["healthy"] = _running(LONG_TASK, LONG_WORKER, left=100, attempt=2, lease=120)
    Job.objects.filter(pk=jobs["healthy"].pk).update(worker_ids=["vm-28196-5ee61f", LONG_WORKER])
    cancelling = _running("shop.tasks.send_receipt", "vm-28196-5ee61f", left=90, lease=120)
    Job.objects.filter(pk=cancelling.pk).update(cancel_requested=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_worker VALUES "
            "(%s, 'ip-10-0-12-34', 2231, now(), now() - interval '1 second', 10), "
            "('web-1-4121-9c1e2a', 'web-1', 4121, now(), now() - interval '2 seconds', 10), "
            "('web-3-12-5d2b07', 'web-3', 12, now(), now() - interval '3 minutes', 10)",
            [LONG_WORKER],
        )
    from leasejobs.queues import controls

    controls.set_limits("pdf", concurrency=2)
    controls.pause_queue("reports")
    return jobs


#: In the browser: each lease cell's height in lines of its own line height.
LEASE_LINES = """() => [...document.querySelectorAll('td.field-lease_display .leasejobs-lease')].map(cell => {
    const style = getComputedStyle(cell);
    return [cell.textContent, cell.getBoundingClientRect().height / parseFloat(style.lineHeight)];
})"""

#: In the browser: each column's header, its left and right edges, and the viewport's width.
COLUMNS = """() => ({
    viewport: window.innerWidth,
    page: document.documentElement.scrollWidth,
    results: [document.querySelector('.results').scrollWidth, document.querySelector('.results').clientWidth],
    columns: Object.fromEntries([...document.querySelectorAll('#result_list thead th')].map(th => {
        const box = th.getBoundingClientRect();
        return [th.className.match(/column-(\\w+)/)?.[1] || th.className, [box.left, box.right]];
    })),
})"""


def _login(page, live_server) -> None:
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "night-shift")
    page.click("input[type=submit]")


@pytest.mark.parametrize(("width", "height"), SCREENS, ids=[f"{w}px" for w, _ in SCREENS])
def test_each_page_reads_at_the_widths_people_use(live_server, django_user_model, tmp_path, width, height):
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install chromium`.")
    from playwright.sync_api import expect, sync_playwright

    django_user_model.objects.create_superuser("operator", "op@example.com", "night-shift")
    with connection.cursor() as cursor:
        cursor.execute(AN_HOUR)
    jobs = _a_busy_shop()
    failed, healthy = jobs["failed"].pk, jobs["healthy"].pk
    shots = tmp_path

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            _login(page, live_server)

            # The job list: every lease in two lines at most, the key columns on screen.
            page.goto(f"{live_server.url}/admin/leasejobs/job/")
            expect(page.locator("#nav-sidebar")).to_be_visible()
            lines = page.evaluate(LEASE_LINES)
            assert len(lines) >= 6
            assert all(n <= 2.05 for _, n in lines), lines
            layout = page.evaluate(COLUMNS)
            viewport = layout["viewport"]
            for column in ("task_display", "status_display", "lease_display", "heartbeat_display"):
                left, right = layout["columns"][column]
                assert left >= 0 and right <= viewport, (column, layout)
            for column in ("run_at_display", "attempt_display", "error_display"):
                left, right = layout["columns"][column]
                assert left >= 0 and right <= viewport, (column, layout)
            error_left, error_right = layout["columns"]["error_display"]
            assert error_right - error_left >= 120, layout  # room to read the start of an error
            assert layout["page"] <= viewport and layout["results"][0] <= layout["results"][1], layout
            # Shortened names keep the whole one on hover.
            row = page.locator("#result_list tbody tr", has=page.locator(f'input[value="{failed}"]'))
            expect(row.locator("a.leasejobs-task")).to_have_text("generate_monthly_invoice_pdf_for_customer")
            expect(row.locator("a.leasejobs-task")).to_have_attribute("title", LONG_TASK)
            expect(row.locator(".leasejobs-error-head")).to_have_attribute("title", LONG_ERROR)
            lease = page.locator("#result_list tbody tr", has=page.locator(f'input[value="{healthy}"]'))
            # 100 s left when the row was made; a loaded machine may take seconds to get here.
            expect(lease.locator(".leasejobs-lease")).to_have_attribute(
                "title", re.compile(rf"^held by {LONG_WORKER} · 1 min \d+ s left$")
            )
            if width == 1280:
                page.screenshot(path=str(shots / "admin-jobs-1280.png"))

            # The overview: the worker table above the fold; card and table agree; the late one flagged.
            page.goto(f"{live_server.url}/admin/leasejobs/joboverview/?refresh=0")
            workers = page.locator("table.leasejobs-workers")
            first_row = workers.locator("tbody tr").first
            assert first_row.bounding_box()["y"] + first_row.bounding_box()["height"] <= height
            rows = workers.locator("tbody tr")
            # Three rows of leasejobs_worker, and two holders of leases that have none.
            expect(rows).to_have_count(5)
            expect(workers.locator("tr.leasejobs-worker-late")).to_have_count(1)
            expect(workers.locator("tr.leasejobs-worker-late")).to_contain_text("web-3-12-5d2b07")
            live_card = page.locator(".leasejobs-card", has=page.locator("h3", has_text="Live workers"))
            expect(live_card.locator(".leasejobs-big")).to_have_text("4")
            expect(live_card).to_contain_text("1 late")
            charts = page.locator(".leasejobs-charts").bounding_box()
            assert charts["y"] > workers.bounding_box()["y"]
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            if width == 1440:
                page.screenshot(path=str(shots / "admin-overview.png"), full_page=True)

            # A failed job: the error first, on screen, with the action that applies.
            page.goto(f"{live_server.url}/admin/leasejobs/job/{failed}/change/")
            first = page.locator("fieldset").first
            expect(first.locator("h2")).to_have_text("Why it failed")
            assert first.bounding_box()["y"] < height
            expect(page.locator(".leasejobs-job-actions button")).to_have_text(["Retry now"])
            expect(page.locator(".field-timeline_display li")).to_have_text(
                [
                    "attempt 1: vm-28196-5ee61f · lost its lease (expired and taken over, or given back)",
                    f"attempt 2: {LONG_WORKER} · failed: stripe.error.CardError; retried",
                    re.compile(
                        r"^attempt 3: vm-28197-0a1b2c · claimed at \S+; failed at \S+: stripe\.error\.\w+$"
                    ),
                ]
            )
            assert page.evaluate("document.documentElement.scrollWidth") <= width
            if width == 1440:
                page.screenshot(path=str(shots / "admin-job.png"))

            # A healthy lease: releasing it asks first and says what happens to the body.
            page.goto(f"{live_server.url}/admin/leasejobs/job/{healthy}/change/")
            page.get_by_role("button", name="Release lease").click()
            expect(page.locator("h1")).to_have_text("Release a lease that is still held?")
            expect(page.locator("#content-main")).to_contain_text(
                "The worker's next heartbeat finds the lease gone and stops the body"
            )
            if width == 1440:
                page.screenshot(path=str(shots / "admin-release.png"))
            page.get_by_role("button", name="Yes, release it").click()
            expect(page.locator("ul.messagelist")).to_have_text("Released 1 of 1 selected job.")
            expect(page.locator(".field-status_display .readonly")).to_have_text("Queued")

            # The Queues page: every queue with jobs, its controls on screen.
            page.goto(f"{live_server.url}/admin/leasejobs/queue/")
            expect(page.locator("h1")).to_have_text("Queues")
            expect(page.locator(".leasejobs-queue-list tbody th")).to_have_text(
                ["default", "emails", "payments", "pdf", "receipts", "reports", "stock"]
            )
            table = page.locator(".leasejobs-queue-list").bounding_box()
            assert table["x"] + table["width"] <= width
            expect(page.locator(".leasejobs-queue-list button", has_text="Resume")).to_have_count(1)
            if width == 1440:
                page.screenshot(path=str(shots / "admin-queues.png"))
        finally:
            browser.close()

    assert Job.objects.get(pk=healthy).status == "queued"
    target = os.environ.get("LEASEJOBS_ADMIN_SCREENSHOTS")
    if target:
        for shot in shots.glob("*.png"):
            shutil.copyfile(shot, ROOT / target / shot.name)
