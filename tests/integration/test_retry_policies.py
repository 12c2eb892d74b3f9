"""Retry policies, Snooze and Discard in real runworker processes.

The races: a body that outlived its lease raises Snooze or Discard while
another worker holds the job under a newer token; the stale outcome must
change nothing, like every other stale finish.
"""

from leasejobs import RetryPolicy
from leasejobs.models import Job
from tests.helpers import wait_until
from tests.integration.test_worker import job_now, runs
from tests.testapp.tasks import hopeless, picky, snoozy, stale_discard, stale_snooze


def test_a_task_policy_fails_at_once_on_fail_on_and_retries_the_rest(start_worker):
    at_once = picky.enqueue("KeyError")
    retried = picky.enqueue("ValueError")
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: job_now(at_once).status == "failed" and job_now(retried).status == "failed", 30)
    assert (at_once.attempt, runs(at_once), at_once.last_error) == (1, 1, "KeyError: 'picky'")
    assert (retried.attempt, runs(retried)) == (4, 4)  # max_attempts=4, fixed 0.05 s backoff
    assert worker.count(rf"retry job={retried.id} attempt=\d worker=\S+ in 0\.1s") == 3, worker.log()


def test_using_overrides_the_task_policy_for_the_jobs_it_enqueues(start_worker):
    no_retry = picky.using(retry=RetryPolicy(fail_on=(ValueError,))).enqueue("ValueError")
    assert job_now(no_retry).retry_policy["fail_on"] == ["builtins.ValueError"]
    start_worker()
    wait_until(lambda: job_now(no_retry).status == "failed", 30)
    assert (no_retry.attempt, runs(no_retry)) == (1, 1)


def test_snoozes_do_not_count_toward_max_attempts_nor_as_errors(start_worker):
    job = snoozy.enqueue(3)  # max_attempts=2: three snoozes, then done on claim 4
    worker = start_worker()
    wait_until(lambda: job_now(job).status == "done", 30)
    assert (job.result, job.attempt, job.snoozes, job.max_attempts) == (4, 4, 3, 2)
    assert (job.errors, job.last_error) == ([], "")
    assert worker.count(rf"snoozed job={job.id} attempt=\d worker=\S+ for 0\.1s") == 3, worker.log()


def test_discard_fails_now_with_its_reason_and_no_retry(start_worker):
    job = hopeless.enqueue("the order was deleted")
    worker = start_worker()
    wait_until(lambda: job_now(job).status == "failed", 30)
    assert (job.attempt, runs(job), job.last_error) == (1, 1, "discarded: the order was deleted")
    assert job.errors[0]["exception_class"] == "leasejobs.exceptions.Discard"
    worker.wait_for_log(rf"failed job={job.id} attempt=1 worker=\S+: discarded: the order was deleted")


def _race(start_worker, job: Job, stale: str) -> None:
    """Worker a's attempt 1 outlives its lease; b takes over; a's body then raises while b runs."""
    a = start_worker("--no-heartbeat", "--lease", "1", "--concurrency", "1", "--worker-id", "a")
    wait_until(lambda: runs(job) == 1, what="a starts attempt 1")
    b = start_worker("--no-heartbeat", "--lease", "30", "--worker-id", "b", "-v", "2")
    wait_until(lambda: runs(job) == 2, what="b takes the job over as attempt 2")
    a.wait_for_log(rf"lease lost job={job.id} attempt=1 worker=a: stale {stale} dropped", timeout=30)
    held = job_now(job)  # a's outcome came while b still ran attempt 2: nothing moved
    assert (held.status, held.attempt, held.leased_by, held.snoozes, held.errors) == (
        "running",
        2,
        "b",
        0,
        [],
    )
    wait_until(lambda: job_now(job).status == "done", 30, what="b finishes attempt 2")
    assert (job.result, job.attempt, job.snoozes, job.errors, job.last_error) == (2, 2, 0, [], "")
    b.wait_for_log(rf"done job={job.id} attempt=2 worker=b")


def test_a_stale_snooze_racing_a_lease_takeover_changes_nothing(start_worker):
    _race(start_worker, stale_snooze.enqueue(later_attempt_seconds=6), "queued")


def test_a_stale_discard_racing_a_lease_takeover_changes_nothing(start_worker):
    _race(start_worker, stale_discard.enqueue(later_attempt_seconds=6), "failed")
