"""The worker's threads where they meet, in-process, on real PostgreSQL.

A worker process cannot hit these interleavings on demand: the window is
between two statements of different threads. Here the threads' objects are
driven by hand, in the one order that used to go wrong, against real rows.
The pool of children is the real ``Pool`` with no zygote behind it: the
tests call what its thread would call when a child reports.
"""

import threading
import time
from typing import Any

import pytest

from leasejobs.db.store import Attempt, Outcome, WorkerStore
from leasejobs.jobs.registry import Task
from leasejobs.models import Job
from leasejobs.worker.claimer import GIVE_BACK_AGAIN_SECONDS, Claimer
from leasejobs.worker.events import Events
from leasejobs.worker.finisher import Finisher
from leasejobs.worker.heartbeat import Heartbeater
from leasejobs.worker.held import HeldJob, HeldJobs, Phase
from leasejobs.worker.messages import Ended
from leasejobs.worker.options import WorkerOptions
from leasejobs.worker.pool import Pool
from leasejobs.worker.slots import LEASE_LOST, SlotTable
from leasejobs.worker.worker import Worker
from tests.helpers import wait_until
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


class ChildlessPool(Pool):
    """The real pool with one pretend child slot and no zygote: what it was asked to do is kept."""

    def __init__(self, held: HeldJobs, events: Events, finished: list[HeldJob]) -> None:
        super().__init__(
            SlotTable(1), held, events, finish=finished.append, work_wanted=lambda: None, stop_grace=1.0
        )
        self.stopped_bodies: list[tuple[Attempt, int]] = []

    def stop_body(self, job: HeldJob, flag: int, grace: float) -> None:
        self.stopped_bodies.append((job.key, flag))

    def cancel(self, job: HeldJob) -> None:
        pass


class Parts:
    """One worker's store, table, events, pool and heartbeat object, driven by hand."""

    def __init__(self) -> None:
        self.store = WorkerStore("w", heartbeat_timeout=5)
        self.held = HeldJobs()
        self.events = RecordedEvents("w")
        self.finished: list[HeldJob] = []
        self.pool = ChildlessPool(self.held, self.events, self.finished)
        self.heartbeater = Heartbeater(
            self.store,
            self.held,
            self.pool,
            self.events,
            enabled=True,
            interval_option=None,
            default_lease=30,
        )

    def claimer(self, store: Any = None, **options: Any) -> Claimer:
        return Claimer(
            store or self.store,
            self.held,
            self.pool,
            self.events,
            WorkerOptions(worker_id="w", **options),
            lease_seconds=30,
            poll_interval=0.05,
            prefetch=10,
            prefetch_bytes=2**24,
            finish=self.finished.append,
            new_lease=lambda shortest: None,
        )

    def finisher(self) -> Finisher:
        return Finisher(self.store, self.held, self.events, on_written=lambda: None)

    def claim_one(self, task: Task = record, *args: Any) -> HeldJob:
        """Claim one job as the claimer does; it is ASSIGNED (as if given to a child)."""
        task.enqueue(*(args or (1,)))
        claimer = self.claimer()
        assert claimer.claim(1) == 1
        (job,) = self.held.in_phase(Phase.ASSIGNED)
        return job


@pytest.fixture
def worker():
    parts = Parts()
    yield parts
    parts.store.close()


def test_a_heartbeat_between_a_finishs_commit_and_its_bookkeeping_loses_no_lease(worker):
    """The finish is committed, the table not yet told: the row is no longer 'running'.

    The heartbeat of that moment finds the row not held. That is the job's
    own finish, not a takeover: the job must be counted done, not a lost
    lease, and no "lease lost" may be reported.
    """
    w = worker
    job = w.claim_one()
    assert w.held.settle(job, Outcome(status="done"), started=True)

    class HeartbeatRightAfterTheCommit:
        def finish(self, *args, **kwargs):
            rows = w.store.finish(*args, **kwargs)
            w.heartbeater._beat(w.held.to_beat(), lag=0)
            return rows

    finisher = Finisher(HeartbeatRightAfterTheCommit(), w.held, w.events, on_written=lambda: None)  # type: ignore[arg-type]
    assert finisher._write([job]) == []
    assert w.events.lost == []
    assert job.phase is Phase.FINISHED and not job.ctx.lease_lost
    assert w.held.counts["done"] == 1 and w.held.counts["lost_leases"] == 0
    assert Job.objects.get(id=job.key.id).status == "done"


