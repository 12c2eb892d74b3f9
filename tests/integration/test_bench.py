"""manage.py leasejobs_bench runs real workers with tiny numbers and prints its figures."""

import json
import os
import re
import statistics
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from bench.report import pace, render
from leasejobs.models import Job
from tests.connection_budget import many_connections
from tests.helpers import database_url

TINY = [
    "--jobs", "300", "--workers", "1,2", "--repeat", "1", "--enqueue-jobs", "200",
    "--latency-jobs", "5", "--latency-rate", "50",
    "--raw-sql", "--raw-batches", "1,10", "--raw-clients", "1", "--raw-jobs", "200",
]  # fmt: skip


@pytest.fixture
def bench_env(transactional_db, monkeypatch):
    """The bench's worker processes read the test database from DATABASE_URL.

    The bench counts the rows every table of the database wrote during a run. A
    backend reports its counts when it goes idle, at most once a second: the rows
    the test database's creation wrote (Django's content types, permissions and
    migrations, on this connection) would otherwise land inside the first run.
    """
    monkeypatch.setenv("DATABASE_URL", database_url())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


def bench(*args: str) -> str:
    out = StringIO()
    call_command("leasejobs_bench", *args, stdout=out)
    return out.getvalue()


def jobs_per_s(output: str, label: str) -> float:
    match = re.search(re.escape(label) + r"\s+([\d,]+) jobs/s", output)
    assert match, f"{label!r} not in:\n{output}"
    return float(match.group(1).replace(",", ""))


def test_the_table_shows_every_figure_and_the_bench_leaves_no_job(bench_env):
    output = bench(*TINY, "--worker-log-level", "warning")
    for label in (
        "enqueue, single (task.enqueue, Django connection)",
        "enqueue's own INSERT sent bare (ENQUEUE_PLAIN, one cursor)",
        "bare INSERT, one row per statement (same Django connection, one cursor)",
        "bare INSERT, one row per statement (same Django connection, a cursor each)",
        "bare INSERT with enqueue's NOTIFY (same Django connection, one cursor)",
        "enqueue, bulk (bulk_enqueue, 1,000 per call)",
        "enqueue, bulk ids (bulk_enqueue_ids, 1,000 per call)",
        "processing, 1 worker(s) x concurrency 4, WARNING",
        "processing, 2 worker(s) x concurrency 4, WARNING",
        "raw SQL limit, 1 per statement, 1 client(s)",
        "raw SQL limit, 10 per statement, 1 client(s)",
        "raw SQL limit, INSERT one job per statement",
        "raw SQL limit, INSERT 1,000 jobs per statement",
    ):
        assert jobs_per_s(output, label) > 0
    assert re.search(
        r"latency enqueue-to-start p50 / p95 / p99 \(5 jobs\)\s+[\d.]+ / [\d.]+ / [\d.]+ ms", output
    )
    assert re.search(r"of the bare INSERT, \d+% of it with a cursor per statement\)", output)
    assert "workers logging at WARNING" in output
    assert re.search(
        r"CPU time taken by the host \(steal\) during the whole run: [\d.]+% of all CPUs", output
    )
    assert re.search(r"worker RSS, 1w c4 WARNING idle / 25% / end\s+[\d.]+ / ([\d.]+|-) / [\d.]+ MB", output)
    assert re.search(
        r"database per job, processing 1w c4 WARNING\s+WAL [\d,]+ B, [\d.]+ full-page images, "
        r"[\d.]+ transactions, [\d.]+ row versions written \([\d.]+ left dead\), PostgreSQL CPU [\d.]+ µs",
        output,
    )
    assert not Job.objects.exists()
    with connection.cursor() as cursor:  # the raw-SQL table is dropped after each use
        cursor.execute("SELECT to_regclass('leasejobs_bench_raw')")
        assert cursor.fetchone() == (None,)


def test_json_with_a_large_table_shows_the_claim_using_its_partial_index(bench_env):
    output = bench("--json", "--jobs", "200", "--workers", "1", "--repeat", "1", "--enqueue-jobs", "0",
                   "--latency-jobs", "0", "--table-rows", "2000", "--prefetch", "10")  # fmt: skip
    results = json.loads(output)
    empty, large = results["processing"]
    assert (empty["table_rows"], large["table_rows"]) == (0, 2000)
    assert empty["median"] > 0 and large["median"] > 0
    # Claims and finishes change the status, which the claim index's predicate reads: never HOT.
    # A job claimed beyond what the children had room for is given back and claimed again:
    # two more updates each, a few per run.
    assert 2 * 200 <= large["updates"] <= 2 * 200 + 40, large["updates"]
    # Each job is inserted once and updated twice (claim, finish): three row versions, two dead.
    cost = empty["database"]
    assert 3.0 <= cost["rows_written"] <= 3.2 and 2.0 <= cost["dead_rows"] <= 2.2, cost
    assert cost["wal_bytes"] > 0 and cost["xacts"] > 0 and cost["pg_cpu_us"] > 0, cost
    assert "Index Scan using leasejobs_job_claim" in results["table"]["claim_plan"]
    assert results["settings"]["prefetch"] == 10
    assert not Job.objects.exists()


