"""The worker's threads where they meet, in-process, on real PostgreSQL.

A worker process cannot hit these interleavings on demand: the window is
between two statements of different threads. Here the threads' objects are
driven by hand, in the one order that used to go wrong, against real rows.
"""

import pytest

from leasejobs.models import Job
from leasejobs.store import Attempt, Outcome, WorkerStore
from leasejobs.testing import _held_job
from leasejobs.worker.events import Events
from leasejobs.worker.finisher import Finisher
from leasejobs.worker.heartbeat import Heartbeater
from leasejobs.worker.held import HeldJob, HeldJobs, Phase
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db(transaction=True)


class RecordedEvents(Events):
    """The worker's events, with every lost lease kept for the test to read."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(worker_id)
        self.lost: list[tuple[Attempt, str]] = []

    def lease_lost(self, job: HeldJob, why: str, *, stale_write: bool = False) -> None:
        self.lost.append((job.key, why))
        super().lease_lost(job, why, stale_write=stale_write)


@pytest.fixture
def worker():
    """One worker's store, table of held jobs, events and heartbeat, and a running job it holds."""
    store = WorkerStore("w", heartbeat_timeout=5)
    held = HeldJobs()
    events = RecordedEvents("w")
    heartbeater = Heartbeater(
        store, held, events, enabled=True, interval_option=None, default_lease=30, settle=held.settle
    )
    yield store, held, events, heartbeater
    store.close()


def claim_one(store: WorkerStore, held: HeldJobs) -> HeldJob:
    """Claim one job and start it, as the claimer and a runner do."""
    record.enqueue(1)
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