def test_a_settled_job_taken_over_before_its_finish_is_lost_once_by_the_finish(worker):
    """The heartbeat finds a settled job taken over; its finish, refused, reports it once."""
    w = worker
    job = w.claim_one()
    assert w.held.settle(job, Outcome(status="done"), started=True)
    Job.objects.filter(id=job.key.id).update(attempt=job.key.attempt + 1, leased_by="other")
    w.heartbeater._beat(w.held.to_beat(), lag=0)
    assert w.events.lost == [] and job.phase is Phase.SETTLED, "a settled job's finish decides"
    assert w.held.to_beat() == [], "nothing left to renew"
    assert w.pool.stopped_bodies == [], "its body has ended already"
    assert w.finisher()._write([job]) == []
    assert [key for key, _ in w.events.lost] == [job.key]
    assert "stale done dropped" in w.events.lost[0][1]
    assert w.held.counts["lost_leases"] == 1 and w.held.counts["done"] == 0


def test_a_running_job_the_heartbeat_finds_taken_over_is_dropped_reported_and_its_body_stopped(worker):
    w = worker
    job = w.claim_one()
    Job.objects.filter(id=job.key.id).update(attempt=job.key.attempt + 1, leased_by="other")
    w.heartbeater._beat(w.held.to_beat(), lag=0)
    assert [key for key, _ in w.events.lost] == [job.key]
    assert job.phase is Phase.DROPPED and job.ctx.lease_lost
    assert w.pool.stopped_bodies == [(job.key, LEASE_LOST)]


def test_a_timed_out_body_that_ends_on_lease_lost_leaves_the_timeout_to_its_finish(worker):
    """The pool times the body out (STOPPING, a retry decided); the stopped body then reports
    that it let ``LeaseLost`` escape. The job must not be dropped as lost: the row is still
    this worker's, and the retry is written, once the body has ended and not before."""
    w = worker
    job = w.claim_one(overruns, 0)
    outcome = Outcome(status="queued", last_error="TimeoutError: past its timeout", retry_delay=0.1)
    assert w.held.stop(job, outcome, "it ran past its timeout")
    assert w.finished == [], "nothing is written while its body may still run"
    w.pool._ended(job, Ended(job.seq, None, 1.2, True, lost="job 1 attempt 1 no longer holds its lease"))
    assert w.events.lost == [] and job.phase is Phase.SETTLED and w.finished == [job]
    assert w.finisher()._write([job]) == []
    assert Job.objects.get(id=job.key.id).status == "queued"
    assert w.events.outcomes == [(job.key, "queued")]
    assert w.held.counts["retried"] == 1 and w.held.counts["lost_leases"] == 0


def test_a_body_that_ends_after_its_lease_was_found_lost_writes_nothing(worker):
    w = worker
    job = w.claim_one()
    Job.objects.filter(id=job.key.id).update(attempt=job.key.attempt + 1, leased_by="other")
    w.heartbeater._beat(w.held.to_beat(), lag=0)
    w.pool._ended(job, Ended(job.seq, Outcome(status="done"), 0.1, True))
    assert w.finished == [] and job.phase is Phase.DROPPED


def test_a_retry_that_a_pending_cancel_turns_into_a_cancel_is_counted_and_logged_as_cancelled(worker):
    """The cancel reached the row after the body failed and before any heartbeat carried it."""
    w = worker
    job = w.claim_one()
    assert w.held.settle(
        job, Outcome(status="queued", last_error="ValueError: boom", retry_delay=5), started=True
    )
    Job.objects.filter(id=job.key.id).update(cancel_requested=True)
    assert w.finisher()._write([job]) == []
    assert Job.objects.get(id=job.key.id).status == "cancelled"
    assert w.events.outcomes == [(job.key, "cancelled")]
    assert w.held.counts["cancelled"] == 1 and w.held.counts["retried"] == 0


