"""Durable steps, sleeps, waits and events (issue 31): the rules, on a real database.

Each test claims with the worker's own statements (``WorkerStore``) and runs
``JobContext`` methods as a body would, or runs bodies through
``leasejobs.testing`` (the worker's claim, body and finish on Django's
connection). The same rules under real ``runworker`` processes, killed and
paused with signals: ``test_durable_steps_workers.py``.
"""

import logging
import re

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import leasejobs
from leasejobs import testing
from leasejobs.db.connection import connection_params
from leasejobs.db.store import ClaimedRow, WorkerStore
from leasejobs.exceptions import LeaseLost, Suspended
from leasejobs.jobs.context import JobContext
from leasejobs.models import Event, Job, Step
from leasejobs.operations.prune import prune
from leasejobs.queues import controls
from tests.adminpages import page
from tests.testapp.models import BodyRun, Sent
from tests.testapp.step_tasks import async_steps, failing_step, sleeper, ten_steps, three_steps, waiter
from tests.unit.test_admin_job_page import text_of, url

pytestmark = pytest.mark.django_db(transaction=True)


def _claim(store: WorkerStore, queue: str = "default") -> ClaimedRow:
    (row,) = store.claim(limit=1, counted=1, queues=[queue], lease_seconds=30, task_leases={})
    return row


def _take_over(row: ClaimedRow, worker: str = "other") -> JobContext:
    """Another claim takes the job (its holder was paused past its lease): the token moves on."""
    with psycopg.connect(**connection_params(), autocommit=True) as other:
        other.execute(
            "UPDATE leasejobs_job SET attempt = attempt + 1, leased_by = %s WHERE id = %s", [worker, row.id]
        )
    return JobContext(job_id=row.id, attempt=row.attempt + 1, worker_id=worker)


@pytest.fixture
def claimed():
    store = WorkerStore("w31", heartbeat_timeout=5)
    three_steps.enqueue()
    row = _claim(store)
    yield row, JobContext(job_id=row.id, attempt=row.attempt, worker_id="w31")
    store.close()


class _Slot:
    """A body's shared slot as a step sees it: no flags, and ``left`` seconds of lease surely held."""

    def __init__(self, left):
        self.left = left

    def flags(self):
        return 0

    def block_started(self, places):
        pass

    def block_ended(self, renewed_until):
        pass

    def lease_left(self):
        return self.left


@pytest.mark.parametrize(("left", "renews"), [(25.0, False), (14.0, True), (None, True)])
def test_a_step_renews_the_lease_as_it_commits_only_when_less_than_half_is_left(claimed, left, renews):
    """A renewal is a row version of the job: a step with most of its 30 s lease left
    leaves it to the heartbeat; one near the lease's end, or whose worker cannot say, renews."""
    row, ctx = claimed
    ctx.slot = _Slot(left)
    before = Job.objects.get(id=row.id).lease_until
    assert ctx.step("first", int, 1) == 1
    after = Job.objects.get(id=row.id).lease_until
    assert (after > before) is renews, (before, after)


class Calls:
    """A step function that counts its calls and writes a ``Sent`` row each time."""

    def __init__(self, ctx, value=None):
        self.ctx = ctx
        self.calls = 0
        self.value = value

    def __call__(self, name="s"):
        self.calls += 1
        Sent.objects.create(job_id=self.ctx.job_id, key=f"step:{name}", attempt=self.ctx.attempt)
        return self.value


def test_a_step_runs_once_and_a_later_attempt_gets_its_stored_result(claimed):
    row, first = claimed
    fn = Calls(first, value=(1, "x"))
    assert first.step("s", fn) == [1, "x"]  # as JSON reads it back, on every attempt alike
    assert list(Step.objects.values_list("name", "kind", "attempt", "result")) == [("s", "step", 1, [1, "x"])]
    second = _take_over(row)
    assert second.step("s", fn) == [1, "x"]
    assert fn.calls == 1
    assert Sent.objects.filter(key="step:s").count() == 1  # its write committed with the checkpoint, once


