"""Tasks the tests enqueue and their worker processes run.

Bodies record what they did in ``BodyRun`` and ``Sent`` so a test can count
runs and receipts from the database.
"""

import ctypes
import os
import signal
import time

from leasejobs import Discard, LeaseLost, RetryPolicy, Snooze, current_job, task
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
def fails_after_a_cancel(ctx):
    """An operator cancels the job while its body runs; then it fails (a retry, written as the cancel)."""
    from leasejobs.models import Job

    Job.objects.filter(id=ctx.job_id).update(cancel_requested=True)
    raise ValueError("failed after the cancel")


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


@task(max_attempts=1)
def noisy():
    """Fails with quotes, a backslash and a tab in its error: the JSON log must escape them."""
    raise ValueError('he said "hi"\tand left a \\ behind')


# -- the bodies of tests/*/test_worker_guarantees.py (issue 10) -----------------------


def wait_for_file(path: str, timeout: float = 60.0) -> None:
    """Block until the test creates ``path`` (bounded, so a lost test never hangs a worker)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


@task
def until_file(path):
    """Runs until the test creates ``path``: a job that holds its place as long as a test needs."""
    _record_run()
    wait_for_file(path)
    return path


@task(takes_context=True)
def long_effect(ctx, key, seconds):
    """A slow external call made where it belongs: inside the side-effect block."""
    _record_run()
    with ctx.side_effect(key) as effect:
        time.sleep(seconds)
        if effect.created:
            Sent.objects.create(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    return {"created": effect.created}


@task(lease_seconds=2)
def short_lease_sleeper(seconds):
    """A task whose own 2 s lease is far below the worker's."""
    _record_run()
    time.sleep(seconds)
    return seconds


@task(max_attempts=2)
def returns_nul():
    _record_run()
    return "before\u0000after"


@task(max_attempts=2)
def raises_nul():
    _record_run()
    raise ValueError("bad byte \x00 in the message")


