"""Measure the job admin on a big table: queries and time per page.

Usage (against a throwaway database, never one that matters):

    export DATABASE_URL=postgres://postgres:postgres@localhost:5432/leasejobs_admin
    python manage.py migrate
    python docs/admin_scale.py --fill 1000000   # TRUNCATEs the jobs, inserts N rows, VACUUM ANALYZE
    python docs/admin_scale.py                  # measures
    python docs/admin_scale.py --charts         # the overview's charts only
    python docs/admin_scale.py --only overview  # the overview's pages only, warm and cold
    python docs/admin_scale.py --with-worker    # the day overview once a worker stored its charts

Each page is fetched with Django's test client as a superuser, three times
(the best and the worst time are reported, after one warm-up), with every
query captured; the pages named "cold" are fetched with every stored chart
point deleted before each fetch;
the plan of the changelist's row query is shown so one can see which index
serves it. Then each chart query of the overview
(``leasejobs.db.sql.charts.QUERIES``) is timed alone, over the last hour and
the last day, best of three after a warm-up. See docs/admin.md for the figures.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_site.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from leasejobs.admin import charts  # noqa: E402
from leasejobs.db.sql import charts as chart_sql  # noqa: E402
from leasejobs.models import ChartPoint, Job  # noqa: E402

FILL = """
TRUNCATE leasejobs_job, leasejobs_sideeffect, leasejobs_step;
INSERT INTO leasejobs_job (
    task_name, queue, priority, args, kwargs, status, attempt, max_attempts, run_at,
    lease_until, leased_by, heartbeat_at, cancel_requested, idempotency_key, last_error,
    errors, worker_ids, result, created_at, started_at, finished_at)
SELECT
    CASE WHEN g %% 100000 = 7 THEN 'shop.tasks.weekly_report'  -- a rare task, once per 100,000 jobs
         ELSE 'shop.tasks.' || (ARRAY['send_receipt', 'render_pdf', 'sync_stock', 'charge_card'])[1 + g %% 4]
    END,
    (ARRAY['default', 'receipts', 'pdf', 'stock', 'payments'])[1 + g %% 5],
    0, jsonb_build_array(g, 'order-' || g), '{}'::jsonb, s.status,
    CASE WHEN s.status = 'queued' THEN 0 ELSE 1 + g %% 3 END, 5,
    now() - make_interval(secs => (%(n)s - g) * %(step)s),
    CASE WHEN s.status = 'running' THEN now() + make_interval(secs => 30 - g %% 60) END,
    CASE WHEN s.status = 'queued' THEN '' ELSE 'host-' || g %% 8 || '-w' END,
    CASE WHEN s.status = 'running' THEN now() - make_interval(secs => g %% 60) END,
    false,
    CASE WHEN g %% 10 = 0 THEN 'order:' || g END,
    CASE WHEN s.status = 'failed' THEN 'ValueError: card declined for order ' || g ELSE '' END,
    '[]'::jsonb, '[]'::jsonb,
    CASE WHEN s.status = 'done' THEN '{"ok": true}'::jsonb END,
    now() - make_interval(secs => (%(n)s - g) * %(step)s),
    CASE WHEN s.status <> 'queued' THEN now() - make_interval(secs => (%(n)s - g) * %(step)s) END,
    CASE WHEN s.status IN ('done', 'failed', 'cancelled')
         THEN now() - make_interval(secs => (%(n)s - g) * %(step)s) END
FROM generate_series(1, %(n)s) AS g,
LATERAL (SELECT CASE
    WHEN g > %(n)s - 1000 AND g %% 5 = 0 THEN 'running'
    WHEN g > %(n)s - 5000 THEN 'queued'
    WHEN g %% 50 = 0 THEN 'failed'
    WHEN g %% 97 = 0 THEN 'cancelled'
    ELSE 'done' END AS status) AS s