def test_a_stale_attempt_writes_no_step_and_its_function_never_runs(claimed, caplog):
    row, first = claimed
    _take_over(row)
    fn = Calls(first)
    with caplog.at_level(logging.WARNING), pytest.raises(LeaseLost, match="step 's' was not recorded"):
        first.step("s", fn)
    assert fn.calls == 0
    assert not Step.objects.exists()
    assert f"stale write rejected job={row.id} attempt=1 worker=w31 step='s'" in caplog.text
    assert first.lease_lost


def test_a_step_whose_attempt_loses_its_place_inside_commits_nothing_of_its_function():
    """The function's ORM write and the checkpoint commit together or not at all."""
    controls.set_limits("q31", concurrency=1)
    three_steps.using(queue="q31").enqueue()
    store = WorkerStore("w31", heartbeat_timeout=5)
    try:
        (row,) = store.claim(
            limit=1, counted=1, queues=["q31"], lease_seconds=30, task_leases={}, limited=True
        )
        ctx = JobContext(job_id=row.id, attempt=row.attempt, worker_id="w31", places=row.slots)

        def write_then_lose_the_place():
            Sent.objects.create(job_id=row.id, key="step:lost", attempt=row.attempt)
            with psycopg.connect(**connection_params(), autocommit=True) as other:
                other.execute("UPDATE leasejobs_slot SET job_id = 0 WHERE job_id = %s", [row.id])
            return 1

        with pytest.raises(LeaseLost):
            ctx.step("lost", write_then_lose_the_place)
        assert not Step.objects.exists()
        assert not Sent.objects.filter(key="step:lost").exists()
    finally:
        store.close()


def test_a_step_that_raises_stores_nothing_and_the_retry_policy_applies():
    job = failing_step.enqueue(fail_times=1)
    ran = testing.run_job(job.id)
    assert ran.outcome == "retry" and "step failure 1" in ran.error
    assert not Step.objects.exists() and not Sent.objects.exists()  # its write rolled back with it
    assert testing.run_job(job.id).result == 2
    assert Sent.objects.filter(key="step:flaky").count() == 1
    assert list(Step.objects.values_list("attempt", "result")) == [(2, 2)]


def test_a_name_used_twice_a_result_not_json_and_a_nested_step_are_refused(claimed):
    _, ctx = claimed
    ctx.step("once", Calls(ctx, 1))
    with pytest.raises(ValueError, match="the step name 'once' is used twice in one attempt"):
        ctx.step("once", Calls(ctx, 1))
    with pytest.raises(ValueError, match="is used twice"):
        ctx.sleep("once", 1)
    with pytest.raises(TypeError, match="the result of step 'obj' must be JSON"):
        ctx.step("obj", Calls(ctx, object()))
    assert Sent.objects.count() == 1  # the refused step's write rolled back
    with pytest.raises(RuntimeError, match="inside the function of step 'outer'"):
        ctx.step("outer", lambda: ctx.step("inner", int))
    with pytest.raises(RuntimeError, match=r"side_effect\('k'\) was called inside the function of step 'se'"):
        ctx.step("se", lambda: ctx.side_effect("k").__enter__())
    with pytest.raises(RuntimeError, match="only known while a step's function runs"):
        _ = ctx.step_key
    assert list(Step.objects.values_list("name", flat=True)) == ["once"]


@pytest.mark.parametrize("name", ["nul\x00name", "lone\ud800surrogate"])
def test_a_step_name_postgresql_cannot_store_is_refused_before_its_function_runs(claimed, name):
    """Its function's side effect (an e-mail, a charge) must not happen for a step that
    could never be recorded: the name is refused first, and no later attempt runs it again."""
    _, ctx = claimed
    fn = Calls(ctx, 1)
    with pytest.raises(ValueError, match=r"^the name of a step must not contain a NUL character or a lone"):
        ctx.step(name, fn)
    assert fn.calls == 0
    assert not Step.objects.exists() and not Sent.objects.exists()
    assert ctx.step("fine", fn) == 1  # the attempt goes on


def test_the_step_key_is_the_same_in_every_attempt(claimed):
    row, first = claimed

    def fails():
        raise ValueError(first.step_key)

    with pytest.raises(ValueError, match=rf"^leasejobs:{row.id}:k$"):
        first.step("k", fails)
    second = _take_over(row)
    assert second.step("k", lambda: second.step_key) == f"leasejobs:{row.id}:k"