@task(takes_context=True)
def effect_after_file(ctx, marker):
    """Waits for ``marker``, then tries its side effect; a LeaseLost is noted, not raised.

    The body returns normally either way, so the worker goes on to write a
    finish: the test sees whether that finish, too, was fenced off.
    """
    _record_run()
    wait_for_file(marker)
    try:
        with ctx.side_effect(f"holder:{ctx.job_id}") as effect:
            if effect.created:
                Sent.objects.create(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    except LeaseLost:
        Sent.objects.create(job_id=ctx.job_id, key="lease-lost", attempt=ctx.attempt)
    return "returned"


@task(takes_context=True)
def raises_after_file(ctx, marker):
    _record_run()
    wait_for_file(marker)
    raise RuntimeError("gave up")


@task(max_attempts=1)
def quick(n):
    """A short job of one attempt: at least 2 ms, so a child holds at most 10 of them ahead."""
    _record_run()
    time.sleep(0.002)
    return n


@task(max_attempts=1)
def raises_forged_line():
    _record_run()
    raise ValueError("first line\nFORGED done job=1 attempt=1 worker=forger")


@task(max_attempts=1)
def big_result(size):
    _record_run()
    return "x" * size


@task(takes_context=True)
def big_effect_data(ctx, size):
    """Records a side effect with ``size`` bytes of data; returns the error it met, if any."""
    _record_run()
    try:
        with ctx.side_effect(f"big:{ctx.job_id}", data="x" * size):
            pass
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


@task(max_attempts=1)
def raises_big(size):
    _record_run()
    raise ValueError("x" * size)


@task(takes_context=True, max_attempts=2)
def fails_first_run(ctx):
    """Fails the first time its body runs, whatever the attempt (claim) number, then succeeds."""
    first = not BodyRun.objects.filter(job_id=ctx.job_id).exists()
    _record_run()
    if first:
        raise ValueError("the first run fails")
    return ctx.attempt


@task(takes_context=True)
def stamp(ctx, seconds=0.0):
    """A periodic test job: returns the tick it was for (after ``seconds`` of work)."""
    time.sleep(seconds)
    return ctx.scheduled_at.isoformat() if ctx.scheduled_at else None


FAST_FIXED = RetryPolicy(fail_on=(KeyError,), backoff="fixed", base_seconds=0.05, jitter=0)


@task(max_attempts=4, retry=FAST_FIXED)
def picky(exc_name):
    """Fails with the named exception every time: KeyError fails at once, others retry."""
    _record_run()
    raise {"KeyError": KeyError, "ValueError": ValueError}[exc_name]("picky")


@task(takes_context=True, max_attempts=2)
def snoozy(ctx, times, seconds=0.05):
    """Snoozes ``times`` times, then finishes with the claim count it reached."""
    _record_run()
    if ctx.attempt <= times:
        raise Snooze(seconds)
    return ctx.attempt


@task
def hopeless(reason):
    _record_run()
    raise Discard(reason)


def _after_takeover(ctx, timeout: float = 60.0) -> None:
    """Attempt 1 waits until another worker runs attempt 2: from then on it is stale."""
    deadline = time.monotonic() + timeout
    while not BodyRun.objects.filter(job_id=ctx.job_id, attempt=ctx.attempt + 1).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no other worker took the job over")
        time.sleep(0.05)


@task(takes_context=True)
def stale_snooze(ctx, later_attempt_seconds):
    """Attempt 1 snoozes once another worker has taken the job over; later attempts finish."""
    _record_run()
    if ctx.attempt == 1:
        _after_takeover(ctx)
        raise Snooze(600)
    time.sleep(later_attempt_seconds)
    return ctx.attempt


@task(takes_context=True)
def stale_discard(ctx, later_attempt_seconds):
    """Attempt 1 discards once another worker has taken the job over; later attempts finish."""
    _record_run()
    if ctx.attempt == 1:
        _after_takeover(ctx)
        raise Discard("attempt 1 gave up")
    time.sleep(later_attempt_seconds)
    return ctx.attempt


@task
def kinds(*args, **kwargs):
    """The Python types the body got: what JSON made of the caller's values."""
    return [type(a).__name__ for a in args] + [f"{k}:{type(v).__name__}" for k, v in sorted(kwargs.items())]


@task(queue="spawn")
def spawner(n):
    """Enqueues its follow-up: run_jobs(until_empty=True) runs both."""
    record.using(queue="spawn").enqueue(n + 1)
    return n


@task
def breaks_its_transaction():
    """A body whose statement fails: the test's transaction must stay usable."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1/0")


# -- the bodies of tests/integration/test_supervised_bodies.py (issue 28) -------------------------------


@task(takes_context=True, timeout_seconds=1)
def overrunning(ctx, path, seconds):
    """Runs past its 1 s timeout on its first attempt, noting when its body starts and truly ends."""
    note(path, "S", ctx)
    try:
        time.sleep(seconds if ctx.attempt == 1 else 0.05)
    finally:
        note(path, "E", ctx)


@task(lease_seconds=2)
def holds_the_gil(seconds):
    """One C call that keeps the GIL for ``seconds``: libc's sleep through ctypes.PyDLL, which
    (unlike ctypes.CDLL) does not release it."""
    _record_run()
    ctypes.PyDLL(None).sleep(int(seconds))
    return seconds


@task(takes_context=True, max_attempts=3)
def erratic(ctx):
    """Kills its own process on its first and third runs, fails politely on its second."""
    earlier = BodyRun.objects.filter(job_id=ctx.job_id).count()
    _record_run()
    if earlier in (0, 2):
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("a polite failure")


@task(takes_context=True)
def ticking(ctx, path, seconds):
    """Calls a (pretend) limited service every 50 ms for ``seconds``: a ``T`` journal line a call."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        note(path, "T", ctx)
        time.sleep(0.05)


@task
def returns_a_coroutine(x):
    """A plain function that returns a coroutine (a wrapper around an async one, say)."""

    async def later():
        return x * 2

    return later()


@task(max_attempts=1)
def calls_exit(code):
    raise SystemExit(code)


@task(max_attempts=2)
def segfaults():
    _record_run()
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@task(max_attempts=2)
def exits_hard(code):
    _record_run()
    os._exit(code)


_kept: list[bytearray] = []


@task
def eats_memory(mib):
    """Allocates ``mib`` MiB and keeps it, as a leak does."""
    _record_run()
    _kept.append(bytearray(os.urandom(1024)) * (mib * 1024))
    return len(_kept)


@task
def measures(blob):
    return len(blob)


@task(takes_context=True)
async def async_receipt(ctx, order_id):
    """An async body with a fenced side effect and a write of its own inside it."""
    async with ctx.aside_effect(f"areceipt:{order_id}") as effect:
        if effect.created:
            await Sent.objects.acreate(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    return effect.created


@task
def forgot_context(ctx, order_id):
    """Its first parameter is the job's context, but takes_context=True is missing."""
    return order_id


@task(takes_context=True, retry=RetryPolicy(backoff="fixed", base_seconds=3, jitter=0))
def fails_once_retried_later(ctx):
    """Fails its first attempt; its retry is due 3 s later."""
    if ctx.attempt == 1:
        raise ValueError("first attempt")
    return ctx.attempt


from tests.testapp import step_tasks  # noqa: E402, F401 (the durable steps' tasks, issue 31)
