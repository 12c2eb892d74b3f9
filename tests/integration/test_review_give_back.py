"""A hostile review of the give-back retried at the claim loop's turns (da948ef, 895b8e6):
``Claimer._unreleased``, ``_give_back_again``, ``store.release(..., tries=)``,
``store.still_held`` and the worker's drain, on real PostgreSQL. Each test failed
on 895b8e6 (13 of 13, 6 of 6 and 6 of 6 runs).

The claimer's objects are driven by hand (as tests/integration/test_worker_seams.py
does), in the one order that went wrong: the windows are between two statements of
one thread, or between two threads.
"""

import threading
import time
from typing import Any

import psycopg
import pytest

from leasejobs.db.connection import connection_params
from leasejobs.db.store import Attempt, WorkerStore
from leasejobs.models import Job
from leasejobs.worker.claimer import GIVE_BACK_AGAIN_SECONDS, Claimer
from leasejobs.worker.held import HeldJobs, Phase
from leasejobs.worker.options import WorkerOptions
from tests.helpers import wait_until
from tests.integration.test_worker_seams import ChildlessPool, RecordedEvents
from tests.testapp.tasks import record, short_lease_sleeper

pytestmark = pytest.mark.django_db(transaction=True)


class Parts:
    def __init__(self) -> None:
        self.store = WorkerStore("w", heartbeat_timeout=5)
        self.held = HeldJobs()
        self.events = RecordedEvents("w")
        self.finished: list = []
        self.pool = ChildlessPool(self.held, self.events, self.finished)
        self.pool.outstanding = lambda: ([0], 0)  # type: ignore[method-assign]  # one idle child

    def claimer(self, store: Any = None, *, poll_interval: float = 0.05, **options: Any) -> Claimer:
        return Claimer(
            store or self.store,
            self.held,
            self.pool,
            self.events,
            WorkerOptions(worker_id="w", **options),
            lease_seconds=30,
            poll_interval=poll_interval,
            prefetch=10,
            prefetch_bytes=2**24,
            finish=self.finished.append,
            new_lease=lambda shortest: None,
        )


@pytest.fixture
def worker():
    parts = Parts()
    yield parts
    parts.store.close()


def _row(job_id: int) -> tuple:
    return Job.objects.filter(id=job_id).values_list("status", "attempt", "runs", "leased_by").get()