def test_passing_ten_stored_steps_costs_one_query(claimed):
    row, first = claimed
    for n in range(10):
        first.step(f"s{n}", int, n)
    second = _take_over(row)
    with CaptureQueriesContext(connection) as queries:
        assert [second.step(f"s{n}", int, n) for n in range(10)] == list(range(10))
    assert len(queries) == 1


def test_a_job_of_ten_steps_runs_them_in_one_attempt():
    job = ten_steps.enqueue()
    assert testing.run_job(job.id).result == 45
    assert Step.objects.filter(job_id=job.id, attempt=1).count() == 10


# -- sleeps ------------------------------------------------------------------------------


def test_a_sleep_ends_the_attempt_without_using_one_and_resumes_past_the_steps():
    job = sleeper.enqueue(times=3, seconds=0)  # max_attempts=1
    outcomes = [testing.run_job(job.id).outcome for _ in range(4)]
    assert outcomes == ["suspended", "suspended", "suspended", "done"]
    job.refresh_from_db()
    assert (job.status, job.result, job.runs, job.attempt, job.snoozes) == ("done", 4, 1, 4, 0)
    assert BodyRun.objects.filter(job_id=job.id).count() == 4
    for n in range(3):  # each step ran once, in the attempt before its sleep
        assert Sent.objects.filter(key=f"step:before-{n}").count() == 1
    assert list(Step.objects.filter(kind="sleep").order_by("name").values_list("name", "attempt")) == [
        ("sleep-0", 1),
        ("sleep-1", 2),
        ("sleep-2", 3),
    ]


def test_a_sleeping_job_is_due_when_its_sleep_ends():
    job = sleeper.enqueue(times=1, seconds=3600)
    assert testing.run_job(job.id).outcome == "suspended"
    job.refresh_from_db()
    (wake_at,) = Step.objects.filter(job_id=job.id, kind="sleep").values_list("wake_at", flat=True)
    assert job.status == "queued" and job.run_at == wake_at
    assert 3590 < (wake_at - job.created_at).total_seconds() < 3700
    assert testing.run_jobs() == []  # not due


def test_a_suspend_is_not_caught_by_except_exception():
    assert not issubclass(Suspended, Exception)


# -- events ------------------------------------------------------------------------------


def test_an_event_sent_before_the_wait_is_delivered_when_it_waits():
    assert leasejobs.send_event("order:1:packed", {"box": 3}) is True
    assert leasejobs.send_event("order:1:packed", {"box": 4}) is False  # a key is one fact
    job = waiter.enqueue("order:1:packed")
    assert testing.run_job(job.id).result == {"payload": {"box": 3}}
    (event_id,) = Event.objects.values_list("id", flat=True)
    assert list(Step.objects.filter(kind="wait").values_list("done", "event_id", "result")) == [
        (True, event_id, {"box": 3})
    ]


def test_an_event_sent_after_the_wait_makes_the_waiting_job_due():
    job = waiter.enqueue("order:2:packed")
    other = waiter.enqueue("order:2:packed")  # every waiter of a key sees its event
    assert [r.outcome for r in testing.run_jobs()] == ["suspended", "suspended"]
    assert testing.run_jobs() == []  # waiting: not due
    job.refresh_from_db()
    assert job.run_at.year == 9999
    leasejobs.send_event("order:2:packed", None)
    ran = {r.id: r.result for r in testing.run_jobs()}
    assert ran == {job.id: {"payload": None}, other.id: {"payload": None}}


def test_a_rolled_back_send_delivers_nothing():
    job = waiter.enqueue("order:3:packed")
    assert testing.run_job(job.id).outcome == "suspended"
    with pytest.raises(RuntimeError), transaction.atomic():
        leasejobs.send_event("order:3:packed", {"box": 1})
        raise RuntimeError("the sender's transaction fails")
    assert not Event.objects.exists()
    job.refresh_from_db()
    assert job.run_at.year == 9999
    assert testing.run_jobs() == []


