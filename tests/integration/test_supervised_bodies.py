"""Issue 28: promises that survive the job body, now that bodies run in supervised children.

Each test is one of the thirteen holes a hostile review found with real
processes, replayed against real ``runworker`` processes on PostgreSQL: the
numbers asserted are what a user would observe (a journal the bodies write,
the job rows, the worker's exit). Before the bodies moved into child
processes, each of these failed.
"""

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from leasejobs import testing
from leasejobs.db.connection import connection_params
from leasejobs.db.store import ClaimedRow, WorkerStore
from leasejobs.exceptions import LeaseLost
from leasejobs.jobs.context import JobContext
from leasejobs.models import Job, SideEffect
from leasejobs.queues import controls
from tests.connection_budget import many_connections
from tests.helpers import wait_until
from tests.journal import max_concurrency, read_ticks
from tests.journal import read as read_journal
from tests.testapp.models import BodyRun, Sent
from tests.testapp.tasks import (
    async_receipt,
    calls_exit,
    eats_memory,
    erratic,
    exits_hard,
    holds_the_gil,
    journal,
    measures,
    overrunning,
    record,
    returns_a_coroutine,
    segfaults,
    ticking,
)

FINAL = ("done", "failed", "cancelled")


def job_now(job: Job) -> Job:
    job.refresh_from_db()
    return job


def runs(job: Job) -> int:
    return BodyRun.objects.filter(job_id=job.id).count()