def _terminate_backend(pid: int) -> None:
    """What a server restart, a failover or an operator's ``pg_terminate_backend`` does to one
    of the worker's connections, between two of its statements."""
    with psycopg.connect(**connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        wait_until(
            lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone(),
            5,
            0.01,
            what="the terminated backend gone",
        )


def test_a_connection_lost_after_a_release_leaves_no_stale_give_back_to_release_the_next_claim(worker):
    """Two jobs were given back while two operators' transactions held their rows; the first
    operator commits, the second does not yet. ``_give_back_again`` sends RELEASE: it commits
    (the first job is queued, its run refunded, its attempt lowered back to 0), and the second
    job is skipped as locked; then the finish connection is lost (a failover, a server restart,
    ``pg_terminate_backend``) before ``STILL_HELD`` for the second job answers. The same turn's
    claim takes the first job again: the refund lowered its attempt, so the new claim is
    (job, 1) too, ASSIGNED to a child. On 895b8e6 the pass was abandoned with the first job's
    entry (job, 1) kept, and at the next turn its RELEASE matched that new attempt by its fence
    and gave it back while a child held it: another worker would run the body again. A pass
    whose connection fails now drops every pending give-back to its lease, and a claim drops
    the pending give-backs of the keys it made."""
    w = worker
    store = w.store
    operators = [psycopg.connect(**connection_params()) for _ in range(2)]

    class ConnectionLostAfterTheRelease:
        lock_next = True
        kill_next = False

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim(self, **kwargs: Any) -> list:
            rows = store.claim(**kwargs)
            if rows and self.lock_next:  # operators' edits lock the rows right after the claim
                self.lock_next = False
                for op, row in zip(operators, rows, strict=True):
                    op.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [row.id])
            return rows

        def release(self, jobs, **kwargs):
            released = store.release(jobs, **kwargs)
            if self.kill_next:
                self.kill_next = False
                _terminate_backend(store._finish.connect().info.backend_pid)
            return released

    wrapped = ConnectionLostAfterTheRelease()
    first, second = record.enqueue(1), record.enqueue(2)
    overflowing = [True]
    real_overflow = w.pool.overflow

    def overflow_once(jobs):  # the claim judged more room than the children had (a child died)
        if overflowing[0]:
            overflowing[0] = False
            return list(jobs)
        return real_overflow(jobs)

    w.pool.overflow = overflow_once  # type: ignore[method-assign]
    handed: list[Attempt] = []  # every job a child was given
    real_assign = w.pool.assign

    def assign(jobs):
        overflow = real_assign(jobs)
        handed.extend(j.key for j in jobs if j not in overflow)
        return overflow

    w.pool.assign = assign  # type: ignore[method-assign]
    claimer = w.claimer(wrapped)
    try:
        assert claimer.claim(2) == 2  # both given back at once, found locked for 0.2 s: kept
        assert [j.key for j in claimer._unreleased] == [Attempt(first.id, 1), Attempt(second.id, 1)]
        operators[0].commit()  # the first operator is done; the second still holds its row

        wrapped.kill_next = True
        time.sleep(GIVE_BACK_AGAIN_SECONDS)
        stopping = threading.Event()
        assert claimer._one_turn(stopping)
        time.sleep(0.15)  # past GIVE_BACK_AGAIN_SECONDS and the finish connection's reconnect backoff
        assert claimer._one_turn(stopping)
        # The first job was released, then claimed again by this worker at the same key (the
        # refund lowered its attempt), and handed to a child once: the row must say it is ours.
        assert [j.key for j in w.held.in_phase(Phase.ASSIGNED)] == [Attempt(first.id, 1)]
        assert (handed, _row(first.id)) == ([Attempt(first.id, 1)], ("running", 1, 1, "w")), (
            "a stale give-back released the job's new claim, which a child holds and may be "
            f"running: handed to children {handed}, row (status, attempt, runs, leased_by) = "
            f"{_row(first.id)}; still to give back: {[j.key for j in claimer._unreleased]}"
        )
    finally:
        for op in operators:
            op.close()


def test_a_give_back_found_locked_by_the_listeners_claim_is_tried_again_before_the_poll(worker):
    """The listener's thread claims for a NOTIFY (``Claimer.notified``) while the loop waits out
    its poll interval. The claim took more than the children had room for and the release of
    the extra job met an operator's lock for its fifth of a second: it goes to ``_unreleased``.
    On 895b8e6 ``_claim_for_notify`` said the loop need not wake (``_gave_back``), so the loop
    went on waiting the whole poll interval, not ``GIVE_BACK_AGAIN_SECONDS``: the job, free a
    moment later, stayed running (and out of every worker's reach) until the poll."""
    w = worker
    store = w.store
    operator = psycopg.connect(**connection_params())

    class OperatorLocksWhatWasClaimed:
        lock_next = True

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def claim(self, **kwargs: Any) -> list:
            rows = store.claim(**kwargs)
            if rows and self.lock_next:  # an operator's edit locks the rows right after the claim
                self.lock_next = False
                operator.execute(
                    "SELECT 1 FROM leasejobs_job WHERE id = ANY(%s) FOR UPDATE", [[r.id for r in rows]]
                )
            return rows

    w.pool.overflow = lambda jobs: list(jobs)  # type: ignore[method-assign]  # the claim found less room than judged
    claimer = w.claimer(OperatorLocksWhatWasClaimed(), poll_interval=10.0)
    stopping = threading.Event()
    loop = threading.Thread(target=claimer.run, args=(stopping,), daemon=True)
    loop.start()
    try:
        wait_until(lambda: claimer._claiming, 5, 0.01, what="the claim loop running")
        time.sleep(0.2)  # the loop's first turn found nothing; it waits out its poll interval
        job = record.enqueue(1)
        listener = threading.Thread(target=claimer.notified, args=("default",), daemon=True)
        listener.start()
        listener.join(timeout=5)
        assert not listener.is_alive()
        assert [j.key.id for j in claimer._unreleased] == [job.id], "given back while locked"
        operator.commit()  # the row is free now
        freed = time.monotonic()
        wait_until(lambda: _row(job.id)[:3] == ("queued", 0, 0), 3, 0.01, what="the give-back retried")
        assert time.monotonic() - freed < 1.0
    finally:
        operator.close()
        stopping.set()
        claimer.wake.set()
        loop.join(timeout=15)
        assert not loop.is_alive()


