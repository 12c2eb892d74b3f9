"""The worker's threads where they meet, in-process, on real PostgreSQL.

A worker process cannot hit these interleavings on demand: the window is
between two statements of different threads. Here the threads' objects are
driven by hand, in the one order that used to go wrong, against real rows.
"""

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from leasejobs.models import Job
from leasejobs.registry import Task
from leasejobs.store import Attempt, Outcome, WorkerStore
from leasejobs.testing import _held_job
from leasejobs.worker.claimer import Claimer
from leasejobs.worker.events import Events
from leasejobs.worker.finisher import Finisher
from leasejobs.worker.heartbeat import Heartbeater
from leasejobs.worker.held import HeldJob, HeldJobs, Phase
from leasejobs.worker.options import WorkerOptions
from leasejobs.worker.runners import Runners
from leasejobs.worker.worker import Worker
from tests.testapp.tasks import overruns, record

pytestmark = pytest.mark.django_db(transaction=True)


class RecordedEvents(Events):
    """The worker's events, with every lost lease and written outcome kept for the test to read."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.lost: list[tuple[Attempt, str]] = []
        self.outcomes: list[tuple[Attempt, str]] = []

    def lease_lost(self, job: HeldJob, why: str, *, stale_write: bool = False) -> None:
        self.lost.append((job.key, why))
        super().lease_lost(job, why, stale_write=stale_write)

    def outcome(self, job: HeldJob, outcome: Outcome) -> None:
        self.outcomes.append((job.key, outcome.status))
        super().outcome(job, outcome)


@pytest.fixture
def worker():
    """One worker's store, table of held jobs, events and heartbeat, and a running job it holds."""
    store = WorkerStore("w", heartbeat_timeout=5)
    held = HeldJobs()
    events = RecordedEvents("w")
    heartbeater = heartbeat_thread(store, held, events, settle=held.settle)
    yield store, held, events, heartbeater
    store.close()


def heartbeat_thread(
    store: WorkerStore, held: HeldJobs, events: Events, settle: Callable[[HeldJob, Outcome], bool]
) -> Heartbeater:
    """The heartbeat and timeout thread's object, driven by hand (its thread is not started)."""
    return Heartbeater(
        store, held, events, enabled=True, interval_option=None, default_lease=30, settle=settle
    )


def claim_loop(store: Any, held: HeldJobs, events: Events, **options: Any) -> Claimer:
    """The claimer's object, driven by hand (``store``: a real one, or one that steps in)."""
    return Claimer(
        store,
        held,
        events,
        WorkerOptions(worker_id="w", **options),
        lease_seconds=30,
        poll_interval=0.05,
        prefetch=10,
        mean_duration=lambda: None,
        settle=held.settle,
        new_lease=lambda shortest: None,
        after_side_effect=lambda: None,
    )


def claim_one(store: WorkerStore, held: HeldJobs, task: Task = record, *args: Any) -> HeldJob:
    """Claim one job and start it, as the claimer and a runner do."""
    task.enqueue(*(args or (1,)))
    (row,) = store.claim(limit=1, counted=1, queues=None, lease_seconds=30, task_leases={})
    job = _held_job(row)
    held.add([job], [])
    assert held.take() is job
    return job


def test_a_heartbeat_between_a_finishs_commit_and_its_bookkeeping_loses_no_lease(worker):
    """The finish is committed, the table not yet told: the row is no longer 'running'.

    The heartbeat of that moment finds the row not held. That is the job's
    own finish, not a takeover: the job must be counted done, not a lost
    lease, and no "lease lost" may be reported.
    """
    store, held, events, heartbeater = worker
    job = claim_one(store, held)
    assert held.settle(job, Outcome(status="done"))

    class HeartbeatRightAfterTheCommit:
        def finish(self, *args, **kwargs):
            rows = store.finish(*args, **kwargs)
            heartbeater._beat(held.to_beat(), lag=0)
            return rows

    finisher = Finisher(HeartbeatRightAfterTheCommit(), held, events, on_written=lambda: None)  # type: ignore[arg-type]
    assert finisher._write([job]) == []
    assert events.lost == []
    assert job.phase is Phase.FINISHED and not job.ctx.lease_lost
    assert held.counts["done"] == 1 and held.counts["lost_leases"] == 0
    assert Job.objects.get(id=job.key.id).status == "done"