def rss_peak_kib(pid: int) -> int:
    """A process's peak resident memory (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for pid {pid}")


# -- 1: a timeout keeps the place under a limit until the body is gone ------------------


def test_1_a_timed_out_body_holds_its_place_until_it_has_stopped(start_worker, tmp_path):
    """Limit 1; four jobs whose first attempts run past their 1 s timeout: never two bodies at once."""
    path = tmp_path / "journal"
    controls.set_limits("one-at-a-time", concurrency=1)
    jobs = [overrunning.using(queue="one-at-a-time").enqueue(str(path), 4) for _ in range(4)]
    worker = start_worker("--concurrency", "4")
    for job in jobs:
        wait_until(lambda j=job: job_now(j).status in FINAL, timeout=90, what=f"job {job.id} ends")
    starts, ends, _ = read_journal(path)
    assert len(starts) == 8 and set(starts) == set(ends), (starts, ends)  # each job: a stopped try, a retry
    assert max_concurrency(path) == 1
    assert all(job_now(j).status == "done" and "TimeoutError" in j.errors[0]["exception_class"] for j in jobs)
    stopped = worker.count(
        r"body stopped job=\d+ attempt=1 worker=\S+ \(after 1\.\ds\): it ran past its timeout"
    )
    assert stopped == 4


# -- 2: a body that holds the GIL ----------------------------------------------------------


@many_connections(15)
def test_2_a_body_holding_the_gil_for_three_leases_runs_once(start_worker):
    """Lease 2 s; one C call holds the GIL for 6 s. The heartbeat is in another process."""
    job = holds_the_gil.enqueue(6)
    start_worker("--worker-id", "a")
    start_worker("--worker-id", "b")
    wait_until(lambda: job_now(job).status in FINAL or runs(job) > 1, timeout=60, what="the job ends")
    time.sleep(2)  # a takeover would need one more lease
    job = job_now(job)
    assert (job.status, job.attempt, runs(job)) == ("done", 1, 1), (job.status, job.last_error)


# -- 3: at most max_attempts bodies, whatever kills what --------------------------------


def test_3_a_job_that_kills_its_process_on_some_runs_starts_exactly_max_attempts_bodies(start_worker):
    """Killed, failed politely, killed: three bodies for max_attempts=3, then failed."""
    job = erratic.enqueue()
    worker = start_worker("--lease", "2")
    wait_until(lambda: job_now(job).status in FINAL, timeout=60, what="the job ends")
    job = job_now(job)
    assert (job.status, job.runs, runs(job)) == ("failed", 3, 3)
    assert [e["exception_class"] for e in job.errors] == [
        "leasejobs.exceptions.ProcessDied",
        "builtins.ValueError",
        "leasejobs.exceptions.ProcessDied",
    ]
    assert "killed by signal 9 (SIGKILL)" in job.last_error
    assert worker.proc.poll() is None


@pytest.mark.parametrize(
    ("task", "error"),
    [
        (segfaults, "killed by signal 11 (SIGSEGV) while its body ran"),
        (exits_hard, "exited with status 3 while its body ran"),
    ],
)
def test_3_a_body_that_crashes_its_process_fails_naming_how_and_the_worker_lives(start_worker, task, error):
    job = task.enqueue(3) if task is exits_hard else task.enqueue()
    worker = start_worker("--lease", "2")
    wait_until(lambda: job_now(job).status in FINAL, timeout=60, what="the job ends")
    job = job_now(job)
    assert (job.status, runs(job)) == ("failed", 2)
    assert job.last_error.endswith(error), job.last_error
    later = record.enqueue("the worker goes on")
    wait_until(lambda: job_now(later).status == "done", what="a later job")
    assert worker.proc.poll() is None


# -- 4: pause and limits apply to jobs the worker already holds -----------------------------


@pytest.mark.parametrize("control", ["pause", "limit"])
def test_4_a_pause_or_a_limit_set_at_run_time_applies_within_a_fraction_of_a_second(
    start_worker, tmp_path, control
):
    path = tmp_path / "journal"
    jobs = journal.using(queue="busy").bulk_enqueue([((str(path), 0.002), {}) for _ in range(3000)])
    start_worker("--concurrency", "4")
    wait_until(lambda: len(read_journal(path)[1]) >= 300, timeout=60, what="300 bodies ended")
    if control == "pause":
        controls.pause_queue("busy")
    else:
        controls.set_limits("busy", concurrency=1)
    applied = time.time()
    time.sleep(2.5)
    starts, _, _ = read_journal(path)
    if control == "pause":
        late = sorted(t - applied for t in starts.values() if t > applied + 0.25)
        assert late == [], f"{len(late)} bodies started more than 0.25 s after the pause: {late[:5]}"
    else:
        assert max_concurrency(path, since=applied + 0.25, open_until=time.time()) == 1
    assert Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() < 3000


# -- 5: a row Python cannot read ------------------------------------------------------------


def test_5_a_row_python_cannot_read_fails_alone_and_its_neighbours_run(start_worker):
    """A 5,000-digit integer and JSON nested 12,000 deep: PostgreSQL stores both, Python reads neither."""
    before = [record.enqueue(i) for i in range(5)]
    with connection.cursor() as cursor:
        hostile = []
        for args in ("[" + "9" * 5000 + "]", "[" * 12000 + "]" * 12000):
            cursor.execute(
                "INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt, "
                "max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids, "
                "created_at, snoozes) VALUES (%s, 'default', 0, %s::jsonb, '{}', 'queued', 0, 5, now(), "
                "'', false, '', '[]', '[]', now(), 0) RETURNING id",
                [record.name, args],
            )
            hostile.append(cursor.fetchone()[0])
    after = [record.enqueue(i) for i in range(5)]
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0
    assert [job_now(j).status for j in before + after] == ["done"] * 10
    # (Django could not read these rows' arguments either: only their status and error.)
    ended = dict(Job.objects.filter(id__in=hostile).values_list("id", "last_error"))
    statuses = set(Job.objects.filter(id__in=hostile).values_list("status", flat=True))
    assert statuses == {"failed"}
    assert ended[hostile[0]].startswith("the job's arguments cannot be read: ValueError: Exceeds the limit")
    assert ended[hostile[1]].startswith("the job's arguments cannot be read: RecursionError")
    assert BodyRun.objects.filter(job_id__in=hostile).count() == 0


# -- 9: a paused worker's body under a limit ------------------------------------------------


@many_connections(15)
def test_9_a_paused_place_holders_body_never_runs_beside_the_new_holder(start_worker, tmp_path):
    """Limit 1, lease 2 s: the worker running the body is stopped for 4 s, then resumed."""
    path = tmp_path / "journal"
    controls.set_limits("svc", concurrency=1)
    job = ticking.using(queue="svc").enqueue(str(path), 5)
    a = start_worker("--lease", "2", "--worker-id", "a", "--queue", "svc")
    wait_until(lambda: read_ticks(path), timeout=30, what="a's body calls the service")
    a.signal(signal.SIGSTOP)
    b = start_worker("--lease", "2", "--worker-id", "b", "--queue", "svc")
    wait_until(lambda: (job.id, 2) in read_ticks(path), timeout=30, what="b's body calls the service")
    time.sleep(1.5)
    a.signal(signal.SIGCONT)
    wait_until(lambda: job_now(job).status == "done", timeout=60, what="the job is done")
    ticks = read_ticks(path)
    stale = [t for t in ticks[(job.id, 1)] if t >= ticks[(job.id, 2)][0]]
    assert stale == [], f"attempt 1 called the service {len(stale)} times beside attempt 2"
    a.wait_for_log(rf"lease lost job={job.id} attempt=1 worker=a: its lease ran out")
    b.signal(signal.SIGTERM)
    assert b.wait() == 0


# -- 10: tests and workers run a body the same way ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_10_run_jobs_and_a_worker_end_the_same_bodies_the_same_way(start_worker):
    bodies = [(returns_a_coroutine, (21,)), (calls_exit, (3,))]
    in_test = [task.enqueue(*args) for task, args in bodies]
    testing.run_jobs()
    on_worker = [task.using(queue="w").enqueue(*args) for task, args in bodies]
    assert start_worker("--burst", "--queue", "w").wait(timeout=60) == 0
    seen = [(j.status, j.result, j.last_error) for j in map(job_now, in_test)]
    assert seen == [(j.status, j.result, j.last_error) for j in map(job_now, on_worker)]
    assert seen == [("done", 42, ""), ("failed", None, "SystemExit: 3")]


# -- 11: memory follows the settings --------------------------------------------------------


def test_11_a_workers_memory_follows_its_settings_not_its_jobs_arguments(start_worker):
    """200 fast jobs of 1 MiB arguments each (tiny in PostgreSQL: they compress): the worker
    holds at most LEASEJOBS['PREFETCH_BYTES'] (16 MiB) of them at once."""
    blob = "x" * (1024 * 1024 - 100)
    jobs = measures.bulk_enqueue([((blob,), {}) for _ in range(200)])
    worker = start_worker("--concurrency", "4")
    wait_until(
        lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 200,
        timeout=300,
        interval=0.5,
        what="every job done",
    )
    peak_mib = rss_peak_kib(worker.pid) / 1024
    assert peak_mib < 250, f"the worker peaked at {peak_mib:.0f} MiB"


# -- 12: the fence checks an attempt's places ---------------------------------------------


def _claim_with_a_place(queue: str) -> tuple[WorkerStore, ClaimedRow]:
    controls.set_limits(queue, concurrency=1)
    record.using(queue=queue).enqueue(1)
    store = WorkerStore("w12", heartbeat_timeout=5)
    (row,) = store.claim(limit=1, counted=1, queues=[queue], lease_seconds=30, task_leases={}, limited=True)
    assert row.slots == 1
    return store, row


def _take_the_place(row: ClaimedRow) -> None:
    """Another claim takes the attempt's place (its worker was paused past the place's end)."""
    with psycopg.connect(**connection_params(), autocommit=True) as other:
        other.execute(
            "UPDATE leasejobs_slot SET job_id = 0, attempt = 1 WHERE job_id = %s AND attempt = %s",
            [row.id, row.attempt],
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["before the block", "inside the block"])
def test_12_a_side_effect_of_an_attempt_whose_place_was_taken_commits_nothing(when):
    store, row = _claim_with_a_place("q12")
    try:
        ctx = JobContext(job_id=row.id, attempt=row.attempt, worker_id="w12", places=row.slots)
        if when == "before the block":
            _take_the_place(row)
        with pytest.raises(LeaseLost, match="no longer holds its lease"), ctx.side_effect("k12") as effect:
            assert effect.created
            Sent.objects.create(job_id=row.id, key=effect.key, attempt=row.attempt)
            _take_the_place(row)
        assert not SideEffect.objects.filter(key="k12").exists()
        assert not Sent.objects.filter(key="k12").exists()
        assert ctx.lease_lost
    finally:
        store.close()


@pytest.mark.django_db(transaction=True)
def test_12_a_side_effect_of_an_attempt_holding_its_place_commits(start_worker):
    store, row = _claim_with_a_place("q12b")
    try:
        ctx = JobContext(job_id=row.id, attempt=row.attempt, worker_id="w12", places=row.slots)
        with ctx.side_effect("k12b") as effect:
            Sent.objects.create(job_id=row.id, key=effect.key, attempt=row.attempt)
        assert SideEffect.objects.filter(key="k12b").count() == Sent.objects.filter(key="k12b").count() == 1
    finally:
        store.close()


# -- 13: a read-only database -------------------------------------------------------------


def _set_read_only(on: bool) -> None:
    """The test database answers read-only (or not) to every new session; current ones are cut."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {"on" if on else "off"}')
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def test_13_a_read_only_database_is_waited_out(start_worker):
    worker = start_worker("--lease", "2")
    first = record.enqueue("before")
    wait_until(lambda: job_now(first).status == "done", what="a first job")
    _set_read_only(True)
    try:
        time.sleep(4)  # claims, heartbeats and liveness meet a read-only server meanwhile
        assert worker.proc.poll() is None, worker.log()[-2000:]
    finally:
        _set_read_only(False)
    writable = time.monotonic()
    later = [record.enqueue(i) for i in range(50)]
    wait_until(lambda: all(job_now(j).status == "done" for j in later), timeout=30, what="50 jobs after it")
    assert time.monotonic() - writable < 15
    assert worker.count("answers read-only") >= 1


