"""The table of held jobs against a simple model, driven by Hypothesis.

Random interleavings of claim (including a re-claim of a job the worker
still holds an older attempt of), a body's end, a stop (timeout, or give
back at the end of a stop's grace), the stopped body's end, a finish, a drop
(found lost), a give-back and an unwritten finish must keep the table and
the model in step: a job is held exactly while the model says so, in the
model's phase, heartbeated exactly while held (and, once settled, until a
heartbeat found it lost), an outcome is written only for a body that has
ended, and an attempt's move never touches another attempt of the same job.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from leasejobs.db.store import Attempt, Outcome
from leasejobs.worker.held import HeldJob, HeldJobs, Phase

JOB_IDS = st.integers(min_value=1, max_value=4)
DONE = Outcome(status="done")


def held_job(job_id: int, attempt: int) -> HeldJob:
    return HeldJob(
        key=Attempt(job_id, attempt),
        task_name="t",
        queue="q",
        args="[]",
        kwargs="{}",
        task=None,
        max_attempts=5,
        runs=1,
        counted=True,
        taken_over=attempt > 1,
        lease_seconds=30,
        worker_id="w",
    )


class HeldJobsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = HeldJobs()
        self.jobs: dict[Attempt, HeldJob] = {}  # every attempt ever claimed
        self.phase: dict[Attempt, Phase] = {}  # the model
        self.beating: dict[Attempt, bool] = {}
        #: STOPPING attempts whose outcome is "give the lease back".
        self.to_give_back: set[Attempt] = set()
        self.attempts: dict[int, int] = {}

    def _pick(self, data: st.DataObject) -> Attempt | None:
        if not self.jobs:
            return None
        return data.draw(st.sampled_from(sorted(self.jobs, key=lambda k: (k.id, k.attempt))))

    @rule(job_id=JOB_IDS, refused=st.booleans())
    def claim(self, job_id: int, refused: bool) -> None:
        attempt = self.attempts.get(job_id, 0) + 1
        self.attempts[job_id] = attempt
        job = held_job(job_id, attempt)
        self.jobs[job.key] = job
        self.table.add([job])
        self.phase[job.key] = Phase.ASSIGNED
        self.beating[job.key] = True
        if refused:  # a row that cannot run is settled at once, its body never started
            assert self.table.settle(job, Outcome(status="failed"), started=False)
            self.phase[job.key] = Phase.SETTLED
            assert not job.started

    @rule(data=st.data())
    def body_ended(self, data: st.DataObject) -> None:
        """A child reports the body's end: only an ASSIGNED attempt settles so."""
        key = self._pick(data)
        if key is None:
            return
        ok = self.table.settle(self.jobs[key], DONE, started=True)
        assert ok == (self.phase.get(key) is Phase.ASSIGNED)
        if ok:
            self.phase[key] = Phase.SETTLED
            assert self.jobs[key].started

    @rule(data=st.data(), give_back=st.booleans())
    def stop(self, data: st.DataObject, give_back: bool) -> None:
        """A timeout decides the outcome (or the grace ended: give back) while the body still runs."""
        key = self._pick(data)
        if key is None:
            return
        ok = self.table.stop(self.jobs[key], None if give_back else Outcome(status="queued"), "why")
        assert ok == (self.phase.get(key) is Phase.ASSIGNED)
        if ok:
            self.phase[key] = Phase.STOPPING
            if give_back:
                self.to_give_back.add(key)

    @rule(data=st.data())
    def stopped(self, data: st.DataObject) -> None:
        """The stopped body is gone: its decided outcome is written now, or its lease given back."""
        key = self._pick(data)
        if key is None:
            return
        ok = self.table.stopped(self.jobs[key], started=True)
        assert ok == (self.phase.get(key) is Phase.STOPPING)
        if ok:
            if key in self.to_give_back:
                del self.phase[key]
            else:
                self.phase[key] = Phase.SETTLED
                assert self.jobs[key].outcome is not None

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        settled = sorted(
            (k for k, p in self.phase.items() if p is Phase.SETTLED), key=lambda k: (k.id, k.attempt)
        )
        if not settled:
            return
        key = data.draw(st.sampled_from(settled))
        self.table.finished([self.jobs[key]])
        del self.phase[key]

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        """Found lost: an attempt whose outcome is not decided goes; a settled one waits for its finish."""
        key = self._pick(data)
        if key is None:
            return
        phase = self.phase.get(key)
        marked_before = self.jobs[key].ctx.lease_lost
        ok = self.table.drop(self.jobs[key])
        assert ok == (phase in (Phase.ASSIGNED, Phase.STOPPING))
        if phase is Phase.SETTLED:
            self.beating[key] = False
            assert self.jobs[key].ctx.lease_lost == marked_before, "its finish decides, not the drop"
        elif ok:
            del self.phase[key]
            assert self.jobs[key].ctx.lease_lost

    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        """A job never started (or whose body is gone) is released at a stop."""
        key = self._pick(data)
        if key is None:
            return
        ok = self.table.give_back(self.jobs[key])
        assert ok == (self.phase.get(key) in (Phase.ASSIGNED, Phase.STOPPING))
        if ok:
            del self.phase[key]

    @rule(data=st.data(), lost=st.booleans())
    def unwritten(self, data: st.DataObject, lost: bool) -> None:
        """The finish refused (stale) or could not store the outcome: only a settled attempt ends so."""
        key = self._pick(data)
        if key is None:
            return
        lost_before = self.table.counts["lost_leases"]
        ok = self.table.unwritten(self.jobs[key], lost=lost)
        assert ok == (self.phase.get(key) is Phase.SETTLED)
        assert self.table.counts["lost_leases"] == lost_before + (ok and lost)
        if ok:
            del self.phase[key]
            assert not lost or self.jobs[key].ctx.lease_lost

    @invariant()
    def heartbeats_cover_exactly_the_live_attempts(self) -> None:
        beat = {j.key for j in self.table.to_beat()}
        assert beat == {k for k in self.phase if self.beating.get(k, True)}

    @invariant()
    def the_table_holds_what_the_model_holds(self) -> None:
        assert len(self.table) == len(self.phase)
        for key, phase in self.phase.items():
            held = self.table.get(key)
            assert held is self.jobs[key] and held.phase is phase
        for key in set(self.jobs) - set(self.phase):
            assert self.table.get(key) is None

    @invariant()
    def an_outcome_is_to_be_written_only_once_its_body_has_ended(self) -> None:
        for key, phase in self.phase.items():
            if phase is Phase.SETTLED:
                assert self.jobs[key].outcome is not None


HeldJobsMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_held_jobs_follow_the_model = HeldJobsMachine.TestCase


def test_a_claimed_row_becomes_the_held_job_of_its_fields():
    """``Claimer._held_job`` builds a ``HeldJob`` by position: each field lands in its own name."""
    from types import SimpleNamespace

    from leasejobs.db.store import ClaimedRow
    from leasejobs.worker.claimer import Claimer

    row = ClaimedRow(
        id=11, task_name="no.such.task", args="[1]", kwargs='{"k": 2}', attempt=3, runs=4,
        max_attempts=5, queue="q", ended=None, last_error="", counted=True, taken_over=False,
        waited=6.5, trace_context='{"t": 1}', snoozes=7, retry_policy='{"r": 1}', slots=8,
        bytes=9, priority=10, run_at="2026-12-04 00:00:00+00",
    )  # fmt: skip
    claimer = Claimer.__new__(Claimer)
    claimer._tasks = {}
    claimer.lease_seconds = 30.0
    claimer.store = SimpleNamespace(worker_id="w")
    job = claimer._held_job(row, claimed_at=100.0, seconds=0.5)
    assert job.key == Attempt(11, 3)
    for name in (
        "task_name", "queue", "args", "kwargs", "max_attempts", "runs", "counted", "taken_over",
        "waited", "trace_context", "retry_policy", "snoozes", "slots", "bytes",
    ):  # fmt: skip
        assert getattr(job, name) == getattr(row, name), name
    assert (job.task, job.lease_seconds, job.worker_id) == (None, 30.0, "w")
    assert (job.claimed_at, job.lease_ends) == (100.0, 129.5)