def test_a_bad_option_is_refused():
    with pytest.raises(CommandError, match="--workers"):
        call_command("leasejobs_bench", "--workers", "0")


def test_io_and_cpu_workloads_run_real_work_and_show_the_ideal(bench_env):
    """Jobs that wait or compute: never faster than the ideal, which the table prints beside them."""
    common = ["--workers", "1", "--repeat", "1", "--enqueue-jobs", "0", "--latency-jobs", "0",
              "--worker-log-level", "warning"]  # fmt: skip
    io_args = ["--jobs", "160", "--concurrency", "16", "--workload", "io", "--io-seconds", "0.05"]
    output = bench(*common, *io_args)
    assert "160 waiting (50 ms) jobs per processing run" in output
    io = jobs_per_s(output, "processing, 1 worker(s) x concurrency 16, WARNING, io jobs")
    assert 0 < io <= 16 / 0.05 * 1.05  # no-op jobs would run at thousands per second
    assert re.search(r"\d+% of the ideal 320\b", output)

    cpu_args = ["--jobs", "40", "--concurrency", "2", "--workload", "cpu", "--cpu-seconds", "0.01"]
    results = json.loads(bench(*common, "--json", *cpu_args))
    (cpu,) = results["processing"]
    cores = min(2, os.cpu_count() or 1)  # each of the 2 children computes on a core of its own
    assert (cpu["workload"], cpu["ideal"]) == ("cpu", cores * 100.0)
    assert 0 < cpu["median"] <= cores * 100 * 1.05
    assert results["settings"]["workload"] == {"kind": "cpu", "seconds": 0.01}
    assert not Job.objects.exists()


def test_a_job_of_ten_steps_is_measured_against_ten_jobs_and_a_chain_of_ten(bench_env):
    """--steps-jobs: the three shapes drained in turn by the same workers, each fully done."""
    common = ["--workers", "1", "--repeat", "1", "--jobs", "0", "--enqueue-jobs", "0", "--latency-jobs", "0",
              "--worker-log-level", "warning"]  # fmt: skip
    output = bench(*common, "--steps-jobs", "20")
    for label in (
        "10 no-op jobs (20 of each, 1w c4)",
        "a chain of 10 no-op jobs, each enqueued by the one before (20 of each, 1w c4)",
        "one job of 10 durable steps (20 of each, 1w c4)",
    ):
        assert re.search(re.escape(label) + r"\s+[\d.]+ ms of drain time", output), output
    assert re.search(r"\d+% of the 10 jobs, \d+% of the chain", output)
    results = json.loads(bench(*common, "--steps-jobs", "5", "--json"))
    assert set(results["steps"]) >= {"plain", "chain", "steps"}
    assert not Job.objects.exists()


@many_connections(17)
def test_latency_under_load_drains_half_the_measured_rate_meanwhile(bench_env):
    args = ["--json", "--jobs", "300", "--workers", "2", "--repeat", "1", "--enqueue-jobs", "0",
            "--latency-jobs", "10", "--latency-rate", "20", "--latency-under-load"]  # fmt: skip
    results = json.loads(bench(*args))
    (processing,) = results["processing"]
    loaded = results["latency_under_load_ms"]
    assert loaded["jobs"] == 10 and 0 < loaded["p50"] <= loaded["p99"] <= loaded["max"]
    assert loaded["load_rate"] == processing["median"] / 2
    assert loaded["load_reached"] > 0
    assert not Job.objects.exists()


def test_latency_under_load_needs_a_rate_or_a_processing_figure(bench_env):
    with pytest.raises(CommandError, match="--latency-under-load needs --load-rate"):
        bench("--jobs", "0", "--enqueue-jobs", "0", "--latency-jobs", "2", "--latency-under-load")


