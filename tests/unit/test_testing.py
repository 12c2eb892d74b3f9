"""leasejobs.testing in a pytest-django ``db`` test, through the job_queue fixture.

Every job here is claimed, run and finished in the test's own transaction
with the worker's own statements; nothing is committed.
"""

import datetime as dt

import pytest
from django.test import override_settings

from leasejobs import RetryPolicy
from leasejobs.models import Job, SideEffect
from tests.testapp.models import Sent
from tests.testapp.tasks import (
    add,
    breaks_its_transaction,
    fails_after_a_cancel,
    flaky,
    hopeless,
    kinds,
    picky,
    receipt,
    record,
    snoozy,
    spawner,
)


def test_enqueued_jobs_filter_by_task_and_queue(job_queue):
    first = add.enqueue(1, 2)
    later = add.using(queue="slow", delay=60).enqueue(3, 4)
    other = record.enqueue(5)
    assert job_queue.enqueued_jobs() == [first, later, other]
    assert job_queue.enqueued_jobs(add) == [first, later]
    assert job_queue.enqueued_jobs("tests.testapp.tasks.add", queue="slow") == [later]


def test_assert_enqueued_compares_arguments_as_json(job_queue):
    job = add.enqueue(1, [2, 3])
    assert job_queue.assert_enqueued(add, args=(1, [2, 3])) == job  # the outer tuple: the args list
    assert job_queue.assert_enqueued(add) == job
    with pytest.raises(
        AssertionError, match=r"no queued job tests.testapp.tasks.add args=\[1, 2\]; queued: "
    ):
        job_queue.assert_enqueued(add, args=[1, 2])
    with pytest.raises(AssertionError, match=r"1 queued job\(s\) tests.testapp.tasks.add"):
        job_queue.assert_not_enqueued(add, args=[1, [2, 3]])
    job_queue.assert_not_enqueued(record)
    job_queue.assert_not_enqueued(add, kwargs={"x": 1})


def test_run_jobs_passes_arguments_through_json_like_a_worker(job_queue):
    kinds.enqueue([1, 2], dt.date(2026, 1, 1).isoformat(), n=1.0, m={"1": 1})
    [ran] = job_queue.run_jobs()
    assert (ran.outcome, ran.result) == ("done", ["list", "str", "m:dict", "n:float"])


def test_run_jobs_writes_outcomes_through_the_real_finish(job_queue, settings):
    # A backoff no test run outlasts (the test settings' 0.2 s passes on a loaded machine).
    settings.LEASEJOBS = {**settings.LEASEJOBS, "RETRY_BACKOFF_SECONDS": 30, "RETRY_BACKOFF_MAX_SECONDS": 60}
    done = add.enqueue(2, 3)
    failing = flaky.enqueue(5)
    ran = {r.id: r for r in job_queue.run_jobs()}
    assert (ran[done.id].outcome, ran[done.id].result) == ("done", 5)
    assert (ran[failing.id].outcome, ran[failing.id].error) == ("retry", "ValueError: failure 1 of 5")
    assert isinstance(ran[failing.id].exception, ValueError)
    done.refresh_from_db()
    failing.refresh_from_db()
    assert (done.status, done.attempt, done.result, done.leased_by) == ("done", 1, 5, "leasejobs.testing")
    assert (failing.status, failing.attempt, len(failing.errors)) == ("queued", 1, 1)
    assert job_queue.run_jobs() == []  # the retry waits for its backoff


def test_a_retry_written_as_a_cancel_is_reported_as_cancelled(job_queue):
    """As the worker reports it: what the finish wrote, not what the body asked for."""
    job = fails_after_a_cancel.enqueue()
    (ran,) = job_queue.run_jobs()
    job.refresh_from_db()
    assert (ran.outcome, job.status) == ("cancelled", "cancelled")


def test_run_job_runs_one_job_by_id_even_before_it_is_due(job_queue):
    failing = flaky.enqueue(1)
    add.enqueue(1, 1)
    assert job_queue.run_job(failing.id).outcome == "retry"
    again = job_queue.run_job(failing.id)  # its backoff has not passed: run_job runs it anyway
    assert (again.attempt, again.outcome, again.result) == (2, "done", 2)
    assert [j.task_name for j in job_queue.enqueued_jobs()] == [add.name]  # the other job did not run
    with pytest.raises(ValueError, match=f"job {failing.id} cannot run: it is done, not queued"):
        job_queue.run_job(failing.id)


def test_until_empty_runs_what_the_bodies_enqueue(job_queue):
    spawner.enqueue(1)
    assert [r.task_name for r in job_queue.run_jobs(queue="spawn", until_empty=False)] == [spawner.name]
    job_queue.assert_enqueued(record, args=[2], queue="spawn")
    spawner.enqueue(10)
    assert [r.result for r in job_queue.run_jobs(queue=["spawn"])] == [2, 10, 11]


def test_side_effects_are_fenced_inside_the_test_transaction(job_queue):
    job = receipt.enqueue(42)
    [ran] = job_queue.run_jobs()
    assert (ran.outcome, ran.result) == ("done", {"created": True})
    assert list(SideEffect.objects.values_list("key", "fencing_token")) == [("receipt:42", 1)]
    assert Sent.objects.get().job_id == job.id


def test_retry_policies_snooze_and_discard_run_as_in_a_worker(job_queue):
    failed_at_once = picky.enqueue("KeyError")
    overridden = picky.using(retry=RetryPolicy(fail_on=(ValueError,))).enqueue("ValueError")
    snoozed = snoozy.enqueue(1, seconds=0)
    discarded = hopeless.enqueue("no such order")
    ran = {r.id: r for r in job_queue.run_jobs(until_empty=False)}
    assert ran[failed_at_once.id].outcome == "failed"
    assert ran[overridden.id].outcome == "failed"
    assert (ran[snoozed.id].outcome, ran[discarded.id].outcome) == ("snoozed", "failed")
    assert ran[discarded.id].error == "discarded: no such order"
    snoozed.refresh_from_db()
    assert (snoozed.status, snoozed.snoozes, snoozed.errors) == ("queued", 1, [])
    assert (
        job_queue.run_job(snoozed.id).result == 2
    )  # max_attempts=2, yet claim 2 runs: a snooze is no attempt


@override_settings(LEASEJOBS={"MAX_SNOOZES": 2})
def test_snoozing_past_max_snoozes_fails_the_job(job_queue):
    job = snoozy.enqueue(10, seconds=0)  # due again at once: run_jobs runs it until it ends
    assert [r.outcome for r in job_queue.run_jobs()] == ["snoozed", "snoozed", "failed"]
    job.refresh_from_db()
    assert (job.status, job.snoozes, job.attempt) == ("failed", 2, 3)
    assert job.last_error == "snoozed 2 times already, the most LEASEJOBS['MAX_SNOOZES'] allows"


def test_a_body_that_breaks_its_transaction_fails_and_the_test_goes_on(job_queue):
    job = breaks_its_transaction.enqueue()
    [ran] = job_queue.run_jobs()
    assert ran.outcome == "retry" and "division by zero" in ran.error
    assert Job.objects.get(pk=job.pk).attempt == 1  # the connection is still usable


def test_a_queue_that_never_empties_is_an_error_not_a_hang(job_queue):
    for n in range(3):
        spawner.enqueue(n)  # each spawns a record job
    with pytest.raises(RuntimeError, match="run_jobs ran 4 jobs and the queue is still not empty"):
        job_queue.run_jobs(max_jobs=4)