def test_a_give_back_pending_when_max_jobs_ends_the_loop_is_tried_again_while_the_worker_drains(worker):
    """``--max-jobs`` ends the claim loop with a give-back still pending (its row was locked);
    the worker then drains its running bodies. On 895b8e6 nothing tried the give-back again
    until the worker's very last release: the job stayed 'running', its run counted, and once
    its lease (2 s here) ran out another worker's claim took it over and ended it 'failed'
    (one attempt) without any body of it having started. The drain now tries it again
    (``give_back_pending``) and waits for it (``test_a_worker_drains_a_give_back_found_locked``)."""
    w = worker
    lost = short_lease_sleeper.enqueue(0)
    Job.objects.filter(id=lost.id).update(max_attempts=1)
    claimer = w.claimer(max_jobs=1)
    assert claimer.claim(1) == 1
    (job,) = w.held.in_phase(Phase.ASSIGNED)
    assert job.key.id == lost.id
    stopping = threading.Event()
    with psycopg.connect(**connection_params()) as operator:
        operator.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [lost.id])
        claimer._give_back([job])  # found locked: pending
        record.enqueue(2)  # the job this worker's --max-jobs 1 will run
        time.sleep(GIVE_BACK_AGAIN_SECONDS)
        # Claims the other job; --max-jobs then waits (the loop goes on) until nothing is held
        # and no give-back is pending, and the drain tries again as well.
        assert claimer._one_turn(stopping), "--max-jobs ends the loop with a give-back pending"
        assert w.held.claimed == 1
        assert [j.key for j in claimer._unreleased] == [job.key]
        assert claimer.give_back_pending(), "the drain's try while the row is locked"
    time.sleep(GIVE_BACK_AGAIN_SECONDS)
    assert not claimer.give_back_pending(), "the drain's try once the operator committed"
    assert _row(lost.id)[:3] == ("queued", 0, 0), "given back, its run refunded"
    other = WorkerStore("other", heartbeat_timeout=5)
    try:
        rows = other.claim(limit=10, counted=10, queues=None, lease_seconds=30, task_leases={})
    finally:
        other.close()
    assert [(r.id, r.ended) for r in rows] == [(lost.id, None)], "another worker runs it"
    assert _row(lost.id)[:3] == ("running", 1, 1)


def test_a_worker_drains_a_give_back_found_locked():
    """The worker's drain (after ``--burst``, ``--max-jobs`` or a stop's claims) waits for a
    give-back found locked as it waits for a body: once the operator's transaction ends, the
    job is queued again, its run refunded, before the worker goes on to exit."""
    from leasejobs.worker.worker import Worker

    worker = Worker(WorkerOptions(worker_id="w"))
    job_row = record.enqueue(1)
    try:
        rows, _ = worker.claimer._timed_claim(1)
        assert [r.id for r in rows] == [job_row.id]
        job = worker.claimer._held_job(rows[0], time.monotonic(), 0.0)
        worker.held.add([job])
        operator = psycopg.connect(**connection_params())
        operator.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [job_row.id])
        worker.claimer._give_back([job])  # found locked for 0.2 s: pending
        assert _row(job_row.id)[0] == "running"
        committing = threading.Timer(0.5, operator.commit)
        committing.start()
        began = time.monotonic()
        drain = threading.Thread(target=worker._drain, daemon=True)
        drain.start()
        drain.join(timeout=10)
        committing.join(timeout=5)
        operator.close()
        assert not drain.is_alive(), "the drain did not end once the row was free"
        assert time.monotonic() - began >= 0.4, "the drain returned before the give-back was done"
        assert _row(job_row.id)[:3] == ("queued", 0, 0)
    finally:
        worker.store.close()
