"""The table of held jobs against a simple model, driven by Hypothesis.

Random interleavings of claim (including a re-claim of a job the worker
still holds an older attempt of), take, settle, timeout, finish, drop,
heartbeat, drop (found lost), unwritten (a refused finish) and stop must
keep the table and the model in step: a job is held exactly while the model
says so, in the model's phase, heartbeated exactly while held and not timed
out (nor found lost once settled), and an attempt's move never touches
another attempt of the same job.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from leasejobs.context import JobContext
from leasejobs.store import Attempt, Outcome
from leasejobs.worker.held import HeldJob, HeldJobs, Phase

JOB_IDS = st.integers(min_value=1, max_value=4)


def held_job(job_id: int, attempt: int) -> HeldJob:
    return HeldJob(
        key=Attempt(job_id, attempt),
        task_name="t",
        queue="q",
        args=[],
        kwargs={},
        task=None,
        max_attempts=5,
        runs=1,
        counted=True,
        taken_over=attempt > 1,
        lease_seconds=30,
        ctx=JobContext(job_id=job_id, attempt=attempt, worker_id="w"),
    )


class HeldJobsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = HeldJobs()
        self.jobs: dict[Attempt, HeldJob] = {}  # every attempt ever claimed
        self.phase: dict[Attempt, Phase] = {}  # the model
        self.beating: dict[Attempt, bool] = {}
        self.buffer: list[Attempt] = []
        self.attempts: dict[int, int] = {}
        self.stopped = False

    def _held(self, phases: tuple[Phase, ...]) -> list[Attempt]:
        return sorted((k for k, p in self.phase.items() if p in phases), key=lambda k: (k.id, k.attempt))

    @rule(job_id=JOB_IDS, refused=st.booleans())
    def claim(self, job_id: int, refused: bool) -> None:
        attempt = self.attempts.get(job_id, 0) + 1
        self.attempts[job_id] = attempt
        job = held_job(job_id, attempt)
        self.jobs[job.key] = job
        if refused:
            self.table.add([], [job])
            assert self.table.settle(job, Outcome(status="failed"))
            self.phase[job.key] = Phase.SETTLED
        else:
            self.table.add([job], [])
            self.phase[job.key] = Phase.BUFFERED
            self.buffer.append(job.key)
        self.beating[job.key] = True

    @precondition(lambda self: self.buffer and not self.stopped)
    @rule()
    def take(self) -> None:
        job = self.table.take()
        expected = self.buffer.pop(0)
        assert job is not None and job.key == expected, "runners take the oldest claim first"
        self.phase[expected] = Phase.RUNNING
        assert self.table.body_ended() == len(self.buffer)

    @rule(data=st.data(), timed_out=st.booleans())
    def settle(self, data: st.DataObject, timed_out: bool) -> None:
        if not self.jobs:
            return
        key = data.draw(st.sampled_from(sorted(self.jobs, key=lambda k: (k.id, k.attempt))))
        ok = self.table.settle(self.jobs[key], Outcome(status="done"), beating=not timed_out)
        expected = self.phase.get(key) in (Phase.BUFFERED, Phase.RUNNING)
        assert ok == expected
        if ok:
            if key in self.buffer:  # a settled job never starts
                self.buffer.remove(key)
            self.phase[key] = Phase.SETTLED
            self.beating[key] = not timed_out

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        settled = self._held((Phase.SETTLED,))
        if not settled:
            return
        key = data.draw(st.sampled_from(settled))
        self.table.finished([self.jobs[key]])
        del self.phase[key]

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        """Lost before its outcome: a settled attempt stays for its finish to decide."""
        if not self.jobs:
            return
        key = data.draw(st.sampled_from(sorted(self.jobs, key=lambda k: (k.id, k.attempt))))
        phase = self.phase.get(key)
        marked_before = self.jobs[key].ctx.lease_lost
        ok = self.table.drop(self.jobs[key])
        assert ok == (phase in (Phase.BUFFERED, Phase.RUNNING))
        if phase is Phase.SETTLED:
            self.beating[key] = False
            assert self.jobs[key].ctx.lease_lost == marked_before, "its finish decides, not the drop"
        elif ok:
            del self.phase[key]
            if key in self.buffer:
                self.buffer.remove(key)
            assert self.jobs[key].ctx.lease_lost

    @rule(data=st.data(), lost=st.booleans())
    def unwritten(self, data: st.DataObject, lost: bool) -> None:
        """The finish refused (stale) or could not store the outcome: only a settled attempt ends so."""
        if not self.jobs:
            return
        key = data.draw(st.sampled_from(sorted(self.jobs, key=lambda k: (k.id, k.attempt))))
        lost_before = self.table.counts["lost_leases"]
        ok = self.table.unwritten(self.jobs[key], lost=lost)
        assert ok == (self.phase.get(key) is Phase.SETTLED)
        assert self.table.counts["lost_leases"] == lost_before + (ok and lost)
        if ok:
            del self.phase[key]
            assert self.jobs[key].ctx.lease_lost

    @rule()
    def stop(self) -> None:
        given_back = self.table.stop_starting()
        expected = [k for k in self.buffer if self.phase.get(k) is Phase.BUFFERED]
        assert sorted(j.key.id * 1000 + j.key.attempt for j in given_back) == sorted(
            k.id * 1000 + k.attempt for k in expected
        )
        for key in expected:
            del self.phase[key]
        self.buffer = [k for k in self.buffer if k in self.phase]
        self.stopped = True

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


HeldJobsMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_held_jobs_follow_the_model = HeldJobsMachine.TestCase