def test_burst_does_not_exit_on_a_retry_its_own_finish_queued_after_the_claims_snapshot(worker):
    """``--burst`` exits when a claim finds nothing and nothing is held. Our finisher may commit a
    retry due at once (and forget the job) after that claim's snapshot: it is due, so the worker
    must look again, not exit with it queued."""
    w = worker
    job = w.claim_one()
    assert w.held.settle(
        job, Outcome(status="queued", last_error="ValueError: boom", retry_delay=0), started=True
    )
    finisher = w.finisher()
    store = w.store

    stop = threading.Event()

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
            else:
                stop.set()  # no child runs it here: --max-jobs would wait for it to end
            return rows

    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child
    claimer = w.claimer(RetryWrittenDuringTheFirstClaim(), burst=True, max_jobs=2)
    claimer.run(stop)
    again = Job.objects.get(id=job.key.id)
    assert (again.status, again.attempt, w.held.claimed) == ("running", 2, 2), "it was claimed again"


def test_a_job_given_back_while_an_operator_holds_its_row_is_given_back_once_the_row_is_free(worker):
    """A claim took more than the children had room for, and the release of the extra job found
    its row locked by an operator's transaction (``FOR UPDATE``, as an admin edit does) for longer
    than the store's fifth of a second of tries. The claimer tries again at its next turns: a
    ``--burst`` worker does not exit meanwhile, and once the row is free the job is queued again
    with its run refunded, and claimed. (It used to be left to its lease: a burst worker exited
    with the job running, and any worker waited out the whole lease before running it.)"""
    import psycopg

    from leasejobs.db.connection import connection_params

    w = worker
    record.enqueue(1)
    claimer = w.claimer(burst=True)
    assert claimer.claim(1) == 1
    (job,) = w.held.in_phase(Phase.ASSIGNED)
    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child
    stopping = threading.Event()
    with psycopg.connect(**connection_params()) as operator:
        operator.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [job.key.id])
        claimer._give_back([job])
        assert Job.objects.get(id=job.key.id).status == "running"
        assert claimer._one_turn(stopping), "a --burst worker must not exit with a give-back pending"
        assert Job.objects.get(id=job.key.id).status == "running"
    time.sleep(GIVE_BACK_AGAIN_SECONDS)
    assert claimer._one_turn(stopping)
    again = Job.objects.get(id=job.key.id)
    assert (again.status, again.attempt, again.runs) == ("running", 1, 1), "refunded, then claimed again"
    assert [j.key for j in w.held.in_phase(Phase.ASSIGNED)] == [job.key]
    assert claimer.take_unreleased() == []


def test_a_give_back_found_locked_whose_job_an_operator_ended_meanwhile_is_dropped(worker):
    """The operator's transaction that held the row ends the job (as a cancel of a job seen as
    not started would) and commits: the give-back matches nothing any more, so the claimer stops
    trying at once, and a ``--burst`` worker exits, instead of waiting for the lease to run out."""
    import psycopg

    from leasejobs.db.connection import connection_params

    w = worker
    record.enqueue(1)
    claimer = w.claimer(burst=True)
    assert claimer.claim(1) == 1
    (job,) = w.held.in_phase(Phase.ASSIGNED)
    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child
    with psycopg.connect(**connection_params()) as operator:
        operator.execute(
            "UPDATE leasejobs_job SET status = 'cancelled', lease_until = NULL, finished_at = now()"
            " WHERE id = %s",
            [job.key.id],
        )
        claimer._give_back([job])
    time.sleep(GIVE_BACK_AGAIN_SECONDS)
    assert not claimer._one_turn(threading.Event()), "nothing left to give back or to claim: --burst exits"
    assert claimer.take_unreleased() == []
    assert Job.objects.get(id=job.key.id).status == "cancelled"


