"""Durable steps against a model (issue 31): Hypothesis interleaves takeovers with steps
called by the holder and by stale attempts, some of whose functions fail.

After every rule the database must hold exactly the steps the model says:
each stored once, by the attempt that held the job when it ran, with its
function's ORM write committed once; no stale attempt ever stores a step or
calls its function; a failed function leaves nothing.
"""

import itertools
import os

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from leasejobs.db.connection import connection_params
from leasejobs.db.store import WorkerStore
from leasejobs.exceptions import LeaseLost
from leasejobs.jobs.context import JobContext
from leasejobs.models import Step
from tests.testapp.models import Sent
from tests.testapp.step_tasks import three_steps

EXAMPLES = int(os.environ.get("LEASEJOBS_SIMULATION_EXAMPLES", "25"))
NAMES = ("s0", "s1", "s2", "s3")
MAX_ATTEMPTS = 5
EXAMPLE_NUMBERS = itertools.count()


class Failed(Exception):
    """A step's function failing on purpose."""


class StepsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = WorkerStore("m1", heartbeat_timeout=5)
        # A queue of its own: an earlier example's job, its lease run out on a slow
        # machine, would otherwise be the one this claim takes over.
        queue = f"model-{next(EXAMPLE_NUMBERS)}"
        self.job = three_steps.using(queue=queue).enqueue()
        (row,) = self.store.claim(limit=1, counted=1, queues=[queue], lease_seconds=60, task_leases={})
        assert row.id == self.job.id
        self.attempts = [JobContext(job_id=row.id, attempt=row.attempt, worker_id="m1")]
        self.stored: dict[str, int] = {}  # step name: the attempt that stored it
        self.calls: list[tuple[str, int, bool]] = []  # (name, attempt, succeeded)
        self.used: list[set[str]] = [set()]
        self.snapshot: list[dict[str, int] | None] = [None]  # what each attempt read at its first step

    def teardown(self) -> None:
        self.store.close()

    @precondition(lambda self: len(self.attempts) < MAX_ATTEMPTS)
    @rule()
    def take_over(self) -> None:
        worker = f"m{len(self.attempts) + 1}"
        with psycopg.connect(**connection_params(), autocommit=True) as other:
            other.execute(
                "UPDATE leasejobs_job SET attempt = attempt + 1, leased_by = %s WHERE id = %s",
                [worker, self.job.id],
            )
        self.attempts.append(JobContext(job_id=self.job.id, attempt=len(self.attempts) + 1, worker_id=worker))
        self.used.append(set())
        self.snapshot.append(None)

    @rule(which=st.integers(0, MAX_ATTEMPTS - 1), name=st.sampled_from(NAMES), fails=st.booleans())
    def step(self, which: int, name: str, fails: bool) -> None:
        which = min(which, len(self.attempts) - 1)
        ctx = self.attempts[which]
        stale = which != len(self.attempts) - 1

        def fn() -> int:
            self.calls.append((name, ctx.attempt, not fails))
            Sent.objects.create(job_id=ctx.job_id, key=name, attempt=ctx.attempt)
            if fails:
                raise Failed(name)
            return ctx.attempt

        if name in self.used[which]:
            with pytest.raises(ValueError, match="is used twice"):
                ctx.step(name, fn)
            return
        self.used[which].add(name)
        if self.snapshot[which] is None:
            self.snapshot[which] = dict(self.stored)
        seen = self.snapshot[which]
        assert seen is not None
        if name in seen:
            assert ctx.step(name, fn) == seen[name]
        elif stale or ctx.lease_lost:
            calls = len(self.calls)
            with pytest.raises(LeaseLost):
                ctx.step(name, fn)
            assert len(self.calls) == calls, "a stale attempt called a step's function"
        elif fails:
            with pytest.raises(Failed):
                ctx.step(name, fn)
        else:
            assert ctx.step(name, fn) == ctx.attempt
            self.stored[name] = ctx.attempt
            seen[name] = ctx.attempt

    @invariant()
    def the_database_holds_what_the_model_says(self) -> None:
        rows = dict(Step.objects.filter(job_id=self.job.id).values_list("name", "attempt"))
        assert rows == self.stored
        results = dict(Step.objects.filter(job_id=self.job.id).values_list("name", "result"))
        assert results == self.stored  # each result names the attempt that ran it
        written = sorted(Sent.objects.filter(job_id=self.job.id).values_list("key", "attempt"))
        assert written == sorted(self.stored.items()), "a function's write without its checkpoint"
        for name, attempt in self.stored.items():
            assert self.calls.count((name, attempt, True)) == 1
            assert sum(1 for n, _, ok in self.calls if n == name and ok) == 1


@pytest.mark.django_db(transaction=True)
def test_steps_against_the_model():
    run_state_machine_as_test(
        StepsModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