def test_a_settled_job_taken_over_before_its_finish_is_lost_once_by_the_finish(worker):
    """The heartbeat finds a settled job taken over; its finish, refused, reports it once."""
    store, held, events, heartbeater = worker
    job = claim_one(store, held)
    assert held.settle(job, Outcome(status="done"))
    Job.objects.filter(id=job.key.id).update(attempt=job.key.attempt + 1, leased_by="other")
    heartbeater._beat(held.to_beat(), lag=0)
    assert events.lost == [] and job.phase is Phase.SETTLED, "a settled job's finish decides"
    assert held.to_beat() == [], "nothing left to renew"
    finisher = Finisher(store, held, events, on_written=lambda: None)
    assert finisher._write([job]) == []
    assert [key for key, _ in events.lost] == [job.key]
    assert "stale done dropped" in events.lost[0][1]
    assert held.counts["lost_leases"] == 1 and held.counts["done"] == 0


def test_a_running_job_the_heartbeat_finds_taken_over_is_dropped_and_reported(worker):
    store, held, events, heartbeater = worker
    job = claim_one(store, held)
    Job.objects.filter(id=job.key.id).update(attempt=job.key.attempt + 1, leased_by="other")
    heartbeater._beat(held.to_beat(), lag=0)
    assert [key for key, _ in events.lost] == [job.key]
    assert job.phase is Phase.DROPPED and job.ctx.lease_lost


def test_a_body_stopped_by_lease_lost_after_its_timeout_leaves_the_timeout_to_its_finish(worker):
    """The heartbeat times the body out (SETTLED, a retry waiting to be written, its context
    marked lost); the body's next side effect raises ``LeaseLost``. The runner must not drop
    the settled job as lost: the row is still this worker's and the retry is written."""
    store, held, events, _ = worker
    timeouts = heartbeat_thread(store, held, events, settle=partial(held.settle, beating=False))
    job = claim_one(store, held, overruns, 0)
    job.deadline = 0.0
    timeouts._check_timeouts(held.to_beat(), now=1.0)
    assert job.phase is Phase.SETTLED and job.ctx.lease_lost
    runners = Runners(store, held, events, settle=held.settle, buffer_low=lambda buffered: None)
    outcome, raised = runners._execute(job)
    assert outcome is None and type(raised).__name__ == "LeaseLost"
    assert events.lost == [] and job.phase is Phase.SETTLED
    assert Finisher(store, held, events, on_written=lambda: None)._write([job]) == []
    assert Job.objects.get(id=job.key.id).status == "queued"
    assert events.outcomes == [(job.key, "queued")]
    assert held.counts["retried"] == 1 and held.counts["lost_leases"] == 0


def test_a_job_settled_before_its_deadline_is_not_timed_out_while_its_finish_waits(worker):
    store, held, events, _ = worker
    settled: list[HeldJob] = []
    timeouts = heartbeat_thread(store, held, events, settle=lambda job, outcome: settled.append(job) or False)
    job = claim_one(store, held)
    job.deadline = 0.5
    assert held.settle(job, Outcome(status="done"))
    timeouts._check_timeouts(held.to_beat(), now=1.0)
    assert settled == [], "a settled job has no body left to time out"


def test_a_retry_that_a_pending_cancel_turns_into_a_cancel_is_counted_and_logged_as_cancelled(worker):
    """The cancel reached the row after the body failed and before any heartbeat carried it."""
    store, held, events, _ = worker
    job = claim_one(store, held)
    assert held.settle(job, Outcome(status="queued", last_error="ValueError: boom", retry_delay=5))
    Job.objects.filter(id=job.key.id).update(cancel_requested=True)
    assert Finisher(store, held, events, on_written=lambda: None)._write([job]) == []
    assert Job.objects.get(id=job.key.id).status == "cancelled"
    assert events.outcomes == [(job.key, "cancelled")]
    assert held.counts["cancelled"] == 1 and held.counts["retried"] == 0


def test_burst_does_not_exit_on_a_retry_its_own_finish_queued_after_the_claims_snapshot(worker):
    """``--burst`` exits when a claim finds nothing and nothing is held. Our finisher may commit a
    retry due at once (and forget the job) after that claim's snapshot: it is due, so the worker
    must look again, not exit with it queued."""
    store, held, events, _ = worker
    job = claim_one(store, held)
    assert held.settle(job, Outcome(status="queued", last_error="ValueError: boom", retry_delay=0))
    finisher = Finisher(store, held, events, on_written=lambda: None)

    class RetryWrittenDuringTheFirstClaim:
        claims = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim(self, **kwargs: Any) -> list:
            rows = store.claim(**kwargs)
            self.claims += 1
            if self.claims == 1:
                assert rows == []  # the job is still ours and running in this snapshot
                assert finisher._write([job]) == []
            return rows

    claimer = claim_loop(RetryWrittenDuringTheFirstClaim(), held, events, burst=True, max_jobs=2)
    claimer.run(threading.Event())
    again = Job.objects.get(id=job.key.id)
    assert (again.status, again.attempt, held.claimed) == ("running", 2, 2), "it was claimed again"


