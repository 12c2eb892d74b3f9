"""Tasks the tests enqueue and their worker processes run.

Bodies record what they did in ``BodyRun`` and ``Sent`` so a test can count
runs and receipts from the database.
"""

import os
import signal
import time

from leasejobs import current_job, task
from tests.journal import note
from tests.testapp.models import BodyRun, Sent


def _record_run() -> None:
    ctx = current_job()
    assert ctx is not None
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)


@task
def add(a, b):
    return a + b


@task
def record(n):
    _record_run()
    return n


@task(takes_context=True)
def receipt(ctx, order_id, first_attempt_seconds=0.0):
    """The story's job: slow on its first attempt, then one fenced receipt."""
    _record_run()
    if ctx.attempt == 1:
        time.sleep(first_attempt_seconds)
    with ctx.side_effect(f"receipt:{order_id}") as effect:
        if effect.created:
            Sent.objects.create(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    return {"created": effect.created}


@task(takes_context=True)
def naive_receipt(ctx, order_id, first_attempt_seconds=0.0):
    """The same job without fencing: every run sends."""
    _record_run()
    if ctx.attempt == 1:
        time.sleep(first_attempt_seconds)
    Sent.objects.create(job_id=ctx.job_id, key=f"receipt:{order_id}", attempt=ctx.attempt)


@task(takes_context=True)
def flaky(ctx, fail_times):
    _record_run()
    if ctx.attempt <= fail_times:
        raise ValueError(f"failure {ctx.attempt} of {fail_times}")
    return ctx.attempt


@task(takes_context=True)
def slow_first(ctx, seconds):
    """Slow on attempt 1 only; returns the attempt that ran it."""
    _record_run()
    if ctx.attempt == 1:
        time.sleep(seconds)
    return ctx.attempt


@task(max_attempts=2)
def always_fails():
    _record_run()
    raise ValueError("always fails")


@task
def sleeper(seconds):
    _record_run()
    time.sleep(seconds)
    return seconds


@task(max_attempts=2)
def poison():
    """Kills the worker process that runs it, every time."""
    _record_run()
    os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True, timeout_seconds=1.0)
def overruns(ctx, seconds):
    _record_run()
    time.sleep(seconds if ctx.attempt == 1 else 0)
    with ctx.side_effect(f"overruns:{ctx.job_id}") as effect:
        if effect.created:
            Sent.objects.create(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    return ctx.attempt


@task(takes_context=True)
def until_cancelled(ctx, seconds):
    _record_run()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ctx.cancel_requested:
        time.sleep(0.05)
    return "stopped" if ctx.cancel_requested else "finished"


@task(takes_context=True)
def journal(ctx, path, seconds):
    """Note this body's start and end in a journal file (``tests.journal``), sleeping between."""
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)


@task(takes_context=True, concurrency_limit=1)
def export(ctx, path, seconds):
    """One export per account at a time: ``export.using(concurrency_key=f"account:{id}")``."""
    journal.func(ctx, path, seconds)