def test_a_give_back_pending_never_gives_back_the_live_attempt_a_claim_made_of_the_same_key(worker):
    """A give-back undoes its claim's attempt, so the next claim of that job makes the same
    (id, attempt) key. A pending give-back whose release did commit, unseen (the connection
    lost with the answer), must not give back the live attempt a claim of ours then made of the
    job: its body may be running, and another worker would run the job beside it."""
    import psycopg

    from leasejobs.db.connection import connection_params

    w = worker
    record.enqueue(1)
    claimer = w.claimer()
    assert claimer.claim(1) == 1
    (job,) = w.held.in_phase(Phase.ASSIGNED)
    with psycopg.connect(**connection_params()) as operator:
        operator.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [job.key.id])
        claimer._give_back([job])
    assert w.store.release([(job.key, True)]) == {job.key}  # committed; its answer "lost"
    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child
    assert claimer.claim(1, front=True) == 1
    (again,) = w.held.in_phase(Phase.ASSIGNED)
    assert again.key == job.key, "the same key, a live attempt"
    time.sleep(GIVE_BACK_AGAIN_SECONDS)
    claimer._give_back_again()
    row = Job.objects.get(id=job.key.id)
    assert (row.status, row.attempt, row.runs) == ("running", 1, 1)


def test_news_of_a_freed_place_during_a_limited_claim_keeps_the_next_one_due(worker):
    """A finish frees a place and NOTIFYs while CLAIM_LIMITED runs on an older snapshot: the
    next limited claim must be due at once, not after the poll interval."""
    w = worker
    store = w.store

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

    w.pool.idle_children = lambda: 1  # type: ignore[method-assign]
    claimer = w.claimer(NotifiedDuringTheLimitedClaim(), queues=["pdf"])
    assert claimer.limits.refresh() and claimer.limits.due()
    assert claimer.claim_limited() == 0
    assert claimer.limits.due()


def test_an_error_of_a_claim_in_the_listeners_thread_stops_the_claim_loop_with_it(worker):
    """A NOTIFY to an idle worker is claimed for in the listener's thread. An error there
    that is not a lost connection must end the worker as the claim loop's own errors do
    (the loop returns by raising, and the worker gives back what it holds), not only its
    listener thread (which exits the process at once) nor be taken for a listener lost."""
    w = worker
    store = w.store

    class FailsInTheListenersThread:
        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim(self, **kwargs: Any) -> list:
            if threading.current_thread().name == "listener":
                raise RuntimeError("a bug in the claim's bookkeeping")
            return store.claim(**kwargs)

    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child
    claimer = w.claimer(FailsInTheListenersThread())
    raised: list[BaseException] = []

    def loop() -> None:
        try:
            claimer.run(threading.Event())
        except BaseException as exc:
            raised.append(exc)

    main = threading.Thread(target=loop)
    main.start()
    wait_until(lambda: claimer._claiming, timeout=5, what="the claim loop runs")

    def listen() -> None:  # a NOTIFY now and then, until one finds the loop waiting
        deadline = time.monotonic() + 5
        while main.is_alive() and time.monotonic() < deadline:
            claimer.notified("default")
            time.sleep(0.01)

    listener = threading.Thread(target=listen, name="listener")
    listener.start()
    listener.join(timeout=10)
    main.join(timeout=5)
    assert not main.is_alive(), "the claim loop went on"
    assert [str(exc) for exc in raised] == ["a bug in the claim's bookkeeping"]


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
    w = worker
    store = w.store
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
    w.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]
    claimer = w.claimer(counted)
    claimer.wake = StopLandsBeforeTheClear()
    claimer.run(stopping)
    assert counted.claims == 0


def test_a_job_cancelled_while_it_waits_for_a_child_never_starts(worker):
    """A claimed job waits in the pool's backlog while no child takes jobs (children being
    replaced); the heartbeat finds a cancel requested for it meanwhile. No child holds it,
    so no slot flag goes up: handed to a child later, its body would start without
    ``ctx.cancel_requested`` and end ``done``. It ends cancelled, unstarted, instead."""
    w = worker
    job = w.claim_one()
    assert list(w.pool._backlog) == [job], "no child: the job waits in the backlog"
    job.cancel_requested = True  # as the heartbeat sets it, before telling the pool
    Pool.cancel(w.pool, job)
    with w.pool.lock:
        w.pool._send_all()
    assert (list(w.pool._backlog), w.finished) == ([], [job])
    assert job.outcome is not None and job.outcome.status == "cancelled"