def test_a_wait_past_its_timeout_raises_and_stays_timed_out():
    job = waiter.enqueue("order:4:packed", timeout=0)
    assert testing.run_job(job.id).outcome == "suspended"
    leasejobs.send_event("order:4:packed", 1)  # too late: the deadline passed before
    ran = testing.run_job(job.id)
    assert ran.result in (
        {"payload": 1},  # the event came before the resumed attempt looked: delivered
        {"timeout": "wait 'wait' for event 'order:4:packed' timed out before the event was sent."},
    )


def test_a_timed_out_wait_is_recorded_and_raises_again_in_a_later_attempt(claimed):
    row, first = claimed
    with pytest.raises(Suspended):
        first.wait_for("w", "never-sent", timeout=0)
    second = _take_over(row)
    with pytest.raises(leasejobs.WaitTimeout, match="timed out before the event was sent"):
        second.wait_for("w", "never-sent", timeout=0)
    leasejobs.send_event("never-sent", 1)
    third = _take_over(row, "third")
    with pytest.raises(leasejobs.WaitTimeout):
        third.wait_for("w", "never-sent", timeout=0)
    with pytest.raises(ValueError, match="waits for event 'never-sent', not 'other'"):
        _take_over(row, "fourth").wait_for("w", "other")


def test_a_stale_attempt_records_no_wait_and_no_event(claimed):
    row, first = claimed
    leasejobs.send_event("k-stale", 1)
    _take_over(row)
    with pytest.raises(LeaseLost, match="wait 'w' was not recorded"):
        first.wait_for("w", "k-stale")
    with pytest.raises(LeaseLost, match="sleep 'z' was not recorded"):
        first.sleep("z", 1)
    assert not Step.objects.exists()


def test_send_event_refuses_a_payload_that_is_not_json():
    with pytest.raises(TypeError, match="the payload of event 'k' must be JSON"):
        leasejobs.send_event("k", object())
    with pytest.raises(ValueError, match="an event key must be a non-empty string"):
        leasejobs.send_event("", 1)


def test_prune_deletes_old_events_and_the_steps_of_pruned_jobs():
    job = ten_steps.enqueue()
    testing.run_job(job.id)
    leasejobs.send_event("old", 1)
    done = prune(0)
    assert (done.jobs, done.events) == (1, 1)
    assert not Step.objects.exists() and not Event.objects.exists()


# -- the admin's job page ---------------------------------------------------------------


def test_the_job_page_shows_the_steps_the_sleep_and_the_wait_and_the_events_received(admin_client):
    sleeping = sleeper.enqueue(times=1, seconds=3600)
    testing.run_job(sleeping.id)
    text = text_of(page(admin_client, url(sleeping)))
    assert "Durable steps" in text
    assert re.search(r"Now sleeping at 'sleep-0': sleeps until \S+ \S+ \(in (59|60) min", text)
    key = f"leasejobs:{sleeping.id}:before-0"
    assert re.search(rf'before-0 step done \S+ \S+ \S+ \S+ 1 \{{"key": "{key}", "name": "before-0"', text)

    waiting = waiter.enqueue("parcel:7")
    testing.run_job(waiting.id)
    text = text_of(page(admin_client, url(waiting)))
    assert "Now waiting at 'wait': waits for event 'parcel:7' (no timeout)" in text

    leasejobs.send_event("parcel:7", {"weight": "x" * 400})
    testing.run_jobs()
    text = text_of(page(admin_client, url(waiting)))
    (event_id,) = Event.objects.values_list("id", flat=True)
    assert "Now waiting" not in text
    assert re.search(rf"wait wait received event 'parcel:7' \(#{event_id}\) .* 2 4\d\d bytes of JSON", text)

    plain = three_steps.enqueue()
    assert "Durable steps" not in text_of(page(admin_client, url(plain)))


def test_an_async_body_steps_and_sleeps_with_its_async_writes_in_the_steps(start_worker):
    """On a worker (its async ORM thread's connection ends with the body's process)."""
    job = async_steps.enqueue()
    assert start_worker("--burst").wait(timeout=60) == 0
    job.refresh_from_db()
    assert (job.status, job.result, job.attempt, job.runs) == ("done", 3, 2, 1)
    assert sorted(Sent.objects.values_list("key", "attempt")) == [("step:a1", 1), ("step:a2", 2)]
    assert sorted(Step.objects.values_list("name", "attempt")) == [("a", 1), ("b", 2), ("nap", 1)]
