"""Observability as an operator sees it: real workers scraped, probed, paused and read.

Metrics are scraped over HTTP and parsed with prometheus-client's own
parser; the health probe is run as ``manage.py leasejobs_health`` against a
worker paused with SIGSTOP; the JSON log is read line by line with ``json``.
"""

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from leasejobs.models import Job
from tests.connection_budget import many_connections
from tests.helpers import ROOT, wait_until, worker_env
from tests.testapp.tasks import add, always_fails, flaky, noisy, sleeper

#: What a line of the Prometheus text format may be (comments, or a sample).
PROM_LINE = re.compile(
    r"^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*"
    r"|[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\]|\\.)*\",?)*\})? \S+( \d+)?)$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[str, list]:
    """Samples by name, after checking every line against the text format."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    bad = [line for line in text.splitlines() if line and not PROM_LINE.match(line)]
    assert not bad, bad
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found)


def done(*jobs: Job, status: str = "done") -> bool:
    return Job.objects.filter(id__in=[j.id for j in jobs], status=status).count() == len(jobs)


def health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "leasejobs_health", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- Prometheus -------------------------------------------------------------------


def test_a_worker_serves_its_counters_and_histograms_on_its_metrics_port(start_worker):
    port = free_port()
    worker = start_worker("-v", "2", "--metrics-port", str(port), "--heartbeat", "0.5", "--lease", "3")
    jobs = [add.enqueue(i, 1) for i in range(3)]
    retried = flaky.enqueue(1)
    failed = always_fails.enqueue()
    wait_until(lambda: done(*jobs, retried) and done(failed, status="failed"), 60, what="jobs finished")
    worker.wait_for_log(rf"done job={retried.id} ")
    url = f"http://127.0.0.1:{port}/metrics"
    add_labels = {"queue": "default", "task": "tests.testapp.tasks.add"}
    flaky_labels = {"queue": "default", "task": "tests.testapp.tasks.flaky"}
    fails_labels = {"queue": "default", "task": "tests.testapp.tasks.always_fails"}

    def settled() -> dict:
        s = scrape(url)
        return s if value(s, "leasejobs_jobs_finished_total", outcome="failed", **fails_labels) == 1 else {}

    s = wait_until(settled, 30, interval=0.3, what="the failure counted")
    assert value(s, "leasejobs_jobs_claimed_total", **add_labels) == 3
    assert value(s, "leasejobs_jobs_claimed_total", **flaky_labels) == 2
    assert value(s, "leasejobs_jobs_finished_total", outcome="done", **add_labels) == 3
    assert value(s, "leasejobs_jobs_finished_total", outcome="retried", **flaky_labels) == 1
    assert value(s, "leasejobs_jobs_finished_total", outcome="done", **flaky_labels) == 1
    assert value(s, "leasejobs_jobs_finished_total", outcome="retried", **fails_labels) == 1
    assert value(s, "leasejobs_job_run_seconds_count", **add_labels) == 3
    assert value(s, "leasejobs_job_queue_seconds_count", **flaky_labels) == 2
    # The retry waited its backoff (0.1 to 0.2 s) after its run_at? No: queue
    # time starts at run_at, which the retry moved; it is small but counted.
    assert value(s, "leasejobs_job_queue_seconds_sum", **add_labels) >= 0
    assert value(s, "leasejobs_statement_seconds_count", statement="claim") >= 1
    assert value(s, "leasejobs_statement_seconds_count", statement="finish") >= 1
    assert value(s, "leasejobs_threads") == 4
    # Bodies running is what the pool thread saw at its last look at the bodies, at most
    # 50 ms ago (pool.BODY_LOOK_SECONDS, TIMEOUT_LOOK_SECONDS): it may still count the last one.
    wait_until(
        lambda: value(scrape(url), "leasejobs_threads_busy") == 0, 5, interval=0.05, what="no body running"
    )
    assert value(s, "leasejobs_leases_lost_total") == 0


def test_a_lost_lease_and_its_rejected_stale_finish_are_counted(start_worker):
    port = free_port()
    # No heartbeat and a 1 s lease: the 10 s job is taken over by the second worker
    # (10 s: time for it to start, also on a loaded machine).
    slow = start_worker(
        "-v", "2", "--metrics-port", str(port), "--no-heartbeat", "--lease", "1", "--concurrency", "1"
    )
    job = sleeper.enqueue(10)
    slow.wait_for_log(rf"claimed job={job.id} ", timeout=60)
    start_worker("--queue", "default", "--heartbeat", "0.5", "--lease", "5")
    slow.wait_for_log(rf"lease lost job={job.id} attempt=1 ", timeout=30)
    s = scrape(f"http://127.0.0.1:{port}/metrics")
    labels = {"queue": "default", "task": "tests.testapp.tasks.sleeper"}
    assert value(s, "leasejobs_leases_lost_total", **labels) == 1
    assert value(s, "leasejobs_stale_writes_rejected_total", **labels) == 1
    assert value(s, "leasejobs_jobs_finished_total", **labels) == 0


def test_the_metrics_view_serves_queue_wide_gauges(live_server):
    add.enqueue(1, 2)
    add.using(queue="reports").enqueue(1, 2)
    late = add.using(queue="reports").enqueue(3, 4)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE leasejobs_job SET run_at = now() - interval '90 seconds' WHERE id = %s", [late.id]
        )
        cursor.execute(
            "UPDATE leasejobs_job SET status = 'running', attempt = 1, leased_by = 'gone', "
            "lease_until = now() - interval '5 seconds' WHERE queue = 'default'"
        )
        cursor.execute(
            "INSERT INTO leasejobs_worker VALUES ('w-live', 'h', 1, now(), now(), 10), "
            "('w-dead', 'h', 2, now(), now() - interval '1 hour', 10)"
        )
    s = scrape(f"{live_server.url}/metrics/leasejobs")
    assert value(s, "leasejobs_queue_jobs", queue="reports", status="queued") == 2
    assert value(s, "leasejobs_queue_jobs", queue="default", status="running") == 1
    assert value(s, "leasejobs_queue_expired_leases", queue="default") == 1
    assert value(s, "leasejobs_queue_expired_leases", queue="reports") == 0
    assert 89 < value(s, "leasejobs_queue_oldest_due_age_seconds", queue="reports") < 150
    assert value(s, "leasejobs_live_workers") == 1


# -- signals ----------------------------------------------------------------------


@many_connections(18)
def test_signals_reach_receivers_and_a_raising_receiver_never_breaks_the_worker(start_worker, tmp_path):
    received = tmp_path / "signals.jsonl"
    env = {"LEASEJOBS_TEST_SIGNALS": str(received)}
    slow = start_worker("-v", "2", "--no-heartbeat", "--lease", "1", "--concurrency", "1", env=env)
    taken_over = sleeper.enqueue(10)  # the other worker starts within 10 s, also on a loaded machine
    slow.wait_for_log(rf"claimed job={taken_over.id} ", timeout=60)
    fast = start_worker("--heartbeat", "0.5", "--lease", "5", env=env)
    ok = add.enqueue(1, 1)
    retried = flaky.enqueue(1)
    wait_until(lambda: done(ok, retried, taken_over), 60, what="jobs done")
    slow.wait_for_log(rf"lease lost job={taken_over.id} attempt=1 ", timeout=30)

    def events() -> list[dict]:
        return [json.loads(line) for line in received.read_text().splitlines()]

    wait_until(lambda: any(e["signal"] == "lease_lost" for e in events()), 10, what="lease_lost sent")
    got = events()
    assert {"signal": "job_started", "job": ok.id, "attempt": 1, "queue": "default"} in got
    assert {
        "signal": "job_finished",
        "job": ok.id,
        "attempt": 1,
        "queue": "default",
        "outcome": "done",
    } in got
    finished_retry = [e for e in got if e["job"] == retried.id and e["signal"] == "job_finished"]
    assert [(e["attempt"], e["outcome"], e.get("exception")) for e in finished_retry] == [
        (1, "retry", "ValueError"),
        (2, "done", None),
    ]
    lost = {(e["job"], e["attempt"]): e["reason"] for e in got if e["signal"] == "lease_lost"}
    assert "stale done dropped" in lost[(taken_over.id, 1)]
    # One signal per lease a worker logged as lost: on a loaded machine a later attempt
    # may lose its lease too (CI once saw attempt 2's), and then it is sent as well.
    logged = {
        (job, attempt)
        for job, attempt in lost
        if slow.count(rf"lease lost job={job} attempt={attempt} ")
        + fast.count(rf"lease lost job={job} attempt={attempt} ")
    }
    assert logged == set(lost)
    assert len([e for e in got if e["signal"] == "lease_lost"]) == len(lost)
    assert slow.count(rf"signal receiver raising_job_started_receiver raised job={taken_over.id} ") == 1
    assert slow.proc.poll() is None  # still alive


# -- health probe -----------------------------------------------------------------


def test_the_worker_probe_fails_while_the_worker_is_paused(start_worker):
    assert health("--worker").returncode == 1  # no worker on this host yet
    worker = start_worker("--heartbeat", "0.5", "--lease", "3")
    wait_until(lambda: health("--worker").returncode == 0, 30, interval=0.5, what="a fresh heartbeat")
    ok = health("--worker")
    assert re.fullmatch(rf"OK: worker \S+-{worker.pid}-\w+ heartbeated [\d.]+ s ago\n", ok.stdout)
    worker.signal(signal.SIGSTOP)
    try:
        time.sleep(2.0)  # two intervals of 0.5 s, and some
        paused = health("--worker")
        assert paused.returncode == 1
        assert paused.stdout.startswith("UNHEALTHY: worker ") and "last heartbeated" in paused.stdout
        assert paused.stdout.count("\n") == 1
    finally:
        worker.signal(signal.SIGCONT)
    wait_until(lambda: health("--worker").returncode == 0, 30, interval=0.5, what="heartbeats again")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert health("--worker").returncode == 1  # a clean stop deletes its row


def test_a_worker_is_live_as_soon_as_it_has_started_not_one_heartbeat_later(start_worker):
    # The default lease (30 s) heartbeats every 10 s: the probe must not fail for those
    # first 10 s (a liveness probe would restart the pod; the admin would show no worker).
    worker = start_worker()
    worker.wait_for_log(r"worker started worker=")
    began = time.monotonic()
    wait_until(lambda: health("--worker").returncode == 0, 30, interval=0.2, what="the worker live")
    assert time.monotonic() - began < 5.0
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.django_db(transaction=True)
def test_the_queue_probe_checks_the_oldest_due_job_and_expired_leases():
    assert health("--queue").stdout.startswith("OK: queue lag 0 s, 0 expired lease(s)")
    late = add.enqueue(1, 1)
    Job.objects.filter(id=late.id).update(run_at=Job.objects.get(id=late.id).run_at - dt_seconds(120))
    lagging = health("--queue", "--max-lag", "60s")
    assert lagging.returncode == 1
    assert re.fullmatch(
        r"UNHEALTHY: oldest due job in queue default waited 1\d\d s \(limit 60 s\)\n", lagging.stdout
    )
    assert health("--queue", "--max-lag", "5m").returncode == 0
    Job.objects.filter(id=late.id).update(status="running", attempt=1, lease_until=late.run_at)
    expired = health("--queue")
    assert expired.returncode == 1 and "1 expired lease(s) (limit 0)" in expired.stdout
    assert health("--queue", "--max-expired", "1").returncode == 0


@pytest.mark.django_db(transaction=True)
def test_the_queue_probe_of_a_queue_nothing_uses_says_so_instead_of_ok():
    served = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", REGISTERED_QUEUES],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.splitlines()[-1]
    assert "default" in served.split(", ")
    typo = health("--queue", "reciepts")
    assert (typo.returncode, typo.stdout) == (
        1,
        "UNHEALTHY: queue 'reciepts' has no jobs and no registered task uses it: check the name (the "
        f"registered tasks use {served}), or declare a queue that only .using(queue=...) reaches in "
        "LEASEJOBS['QUEUES'] ({'reciepts': {}})\n",
    )
    used = health("--queue", "default")  # no job, but tasks use it
    assert used.returncode == 0 and used.stdout.startswith("OK: queue default lag 0 s, 0 expired lease(s)"), (
        used.stdout
    )
    add.using(queue="reciepts").enqueue(1, 1)  # a queue only .using() reaches, once it has a job
    found = health("--queue", "reciepts")
    assert found.returncode == 0 and found.stdout.startswith("OK: queue reciepts lag "), found.stdout


#: The queues of the tasks a worker of the test project registers, as leasejobs_health names them.
REGISTERED_QUEUES = (
    "from leasejobs.jobs import registry; from leasejobs.jobs.discovery import discover; discover(); "
    "print(', '.join(sorted({t.queue for t in registry.all_tasks().values()})))"
)


def dt_seconds(n: float):
    import datetime as dt

    return dt.timedelta(seconds=n)


# -- JSON logs --------------------------------------------------------------------


def test_json_logs_carry_the_text_lines_fields_and_escape_the_message(start_worker):
    worker = start_worker("-v", "2", "--log-format", "json", "--heartbeat", "0.5", "--lease", "3")
    ok = add.enqueue(1, 2)
    bad = noisy.enqueue()
    wait_until(lambda: done(ok) and done(bad, status="failed"), 30, what="jobs finished")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    lines = [line for line in worker.log().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    by_event = {(e.get("event"), e.get("job")): e for e in entries}
    done_entry = by_event[("done", ok.id)]
    assert done_entry["attempt"] == 1 and done_entry["level"] == "DEBUG"
    assert done_entry["worker"] == by_event[("worker started", None)]["worker"]
    assert done_entry["message"] == f"done job={ok.id} attempt=1 worker={done_entry['worker']}"
    failed = by_event[("failed", bad.id)]
    assert failed["level"] == "ERROR"
    assert failed["message"].endswith('ValueError: he said "hi"\tand left a \\ behind')
    assert '\\"hi\\"\\tand left a \\\\ behind' in lines[entries.index(failed)]
    assert by_event[("claimed", ok.id)]["task"] == "tests.testapp.tasks.add"
    assert {e["event"] for e in entries} >= {"worker started", "claimed", "done", "failed", "worker stopped"}


def test_a_metrics_port_in_use_stops_the_worker_with_one_clear_message(start_worker):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        worker = start_worker("--metrics-port", str(taken.getsockname()[1]))
        assert worker.wait() != 0
    refused = r"CommandError: Cannot serve metrics: \[Errno 98\] Address already in use\."
    assert re.search(refused, worker.log())
