"""The worker as a user sees it: real runworker processes, real signals.

Timings are short (leases of 1-2 s) so the suite stays fast; every wait is
bounded and every process is killed by its pid at teardown.
"""

import signal
import time

import pytest
from django.db import transaction
from django.db.models import Count

from leasejobs.models import Job, SideEffect
from tests.helpers import wait_until
from tests.testapp.models import BodyRun, Sent
from tests.testapp.tasks import (
    always_fails,
    flaky,
    naive_receipt,
    overruns,
    poison,
    receipt,
    record,
    sleeper,
    slow_first,
    until_cancelled,
)


def job_now(job: Job) -> Job:
    job.refresh_from_db()
    return job


def runs(job: Job) -> int:
    return BodyRun.objects.filter(job_id=job.id).count()


# -- order ---------------------------------------------------------------------


def test_higher_priority_runs_first_then_oldest_run_at_then_id(start_worker):
    from django.utils import timezone

    now = timezone.now()
    low = record.using(priority=-5).enqueue("low")
    old = record.using(run_at=now - timezone.timedelta(minutes=5)).enqueue("old")
    first_default = record.enqueue("default-1")
    second_default = record.enqueue("default-2")
    high = record.using(priority=10).enqueue("high")
    future = record.using(delay=3600).enqueue("future")
    worker = start_worker("--burst", "--concurrency", "1")
    assert worker.wait() == 0, worker.log()
    order = list(BodyRun.objects.order_by("id").values_list("job_id", flat=True))
    assert order == [high.id, old.id, first_default.id, second_default.id, low.id]
    assert job_now(future).status == "queued"


def test_jobs_due_before_a_busy_workers_last_claims_are_still_run(start_worker):
    """A busy worker claims on from the last job it kept of each priority
    (``sql.CLAIM_AFTER``) and looks from the front only now and then: a job due
    before those keys, a priority it has not claimed from, and an expired lease
    of a job claimed long ago are found all the same, within moments."""
    from django.utils import timezone

    worker = start_worker("--concurrency", "2", "--lease", "5")
    stream = [record.enqueue(n) for n in range(300)]
    wait_until(lambda: BodyRun.objects.count() >= 50, what="the worker is busy")
    now = timezone.now()
    late = record.using(run_at=now - timezone.timedelta(minutes=5)).enqueue("due before the keys")
    new_priority = record.using(priority=3).enqueue("a priority not claimed from yet")
    with transaction.atomic():  # committed as running: no claim sees it queued
        orphan = record.enqueue("claimed long ago by a worker that died")
        Job.objects.filter(id=orphan.id).update(
            status="running", attempt=1, runs=1, leased_by="ghost",
            run_at=now - timezone.timedelta(minutes=10), lease_until=now - timezone.timedelta(seconds=1),
        )  # fmt: skip
    for job in (late, new_priority, orphan, stream[-1]):
        wait_until(lambda job=job: job_now(job).status == "done", timeout=30, what=f"job {job.id} done")
    assert (job_now(orphan).attempt, runs(orphan)) == (2, 1), worker.log()[-2000:]


# -- the story: a job that outlives its lease -----------------------------------

#: How long a first attempt outlives its 1 s lease: long enough for a second
#: worker to start and take it over, also on a loaded machine.
FIRST_ATTEMPT_SECONDS = 10


def test_without_heartbeat_or_fencing_the_slow_job_runs_twice_and_sends_twice(start_worker):
    """The bug we exist for, reproduced: lease 1 s, first attempt 10 s, two workers.

    Ten seconds leave b time to start on a loaded machine: if a's slow body ended
    before b claimed, a would take its expired lease back itself."""
    job = naive_receipt.enqueue(7, first_attempt_seconds=FIRST_ATTEMPT_SECONDS)
    a = start_worker("--no-heartbeat", "--lease", "1", "--concurrency", "1", "--worker-id", "a", "-v", "2")
    wait_until(lambda: runs(job) == 1, what="worker a starts the job")
    b = start_worker("--no-heartbeat", "--lease", "1", "--worker-id", "b", "-v", "2")
    wait_until(lambda: job_now(job).status == "done", what="job done")
    wait_until(lambda: a.count(r"lease lost job=") == 1, what="a's stale finish dropped")
    assert runs(job) == 2
    assert Sent.objects.filter(key="receipt:7").count() == 2  # two receipts: the bug
    # The second attempt is b's, or a's own when a re-claims the expired lease
    # before its first finish is written (nothing stops that without heartbeats).
    assert a.count(rf"done job={job.id} attempt=2") + b.count(rf"done job={job.id} attempt=2") == 1


