"""Tasks of durable steps, sleeps and waits (issue 31) that the tests enqueue.

Each step's function writes a ``Sent`` row (``key`` ``step:<name>``): the
ORM write that must commit with the step's checkpoint, once per job.
"""

import os
import time
from pathlib import Path
from typing import Any

from leasejobs import WaitTimeout, current_job, task
from tests.testapp.models import BodyRun, Sent


def _record_run() -> None:
    ctx = current_job()
    assert ctx is not None
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)


def note(name: str) -> dict[str, Any]:
    """A step's function: one ORM write, and a result naming the attempt that ran it."""
    ctx = current_job()
    assert ctx is not None
    Sent.objects.create(job_id=ctx.job_id, key=f"step:{name}", attempt=ctx.attempt)
    return {"name": name, "attempt": ctx.attempt, "key": ctx.step_key}


@task(takes_context=True)
def three_steps(ctx, pause_after_first=0.0, pid_file=""):
    """Three steps; attempt 1 pauses after the first (and says its pid, to be killed or stopped)."""
    _record_run()
    first = ctx.step("first", note, "first")
    if ctx.attempt == 1 and pause_after_first:
        if pid_file:
            Path(pid_file).write_text(str(os.getpid()))
        time.sleep(pause_after_first)
    second = ctx.step("second", note, "second")
    third = ctx.step("third", note, "third")
    return [first["attempt"], second["attempt"], third["attempt"]]


@task(takes_context=True, max_attempts=1)
def sleeper(ctx, times=3, seconds=0.5):
    """A step and a durable sleep, ``times`` times, with one attempt allowed."""
    _record_run()
    for n in range(times):
        ctx.step(f"before-{n}", note, f"before-{n}")
        ctx.sleep(f"sleep-{n}", seconds)
    return ctx.step("last", note, "last")["attempt"]


@task(takes_context=True)
def waiter(ctx, key, timeout=None):
    """Wait for event ``key``; then one step. A timeout is the result."""
    _record_run()
    try:
        payload = ctx.wait_for("wait", key, timeout=timeout)
    except WaitTimeout as exc:
        return {"timeout": str(exc)}
    ctx.step("after", note, "after")
    return {"payload": payload}


@task(takes_context=True)
def failing_step(ctx, fail_times):
    """A step whose function writes, then fails on its first ``fail_times`` attempts."""
    _record_run()

    def write_then_fail() -> int:
        note("flaky")
        if ctx.attempt <= fail_times:
            raise ValueError(f"step failure {ctx.attempt}")
        return ctx.attempt

    return ctx.step("flaky", write_then_fail)


def _busy(n: int, seconds: float) -> int:
    time.sleep(seconds)
    return n


@task(takes_context=True, max_attempts=1)
def back_to_back_steps(ctx, count, seconds):
    """``count`` steps, each ``seconds`` long inside its fenced transaction, with no gap."""
    _record_run()
    return sum(ctx.step(f"s{n}", _busy, n, seconds) for n in range(count))


@task(takes_context=True)
def ten_steps(ctx):
    """Ten steps that do nothing: the bench's and the cost test's job."""
    return sum(ctx.step(f"s{n}", int, n) for n in range(10))


@task(takes_context=True)
async def async_steps(ctx):
    """An ``async def`` body: two async steps around a durable sleep."""

    async def fetch(n):
        await Sent.objects.acreate(job_id=ctx.job_id, key=f"step:a{n}", attempt=ctx.attempt)
        return n

    first = await ctx.astep("a", fetch, 1)
    await ctx.asleep("nap", 0)
    return first + await ctx.astep("b", fetch, 2)


def chaos_key(job_id: int) -> str:
    """The event ``chaos_steps`` waits for."""
    return f"chaos-steps:{job_id}"


def _chaos_note(name: str) -> int:
    ctx = current_job()
    assert ctx is not None
    Sent.objects.create(job_id=ctx.job_id, key=f"chaos-step:{ctx.job_id}:{name}", attempt=ctx.attempt)
    return ctx.attempt


@task(takes_context=True, max_attempts=50)
def chaos_steps(ctx, seconds):
    """The steps storm's job: two steps, a durable sleep, a wait for its event, a last step.

    The pauses are outside the steps, where kills and pauses land; each step
    writes one ``Sent`` row with its checkpoint and returns its attempt.
    """
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    done = []
    for name in ("a", "b"):
        time.sleep(seconds)
        done.append(ctx.step(name, _chaos_note, name))
    ctx.sleep("nap", seconds)
    payload = ctx.wait_for("event", chaos_key(ctx.job_id))
    time.sleep(seconds)
    done.append(ctx.step("c", _chaos_note, "c"))
    return {"steps": done, "event": payload, "attempt": ctx.attempt, "worker": ctx.worker_id}


@task(takes_context=True)
def steps_only(ctx, key):
    """A step, a durable sleep and a wait, writing no table of the test app (least privilege)."""
    first = ctx.step("first", lambda: ctx.attempt)
    ctx.sleep("nap", 0)
    return [first, ctx.wait_for("wait", key)]