def test_news_of_a_freed_place_during_a_limited_claim_keeps_the_next_one_due(worker):
    """A finish frees a place and NOTIFYs while CLAIM_LIMITED runs on an older snapshot: the
    next limited claim must be due at once, not after the poll interval."""
    store, held, events, _ = worker

    class NotifiedDuringTheLimitedClaim:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def limits_apply(self, queues: list[str] | None) -> tuple[list[str], bool]:
            return ["pdf"], False

        def claim(self, **kwargs: Any) -> list:
            rows = store.claim(**kwargs)
            if kwargs.get("limited"):
                claimer.notified("pdf")  # the listener thread, while the statement runs
            return rows

    claimer = claim_loop(NotifiedDuringTheLimitedClaim(), held, events, queues=["pdf"])
    assert claimer.limits.refresh() and claimer.limits.due()
    assert claimer.claim_limited() == 0
    assert claimer.limits.due()


def test_a_job_settled_past_its_deadline_does_not_keep_the_heartbeat_thread_awake(worker):
    """Its finish may wait (a locked row, an outage): the thread must sleep meanwhile, not wake
    every few milliseconds to look at a deadline no body can pass any more."""
    store, _, events, _ = worker

    class CountedLooks(HeldJobs):
        looks = 0

        def to_beat(self) -> list[HeldJob]:
            self.looks += 1
            return super().to_beat()

    held = CountedLooks()
    job = claim_one(store, held)
    job.deadline = 0.0
    assert held.settle(job, Outcome(status="done"))
    thread_object = Heartbeater(
        store, held, events, enabled=False, interval_option=None, default_lease=30, settle=held.settle
    )
    thread = threading.Thread(target=thread_object.run)
    thread.start()
    time.sleep(0.5)
    thread_object.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert held.looks <= 5, f"{held.looks} looks in half a second"


def test_a_stop_signal_that_lands_while_the_claimer_holds_its_wake_lock_stops_the_worker():
    """SIGTERM's handler runs in the main thread between any two bytecodes, so also inside the
    claimer's own ``wake.clear()`` or ``wake.wait()``, which hold that Event's lock for a few. A
    handler that takes the same lock never returns: the worker logs "stopping" and hangs (CI saw
    one). The handler must take no lock; the stop still wakes the claimer."""
    worker = Worker(WorkerOptions(worker_id="w"))
    stops = threading.Thread(target=worker._handle_stops, daemon=True)
    stops.start()
    returned = threading.Event()

    def the_main_thread_when_the_signal_lands() -> None:
        with worker.claimer.wake._cond:  # as inside Event.clear() or Event.wait()
            worker.request_stop()  # what the SIGTERM handler runs, in that same thread
        returned.set()

    threading.Thread(target=the_main_thread_when_the_signal_lands, daemon=True).start()
    try:
        assert returned.wait(5), "the signal handler waits for a lock its own thread holds"
        assert worker.shutdown.requested.wait(5) and worker.claimer.wake.wait(5)
        assert worker.shutdown.grace_deadline is not None
    finally:
        worker._stop_requests.put(False)
        stops.join(timeout=5)
        worker.store.close()
    assert not stops.is_alive()


def test_a_stop_that_lands_just_before_the_claimer_clears_its_wake_up_claims_nothing_more(worker):
    """The stop thread sets ``stopping`` and wakes the claimer; the claimer, between its look at
    ``stopping`` and clearing its wake-up, must not lose that wake-up and claim once more."""
    store, held, events, _ = worker
    stopping = threading.Event()

    class CountedClaims:
        claims = 0

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim(self, **kwargs: Any) -> list:
            self.claims += 1
            return store.claim(**kwargs)

    class StopLandsBeforeTheClear(threading.Event):
        def clear(self) -> None:
            if not stopping.is_set():  # the stop thread, right now: shutdown.request(), wake.set()
                stopping.set()
                self.set()
            super().clear()

    counted = CountedClaims()
    claimer = claim_loop(counted, held, events)
    claimer.wake = StopLandsBeforeTheClear()
    claimer.run(stopping)
    assert counted.claims == 0
