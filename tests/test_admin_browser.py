"""The admin end to end, in a real headless Chromium.

Debian's ``chromium`` package drives it through Playwright for Python; no
browser is downloaded (``playwright install`` is never run), so the test
needs ``/usr/bin/chromium`` (``.ci/run`` installs it when missing) and fails
with a clear message without it rather than skipping.

The screenshot is saved under the test's tmp_path; set
``LEASEJOBS_ADMIN_SCREENSHOTS=docs`` to write the ones the docs show
(``docs/admin-screenshot.png``, ``docs/admin-overview.png``, and the
charts alone, ``docs/admin-charts.png``).
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
ROOT = Path(__file__).resolve().parent.parent


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
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.goto(f"{live_server.url}/admin/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", "night-shift")
            page.click("input[type=submit]")
            page.get_by_role("link", name="Jobs", exact=True).click()
            page.click("#toggle-nav-sidebar")  # room for the columns

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
            page.screenshot(path=str(shots / "admin-screenshot.png"), full_page=True)

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
        for name in ("admin-screenshot.png", "admin-overview.png", "admin-charts.png"):
            shutil.copyfile(shots / name, ROOT / target / name)