def test_fencing_and_idempotency_make_the_second_run_harmless(start_worker):
    """Same timings; the body runs twice but the receipt is sent once."""
    job = receipt.enqueue(8, first_attempt_seconds=FIRST_ATTEMPT_SECONDS)
    a = start_worker("--no-heartbeat", "--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="worker a starts the job")
    start_worker("--no-heartbeat", "--lease", "1", "--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", what="job done by b")
    a.wait_for_log(rf"stale write rejected job={job.id} attempt=1 worker=a")
    a.wait_for_log(rf"lease lost job={job.id} attempt=1 worker=a")
    job = job_now(job)
    assert runs(job) == 2
    assert list(Sent.objects.values_list("attempt", flat=True)) == [2]
    assert list(SideEffect.objects.values_list("key", "fencing_token")) == [("receipt:8", 2)]
    assert (job.attempt, job.result, job.attempt_workers) == (2, {"created": True}, ["a", "b"])


def test_a_stale_finish_never_overwrites_the_newer_attempt(start_worker):
    job = slow_first.enqueue(FIRST_ATTEMPT_SECONDS)
    a = start_worker("--no-heartbeat", "--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="a starts")
    start_worker("--no-heartbeat", "--lease", "1", "--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", what="b finishes")
    a.wait_for_log(rf"lease lost job={job.id} attempt=1 worker=a: stale done dropped")
    assert job_now(job).result == 2  # attempt 2's result, not attempt 1's


def test_heartbeats_keep_the_lease_so_the_slow_job_runs_once(start_worker):
    job = receipt.enqueue(9, first_attempt_seconds=5)
    start_worker("--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="a starts")
    start_worker("--lease", "1", "--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", timeout=15, what="job done")
    assert runs(job) == 1 and Sent.objects.count() == 1
    assert (job_now(job).attempt, job_now(job).attempt_workers) == (1, ["a"])
    assert job_now(job).heartbeat_at > job_now(job).started_at


# -- processes that die or stop -----------------------------------------------


def test_a_job_of_a_killed_worker_is_taken_over_after_its_lease(start_worker):
    job = slow_first.enqueue(30)
    a = start_worker("--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="a starts")
    a.signal(signal.SIGKILL)
    a.wait()
    assert job_now(job).status == "running"
    start_worker("--lease", "1", "--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", what="b takes over")
    assert (job_now(job).attempt, job_now(job).result, job_now(job).attempt_workers) == (2, 2, ["a", "b"])


def test_a_paused_worker_is_fenced_off_and_lives_on(start_worker):
    """SIGSTOP past the lease (a GC pause, a frozen VM), then SIGCONT.

    The paused worker cannot stop its body, so its zygote does, at the
    lease's end: the stale body never runs beside the attempt that takes the
    job over. Back, the worker reports the lease lost and goes on.
    """
    job = receipt.enqueue(10, first_attempt_seconds=2.5)
    a = start_worker("--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="a starts")
    a.signal(signal.SIGSTOP)
    b = start_worker("--lease", "1", "--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", what="b takes over while a is paused")
    b.signal(signal.SIGTERM)
    assert b.wait() == 0
    a.signal(signal.SIGCONT)
    # Every thread wakes at once: the zygote's report of the kill ("its lease ran out ...")
    # or the heartbeat that finds the job done by b may say it first; either is the report.
    a.wait_for_log(rf"lease lost job={job.id} attempt=1 worker=a: (its lease ran out|heartbeat found)")
    assert list(Sent.objects.values_list("attempt", flat=True)) == [2]
    assert job_now(job).result == {"created": True} and job_now(job).attempt == 2
    # The paused process carries on and takes new work.
    later = record.enqueue("after the pause")
    wait_until(lambda: job_now(later).status == "done", what="a runs a new job")
    assert job_now(later).attempt_workers == ["a"]


def test_a_job_that_kills_its_process_fails_after_max_attempts_and_the_worker_lives(start_worker):
    """The body SIGKILLs the process it runs in: its child, never the worker."""
    job = poison.enqueue()  # max_attempts=2
    worker = start_worker("--lease", "1")
    wait_until(lambda: job_now(job).status == "failed", what="poison job failed")
    job = job_now(job)
    assert (job.attempt, job.runs, runs(job)) == (2, 2, 2)
    assert job.last_error == (
        "leasejobs.exceptions.ProcessDied: "
        "the job's process was killed by signal 9 (SIGKILL) while its body ran"
    )
    assert [e["exception_class"] for e in job.errors] == ["leasejobs.exceptions.ProcessDied"] * 2
    later = record.enqueue("the worker goes on")
    wait_until(lambda: job_now(later).status == "done", what="the worker runs a new job")
    assert worker.proc.poll() is None


# -- failures --------------------------------------------------------------------


def test_a_failing_job_is_retried_with_backoff_until_it_succeeds(start_worker):
    job = flaky.enqueue(2)
    start_worker()
    wait_until(lambda: job_now(job).status == "done", what="third attempt succeeds")
    job = job_now(job)
    assert (job.attempt, job.result) == (3, 3)
    assert job.last_error == "ValueError: failure 2 of 2"
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert job.errors[0]["exception_class"] == "builtins.ValueError"
    assert "Traceback" in job.errors[0]["traceback"]
    starts = list(BodyRun.objects.filter(job_id=job.id).order_by("id").values_list("created_at", flat=True))
    # Backoff (test settings: base 0.2 s, jittered into its upper half) separates the attempts.
    assert (starts[1] - starts[0]).total_seconds() >= 0.1
    assert (starts[2] - starts[1]).total_seconds() >= 0.2


def test_a_job_that_always_fails_ends_failed_with_its_error(start_worker):
    job = always_fails.enqueue()  # max_attempts=2
    worker = start_worker()
    wait_until(lambda: job_now(job).status == "failed", what="final failure")
    job = job_now(job)
    assert (job.attempt, job.last_error, runs(job)) == (2, "ValueError: always fails", 2)
    worker.wait_for_log(rf"failed job={job.id} attempt=2 worker=\S+: ValueError: always fails")


def test_an_unknown_task_fails_without_importing_anything(start_worker):
    unknown = Job.objects.create(task_name="os.system", args=["touch /tmp/pwned"], run_at="2020-01-01T00:00Z")
    worker = start_worker("--burst")
    ok = record.enqueue("still works")
    assert worker.wait() == 0
    unknown.refresh_from_db()
    assert (unknown.status, unknown.last_error) == ("failed", "unknown task 'os.system'")
    assert job_now(ok).status == "done"


def test_a_malformed_row_fails_and_the_worker_lives(start_worker):
    bad = Job.objects.create(task_name=record.name, args={"not": "a list"}, run_at="2020-01-01T00:00Z")
    worker = start_worker("--burst")
    assert worker.wait() == 0
    assert job_now(bad).status == "failed" and "malformed" in job_now(bad).last_error


def test_a_job_past_its_timeout_is_stopped_and_retried(start_worker):
    """timeout_seconds=1; attempt 1 would sleep 2.5 s, then make its side effect: it is stopped first."""
    job = overruns.enqueue(2.5)
    worker = start_worker("--lease", "5")
    wait_until(lambda: job_now(job).status == "done", what="attempt 2 after the timeout")
    worker.wait_for_log(
        rf"body stopped job={job.id} attempt=1 worker=\S+ \(after 1\.\ds\): it ran past its timeout of 1 s"
    )
    job = job_now(job)
    assert (job.attempt, job.result) == (2, 2)
    assert "TimeoutError" in job.errors[0]["exception_class"]
    assert list(Sent.objects.values_list("attempt", flat=True)) == [2]


# -- stopping --------------------------------------------------------------------


def test_sigterm_lets_a_running_job_finish_within_the_grace(start_worker):
    job = sleeper.enqueue(1.0)
    worker = start_worker("--grace", "10")
    wait_until(lambda: runs(job) == 1, what="job starts")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert job_now(job).status == "done"


def test_sigterm_past_the_grace_gives_the_lease_back(start_worker):
    job = slow_first.enqueue(30)
    worker = start_worker("--grace", "0.5", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="job starts")
    stopped_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - stopped_at < 5
    job = job_now(job)
    assert (job.status, job.lease_until, job.attempt) == ("queued", None, 1)
    worker.wait_for_log(rf"released job={job.id} attempt=1 worker=a")
    # Claimable at once, by the next worker, under a new token.
    start_worker("--worker-id", "b")
    wait_until(lambda: job_now(job).status == "done", what="b runs the released job")
    assert (job_now(job).attempt, job_now(job).result) == (2, 2)


# -- many workers ----------------------------------------------------------------


# Alone: under the parallel phase's load, the third worker's start (Python and
# Django on a busy machine) could come after the other two had claimed all.
@pytest.mark.alone
def test_no_job_is_claimed_twice_by_three_workers_of_four_threads(start_worker):
    jobs = record.bulk_enqueue([((i,), {}) for i in range(2000)])
    workers = [start_worker("--burst", "--concurrency", "4", "-v", "2") for _ in range(3)]
    for w in workers:
        assert w.wait(timeout=120) == 0, w.log()[-2000:]
    assert Job.objects.filter(status="done", attempt=1).count() == len(jobs)
    assert BodyRun.objects.count() == len(jobs)
    assert not BodyRun.objects.values("job_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert all(w.count(r"claimed job=") > 0 for w in workers)  # all three took part


def test_jobs_enqueued_one_by_one_to_an_idle_worker_each_run_once(start_worker):
    """A NOTIFY that finds the claim loop waiting is claimed for in the listener's thread, on
    the listen connection, while the claim loop claims too (on a child's report, at the poll):
    the two never claim at once, so no job runs twice and none is left behind."""
    from django.db import connection

    worker = start_worker("--concurrency", "2", "--worker-id", "one-by-one")

    def listening() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT query FROM pg_stat_activity WHERE application_name = %s",
                ["leasejobs listen one-by-one"],
            )
            return [row[0] for row in cursor.fetchall()]

    wait_until(
        lambda: any(q.startswith("LISTEN") for q in listening()), timeout=20, what="the worker listens"
    )
    jobs = []
    for i in range(300):
        jobs.append(record.enqueue(i))
        if i % 3 == 0:
            time.sleep(0.005)  # now and then an idle worker, now and then a busy one
    ids = [job.id for job in jobs]
    wait_until(
        lambda: Job.objects.filter(id__in=ids, status="done").count() == len(ids),
        timeout=60,
        what="every job done",
    )
    assert BodyRun.objects.filter(job_id__in=ids).count() == len(ids), worker.log()[-2000:]
    assert not BodyRun.objects.values("job_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    # The listen connection's last statement was a claim, not its LISTEN.
    assert [q.lstrip()[:4] for q in listening()] == ["WITH"], listening()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency: '0' is not a whole number greater than 0"),
        (["--lease", "soon"], "--lease: 'soon' is not a lease of at least 1 second"),
        (["--heartbeat", "40", "--lease", "30"], "must be shorter than the lease"),
        (["--heartbeat", "1", "--no-heartbeat"], "contradict"),
        (["--grace", "-1"], "--grace: '-1' is not a number of seconds, 0 or more and a day at most"),
        (["--queue", ""], "--queue must be a name"),
        (["--nonsense"], "unrecognized arguments"),
    ],
)
def test_a_bad_option_exits_non_zero_with_one_clear_message(start_worker, args, message):
    worker = start_worker(*args)
    assert worker.wait(timeout=20) != 0
    assert message in worker.log()
    assert "Traceback" not in worker.log()


def test_an_unreachable_database_exits_non_zero_with_one_clear_message(start_worker):
    worker = start_worker(env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"})
    assert worker.wait(timeout=20) == 1
    log = worker.log()
    assert "Cannot reach the database at 127.0.0.1:1/nowhere" in log
    assert "Traceback" not in log


def test_max_jobs_stops_the_worker_after_n_claims(start_worker):
    jobs = record.bulk_enqueue([((i,), {}) for i in range(5)])
    worker = start_worker("--max-jobs", "3", "--concurrency", "1")
    assert worker.wait(timeout=20) == 0
    assert Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 3
    assert Job.objects.filter(status="queued").count() == 2


def test_a_cancel_request_reaches_the_running_body_through_the_heartbeat(start_worker):
    job = until_cancelled.enqueue(30)
    worker = start_worker("--lease", "1")
    wait_until(lambda: runs(job) == 1, what="job starts")
    Job.objects.filter(id=job.id, status="running").update(cancel_requested=True)
    wait_until(lambda: job_now(job).status == "cancelled", what="body sees the cancel and stops")
    assert job_now(job).result == "stopped"
    worker.wait_for_log(rf"cancel requested job={job.id} attempt=1")


def test_a_table_lock_delays_the_worker_but_does_not_wedge_it(start_worker):
    """A migration's ALTER TABLE holds the whole table: claims give up and come back."""
    import threading

    import psycopg

    from leasejobs.db.connection import connection_params

    worker = start_worker("--lease", "2", "--grace", "1")
    worker.wait_for_log("worker started")
    first = record.enqueue("before the lock")
    wait_until(lambda: job_now(first).status == "done", what="worker runs a job")
    locker = psycopg.connect(**connection_params())
    try:
        locker.execute("LOCK TABLE leasejobs_job IN ACCESS EXCLUSIVE MODE")
        threading.Timer(7.0, locker.rollback).start()
        worker.wait_for_log(r"claim failed worker=\S+: LockNotAvailable", timeout=15)
    finally:
        wait_until(lambda: locker.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, timeout=15)
        locker.close()
    later = record.enqueue("after the lock")
    wait_until(lambda: job_now(later).status == "done", what="worker runs jobs again")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