@many_connections(16)
def test_a_backlog_is_drained_while_jobs_arrive_each_round_against_the_empty_table_just_before(bench_env):
    args = ["--json", "--jobs", "300", "--workers", "2", "--repeat", "1", "--enqueue-jobs", "0",
            "--latency-jobs", "0", "--backlog", "3000", "--arrive-rate", "200",
            "--backlog-rounds", "2"]  # fmt: skip
    results = json.loads(bench(*args))
    backlog = results["backlog"]
    assert (backlog["rows"], backlog["workers"], backlog["arrive_rate"]) == (3000, 2, 200.0)
    first, second = backlog["rounds"]
    for r in (first, second):
        assert r["arrived"] > 0  # every one of them done too, or the bench would have said so
        assert r["empty"] > 0
        assert r["of_empty"] == r["jobs_per_s"] / r["empty"]
    assert backlog["arrived"] == first["arrived"] + second["arrived"]
    assert backlog["of_empty"] == statistics.median([first["of_empty"], second["of_empty"]])
    assert backlog["jobs_per_s"] == statistics.median([first["jobs_per_s"], second["jobs_per_s"]])
    assert not Job.objects.exists()
    text = render(results)
    whole = (
        r"backlog of 3,000 queued jobs, 2 worker\(s\) x concurrency 4, [\d,]+ enqueued meanwhile, "
        r"median of 2 rounds\s+[\d,]+ jobs/s  \(\d+% of the empty table's just before\)"
    )
    assert re.search(whole, text), text
    for n, r in enumerate((first, second), 1):
        line = rf"  backlog round {n}\s+[\d,]+ jobs/s against [\d,]+ empty \({r['of_empty']:.0%}\)"
        assert re.search(line, text), text
    header = text.splitlines()[0]
    assert header.endswith("  autovacuum off") == (results["machine"]["autovacuum"] == "off")


@many_connections(16)
def test_a_backlog_drained_again_without_vacuum_is_reported_and_drawn(bench_env, tmp_path):
    drawing = tmp_path / "backlog.png"
    args = ["--json", "--jobs", "300", "--workers", "2", "--repeat", "1", "--enqueue-jobs", "0",
            "--latency-jobs", "0", "--backlog", "20000", "--arrive-rate", "200",
            "--backlog-without-vacuum", "--plot-backlog", str(drawing)]  # fmt: skip
    results = json.loads(bench(*args))
    backlog = results["backlog"]
    (only,) = backlog["rounds"]
    without = only["without_vacuum"]
    assert without["empty"] == only["empty"]  # one reference for both drains
    assert without["of_empty"] == without["jobs_per_s"] / without["empty"]
    assert backlog["without_vacuum"] == {"jobs_per_s": without["jobs_per_s"], "of_empty": without["of_empty"]}
    for drain in (only, without):
        claimed = [n for _, n in drain["timeline"]]
        assert claimed == sorted(claimed) and all(0 <= n <= 20000 for n in claimed)
    assert not Job.objects.exists()
    text = render(results)
    assert re.search(
        r"the same, the workers with --no-vacuum\s+[\d,]+ jobs/s  \(\d+% of the empty table's\)", text
    )
    assert re.search(r"  backlog round 1, --no-vacuum\s+[\d,]+ jobs/s against [\d,]+ empty", text), text
    assert drawing.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and drawing.stat().st_size > 10_000


def test_the_pace_of_a_drain_is_read_between_two_shares_of_its_backlog():
    steady_then_slow = [(0.0, 0), (1.0, 400), (2.0, 800), (4.0, 900), (6.0, 1000)]
    assert pace(steady_then_slow, 1000, (0.1, 0.2)) == pytest.approx(400)  # 100 jobs in 0.25 s
    assert pace(steady_then_slow, 1000, (0.8, 0.9)) == pytest.approx(50)  # 100 jobs in 2 s
    assert pace(steady_then_slow[:2], 1000, (0.8, 0.9)) is None  # not sampled that far


def test_plot_backlog_needs_a_backlog(bench_env):
    with pytest.raises(CommandError, match="--plot-backlog draws the --backlog drains"):
        bench("--jobs", "0", "--enqueue-jobs", "0", "--latency-jobs", "0", "--plot-backlog", "x.png")


@many_connections(10)
def test_the_workflow_figure_compares_a_fan_out_fan_in_with_plain_jobs(bench_env):
    output = bench("--workflow", "30", "--workers", "1", "--repeat", "1", "--json")
    result = json.loads(output)
    assert result["jobs"] == 30 and len(result["workflow_jobs_per_s"]) == 1
    assert result["ratio"] == pytest.approx(result["workflow_median"] / result["plain_median"], rel=0.01)
    assert not Job.objects.exists()  # the bench leaves no job
