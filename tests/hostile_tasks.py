"""Hostile job bodies for tests/test_hostile_review.py (a hostile review of the supervised children).

Each body writes what it did to a journal (``tests.journal``: S start, E end,
T one call to a pretend limited service), so a test reads what really ran
and when, from every process, never what the queue believes.
"""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from django.db import transaction

from leasejobs import task
from leasejobs.exceptions import BodyStopped, LeaseLost
from tests.journal import note
from tests.testapp.models import BodyRun


def _publish(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole: a test waits for the file to exist, then reads it,
    and ``write_text`` alone lets it read the empty file between the create and the write."""
    partial = Path(f"{path}.partial")
    partial.write_text(text)
    partial.rename(path)


def _tick_for(path: str, ctx: object, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        note(path, "T", ctx)
        time.sleep(0.05)


@task(takes_context=True, max_attempts=3)
def closes_its_descriptors(ctx, path, seconds):
    """Daemon-style clean-up: close every descriptor above stderr, then call the service a while."""
    note(path, "S", ctx)
    if ctx.attempt == 1:
        os.closerange(3, 65536)
    _tick_for(path, ctx, seconds)
    note(path, "E", ctx)


@task
def forks_a_helper(pidfile, seconds, leave_the_group=False):
    """Leave a helper process behind (a forked background worker, as multiprocessing's fork
    does); ``leave_the_group``: the helper becomes a session of its own, as a daemon does."""
    # The pid is published once the helper is what this says (out of the group): on a
    # loaded machine the helper may not have run at all when the fork returns here.
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            if leave_the_group:
                os.setsid()
            os.close(ready_w)
            time.sleep(seconds)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.read(ready_r, 1)  # end of file once the helper closed its end
    os.close(ready_r)
    _publish(pidfile, str(pid))


@task(takes_context=True, max_attempts=3)
def helper_then_hangs(ctx, path, pidfile, seconds):
    """Fork a helper, then work a while (the test kills this process, as the OOM killer would)."""
    note(path, "S", ctx)
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(seconds)
        finally:
            os._exit(0)
    _publish(pidfile, f"{os.getpid()} {pid}")
    if ctx.attempt == 1:
        time.sleep(seconds)
    note(path, "E", ctx)


@task(takes_context=True, lease_seconds=2, max_attempts=3)
def long_block(ctx, path, seconds):
    """A side-effect block longer than the task's 2 s lease, on a healthy worker."""
    note(path, "S", ctx)
    with ctx.side_effect(f"long_block:{ctx.job_id}") as effect:
        time.sleep(seconds)
    note(path, "E", ctx)
    return effect.created


@task(max_attempts=1)
def quick(n):
    return n


@task(max_attempts=1)
def quiet(n):
    """Returns None: the outcome a child keeps in its slot rather than send at once."""


@task(max_attempts=1)
def dies():
    os._exit(1)


@task(takes_context=True)
def step(ctx, path, seconds):
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=3)
def ticks(ctx, path, seconds):
    note(path, "S", ctx)
    _tick_for(path, ctx, seconds)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=2)
def gives_up_on_a_slow_call(ctx, path, seconds):
    """The common pattern: the call runs in a thread, the body waits for it 0.3 s on its first attempt."""
    note(path, "S", ctx)
    pool = ThreadPoolExecutor(1)
    try:
        pool.submit(_tick_for, path, ctx, seconds).result(timeout=0.3 if ctx.attempt == 1 else None)
    finally:
        note(path, "E", ctx)
        pool.shutdown(wait=False)


@task(max_attempts=3)
def returns_deep(depth):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@task(max_attempts=1)
def returns_big(size):
    return "x" * size


@task(takes_context=True, max_attempts=1)
def leaves_threads(ctx):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    return threading.active_count()


def _stubborn(path: str, ctx: object, seconds: float) -> None:
    """Tick for ``seconds``, swallowing every BodyStopped (a bare ``except BaseException``)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            note(path, "T", ctx)
            time.sleep(0.05)
        except BaseException:
            continue


@task(takes_context=True, max_attempts=3)
def ignores_stops(ctx, path, seconds):
    note(path, "S", ctx)
    _stubborn(path, ctx, seconds)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=3, timeout_seconds=1)
def ignores_stops_past_timeout(ctx, path, seconds):
    note(path, "S", ctx)
    _stubborn(path, ctx, seconds)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=3, timeout_seconds=1)
def blocks_usr1_past_timeout(ctx, path, seconds):
    import signal

    note(path, "S", ctx)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    _tick_for(path, ctx, seconds)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=1)
def hangs(ctx, path, seconds):
    """A call with no timeout that never answers (here: ``seconds``)."""
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)


@task(max_attempts=1)
def terminates_its_subprocess():
    """The usual clean-up of a program a body started: terminate it and wait for it."""
    proc = subprocess.Popen(["sleep", "30"])
    proc.terminate()
    return proc.wait(timeout=5)


class _Unflushable:
    """A replacement stdout whose flush fails (a closed pipe, a logging shim gone wrong)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise OSError("this stream cannot be flushed")


@task(max_attempts=1)
def breaks_its_stdout():
    sys.stdout = _Unflushable()
    sys.stderr = _Unflushable()


@task(takes_context=True, max_attempts=1)
def leaves_a_transaction_open(ctx):
    """Autocommit turned off and never turned back on: the write never commits."""
    transaction.set_autocommit(False)
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)


@task(takes_context=True, max_attempts=1)
def fenced_write(ctx):
    with ctx.side_effect(f"fenced_write:{ctx.job_id}") as effect:
        BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    return effect.created


@task(max_attempts=1)
def raises_lease_lost():
    raise LeaseLost("a body's own LeaseLost, from code of its own")


@task(max_attempts=1)
def raises_body_stopped():
    raise BodyStopped("a body's own BodyStopped, from code of its own")