# -- also: a healthy worker's heartbeat and finish never meet on a row ----------------------


def test_a_healthy_worker_logs_no_finish_skipped(start_worker):
    jobs = record.bulk_enqueue([((i,), {}) for i in range(3000)])
    worker = start_worker("--heartbeat", "0.2", "--concurrency", "4")
    wait_until(
        lambda: (
            not Job.objects.filter(id__in=[j.id for j in jobs], status__in=["queued", "running"]).exists()
        ),
        timeout=300,
        interval=0.5,
        what="every job done",
    )
    assert worker.count("finish skipped") == 0


# -- also: async bodies get a fenced side effect --------------------------------------------


def test_an_async_body_records_its_side_effect_and_its_own_write_in_one_transaction(start_worker):
    jobs = [async_receipt.enqueue(7), async_receipt.enqueue(7)]
    assert start_worker("--burst").wait(timeout=60) == 0
    assert sorted(job_now(j).result for j in jobs) == [False, True]
    assert SideEffect.objects.filter(key="areceipt:7").count() == 1
    assert Sent.objects.filter(key="areceipt:7").count() == 1


# -- children come and go --------------------------------------------------------------------


def test_children_are_recycled_after_max_jobs_per_child(start_worker):
    jobs = [record.enqueue(i) for i in range(20)]
    worker = start_worker("--concurrency", "2", "--max-jobs-per-child", "3", "--burst")
    assert worker.wait(timeout=60) == 0
    assert all(job_now(j).status == "done" for j in jobs)
    assert worker.count(r"left worker=\S+: it ran 3 jobs \(--max-jobs-per-child\)") >= 5


def test_a_child_past_its_memory_is_replaced_after_its_body(start_worker):
    jobs = [eats_memory.enqueue(120) for _ in range(3)]
    worker = start_worker("--concurrency", "1", "--max-memory-per-child", "100", "--burst")
    assert worker.wait(timeout=60) == 0
    assert [job_now(j).result for j in jobs] == [1, 1, 1], "each body ran in a fresh child"
    assert worker.count(r"its memory reached \d+ MiB \(--max-memory-per-child 100\)") == 3


def test_a_worker_whose_zygote_is_killed_exits_and_says_why(start_worker):
    worker = start_worker()
    worker.wait_for_log("worker started")
    zygote = int(Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()[0])
    os.kill(zygote, signal.SIGKILL)
    assert worker.wait(timeout=30) == 70
    assert worker.count("zygote") >= 1