"""

PAGES = [
    ("changelist", "/admin/leasejobs/job/"),
    ("changelist, page 50", "/admin/leasejobs/job/?p=50"),
    ("status = failed", "/admin/leasejobs/job/?status__exact=failed"),
    ("status = done, queue = receipts", "/admin/leasejobs/job/?status__exact=done&queue=receipts"),
    ("lease = expired", "/admin/leasejobs/job/?lease=expired"),
    ("lease = held", "/admin/leasejobs/job/?lease=held"),
    ("search: a job id", "/admin/leasejobs/job/?q={last_id}"),
    ("search: an idempotency key", "/admin/leasejobs/job/?q=order:500000"),
    ("search: part of a task name", "/admin/leasejobs/job/?q=charge"),
    ("search: a task name nowhere", "/admin/leasejobs/job/?q=no_such_task"),
    ("search: a rare task's full name", "/admin/leasejobs/job/?q=shop.tasks.weekly_report"),
    ("job page", "/admin/leasejobs/job/{last_id}/change/"),
    ("job page, a failed job", "/admin/leasejobs/job/{failed_id}/change/"),
    ("overview", "/admin/leasejobs/joboverview/"),
    ("overview, day", "/admin/leasejobs/joboverview/?window=day"),
    ("queues", "/admin/leasejobs/queue/"),
]

#: Pages fetched cold: every stored chart point deleted before each fetch
#: (after a deploy, or when nobody looked for two days).
COLD_PAGES = [
    ("overview, day, cold", "/admin/leasejobs/joboverview/?window=day"),
    ("overview, hour, cold", "/admin/leasejobs/joboverview/"),
]


def fill(n: int, span_days: float | None = None) -> None:
    """Insert n jobs created 0.5 s apart, or spread evenly over span_days."""
    step = span_days * 86400 / n if span_days else 0.5
    with connection.cursor() as cursor:
        started = time.perf_counter()
        cursor.execute(FILL, {"n": n, "step": step})
        cursor.execute("VACUUM ANALYZE leasejobs_job")
    print(f"filled {n:,} jobs in {time.perf_counter() - started:.1f} s")


def measure(only: str | None = None) -> None:
    """Time each page (``only``: those whose name holds it, and no plans or chart table)."""
    user, _ = User.objects.get_or_create(username="scale", defaults={"is_staff": True, "is_superuser": True})
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    rows = Job.objects.count()
    last_id = Job.objects.order_by("-id").values_list("id", flat=True).first()
    failed_id = Job.objects.filter(status="failed").order_by("-id").values_list("id", flat=True).first()
    print(f"{rows:,} jobs in the table; PostgreSQL {connection.pg_version}")
    print(f"{'page':34} {'status':>6} {'queries':>7} {'best ms':>8} {'worst ms':>8} {'SQL ms':>7}")
    every = {}
    for name, url in [*PAGES, *COLD_PAGES]:
        if only is not None and only not in name:
            continue
        url = url.format(last_id=last_id, failed_id=failed_id)
        cold = (name, url) in COLD_PAGES
        client.get(url)  # warm-up
        best = None
        worst = 0.0
        for _ in range(3):
            if cold:
                ChartPoint.objects.all().delete()
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(url)
                elapsed = (time.perf_counter() - started) * 1000
            sql_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1000
            worst = max(worst, elapsed)
            if best is None or elapsed < best[0]:
                # captured_queries is a view of the connection's log: copy it.
                best = (elapsed, sql_ms, response.status_code, list(queries.captured_queries))
        elapsed, sql_ms, status, captured = best
        count = len(captured)
        print(f"{name:34} {status:>6} {count:>7} {elapsed:>8.1f} {worst:>8.1f} {sql_ms:>7.1f}")
        every[name] = captured
    if only is not None:
        return
    changelist_queries = every["changelist"]
    print("\nqueries of the unfiltered changelist:")
    for q in changelist_queries:
        print(f"  {float(q['time']) * 1000:7.2f} ms  {q['sql'][:110]}")
    rows_sql = changelist_queries[-1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + rows_sql)
        plan = [r[0] for r in cursor.fetchall()]
    print("\nplan of its row query:")
    print("\n".join("  " + line for line in plan))
    for name in ("job page, a failed job", "overview", "queues"):
        print(f"\nqueries of the {name}:")
        for q in every[name]:
            print(f"  {float(q['time']) * 1000:7.2f} ms  {q['sql'][:110]}")
    measure_charts()


def measure_charts() -> None:
    """Time each chart of the overview per window: cold (nothing stored: the whole
    window is read from the jobs) and warm (only the current bucket is, best of three)."""
    print(f"\n{'chart':12} {'window':6} {'cold ms':>8} {'warm ms':>8}")
    for name in chart_sql.QUERIES:
        for window in charts.WINDOWS.values():
            ChartPoint.objects.filter(chart=name).delete()
            started = time.perf_counter()
            charts.points(name, window)
            cold = (time.perf_counter() - started) * 1000
            warm = None
            for _ in range(3):
                started = time.perf_counter()
                charts.points(name, window)
                elapsed = (time.perf_counter() - started) * 1000
                warm = elapsed if warm is None else min(warm, elapsed)
            print(f"{name:12} {window.name:6} {cold:>8.1f} {warm:>8.1f}")


def measure_with_worker(rounds: int = 3) -> None:
    """The day overview once a worker stored the closed buckets: each round deletes every
    stored point (a fresh deploy, or two days unseen), starts ``runworker --queue idle``
    (it claims nothing: the jobs stay as filled), waits until its vacuum thread stored
    every closed bucket, then fetches the page once (no page looked before) and three
    times more."""
    user, _ = User.objects.get_or_create(username="scale", defaults={"is_staff": True, "is_superuser": True})
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    url = "/admin/leasejobs/joboverview/?window=day"
    every = len(chart_sql.QUERIES) * sum(int(w.span / w.step) - 1 for w in charts.WINDOWS.values())
    print(
        f"{'round':5} {'worker stored':>22} {'first ms':>8} {'SQL ms':>7} {'then best':>9} {'worst':>6} load"
    )
    for n in range(1, rounds + 1):
        ChartPoint.objects.all().delete()
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "runworker", "--queue", "idle", "--no-periodic", "-v", "2"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            began = time.monotonic()
            while ChartPoint.objects.filter(series="").count() < every:
                if time.monotonic() - began > 120:
                    raise SystemExit("the worker stored no charts in 2 minutes")
                time.sleep(0.05)
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                client.get(url)
                first = (time.perf_counter() - started) * 1000
            sql_ms = sum(float(q["time"]) for q in queries.captured_queries) * 1000
            later = []
            for _ in range(3):
                started = time.perf_counter()
                client.get(url)
                later.append((time.perf_counter() - started) * 1000)
        finally:
            worker.terminate()
            log = worker.communicate(timeout=60)[0]
        stored = re.findall(r"stored (\d+) closed buckets .* in (\d+) ms", log)
        said = ", ".join(f"{b} in {ms} ms" for b, ms in stored)
        load = os.getloadavg()[0]
        times = f"{first:>8.1f} {sql_ms:>7.1f} {min(later):>9.1f} {max(later):>6.1f}"
        print(f"{n:5} {said:>22} {times} {load:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", type=int, metavar="N", help="truncate the jobs and insert N rows first")
    parser.add_argument(
        "--span-days", type=float, metavar="D", help="with --fill: spread them over D days (else 0.5 s apart)"
    )
    parser.add_argument("--charts", action="store_true", help="time the overview's charts only")
    parser.add_argument("--only", metavar="TEXT", help="time only the pages whose name holds TEXT")
    parser.add_argument(
        "--with-worker", action="store_true", help="time the day overview once a worker stored its charts"
    )
    options = parser.parse_args()
    if options.fill:
        fill(options.fill, options.span_days)
    if options.charts:
        measure_charts()
    elif options.with_worker:
        measure_with_worker()
    else:
        measure(options.only)
