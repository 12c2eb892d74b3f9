"""Hostile job bodies of review 51 (a): tests/integration/test_review51_a.py.

Each body writes what it did to a journal (``tests.journal``: S start, E end,
T one call to a pretend limited service, F a ``finally`` block that ran), so a
test reads what really ran and when, from every process.
"""

import os
import signal
import subprocess
import sys
import time

from leasejobs import task
from tests.journal import note

#: A helper program a body starts: it calls the pretend service (a ``T`` line) every 50 ms.
_TICKER = """
import sys, time
path, job, attempt, worker, seconds = sys.argv[1:]
end = time.monotonic() + float(seconds)
while time.monotonic() < end:
    with open(path, "a") as f:
        f.write(f"T {job} {attempt} {time.time():.6f} {worker}\\n")
    time.sleep(0.05)
"""


@task(takes_context=True, max_attempts=2)
def gives_up_on_a_program(ctx, path, seconds):
    """The common pattern with a program: start the call, wait for it with a timeout, and
    on attempt 1 give up (``TimeoutExpired``) after 0.3 s without killing it."""
    note(path, "S", ctx)
    proc = subprocess.Popen(
        [sys.executable, "-c", _TICKER, path, str(ctx.job_id), str(ctx.attempt), ctx.worker_id, str(seconds)]
    )
    try:
        proc.wait(timeout=0.3 if ctx.attempt == 1 else None)
    finally:
        note(path, "E", ctx)


@task(takes_context=True, max_attempts=1)
def leaks(ctx, path, mib):
    """Keep ``mib`` MiB more in the process (a cache that only grows); note the process's
    own memory at the start (``M <job> <attempt> <time> <worker> <pid> <bytes>``)."""
    from leasejobs.worker.child import own_memory

    used = own_memory() or 0
    with open(path, "a") as f:
        f.write(f"M {ctx.job_id} {ctx.attempt} {time.time():.6f} {os.getpid()} {used}\n")
    _LEAK.append(bytearray(os.urandom(1)) * (mib * 2**20))


_LEAK: list[bytearray] = []


@task(takes_context=True, max_attempts=1)
def calls(ctx, path, seconds):
    """One call to a service that usually answers at once and sometimes takes ``seconds``."""
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)


def _on_alarm(signum, frame):
    raise TimeoutError("the call took too long (SIGALRM)")


@task(takes_context=True, max_attempts=1)
def times_out_with_an_alarm(ctx, path):
    """The classic ``signal.alarm`` timeout, cancelled only on the path that succeeds: the
    call fails at once (a refused connection), and the alarm stays set."""
    note(path, "S", ctx)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(1)
    raise ConnectionRefusedError("the service refused the connection")


@task(takes_context=True, max_attempts=1)
def innocent(ctx, path, seconds):
    """A neighbour that works for ``seconds`` and returns."""
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)
    return "fine"


def _ticks(path, job_id, attempt, worker_id, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open(path, "a") as f:
            f.write(f"T {job_id} {attempt} {time.time():.6f} {worker_id}\n")
        time.sleep(0.05)


@task(takes_context=True, max_attempts=2)
def gives_up_on_a_native_thread(ctx, path, seconds):
    """The call runs in a thread of the low-level ``_thread`` module (what C extensions'
    own threads look like to ``threading``: invisible), the body gives up on it after 0.3 s
    on its first attempt."""
    import _thread

    note(path, "S", ctx)
    done = _thread.allocate_lock()
    done.acquire()

    def call():
        try:
            _ticks(path, ctx.job_id, ctx.attempt, ctx.worker_id, seconds)
        finally:
            done.release()

    _thread.start_new_thread(call, ())
    try:
        if not done.acquire(timeout=0.3 if ctx.attempt == 1 else -1):
            raise TimeoutError("gave up on the call after 0.3 s")
    finally:
        note(path, "E", ctx)


@task(takes_context=True, max_attempts=3, timeout_seconds=4)
def stubborn_past_timeout(ctx, path, seconds):
    """Call the service every 50 ms for ``seconds``, swallowing ``BodyStopped`` (a bare
    ``except BaseException`` around each call, as retry loops often have)."""
    note(path, "S", ctx)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            note(path, "T", ctx)
            time.sleep(0.05)
        except BaseException:
            continue
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=1)
def sets_a_session_setting(ctx, path, statement):
    """A body that tunes its own connection (``SET statement_timeout`` for a query it
    wants bounded, say) and does not reset it: Django keeps the connection."""
    from django.db import connection

    note(path, "S", ctx)
    with connection.cursor() as cursor:
        cursor.execute(statement)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=1)
def reports_once(ctx, path):
    """An innocent neighbour: a report query of 0.2 s inside its fenced side effect."""
    from django.db import connection

    note(path, "S", ctx)
    with ctx.side_effect(f"report:{ctx.job_id}") as effect, connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.2)")
    note(path, "E", ctx)
    return effect.created


@task(takes_context=True, max_attempts=1)
def forks_and_returns(ctx, path):
    """The classic fork bug: ``if os.fork() == 0: work()`` with no ``os._exit`` after the
    work, so the forked copy returns from the body too, into its child's loop."""
    note(path, "S", ctx)
    if os.fork() == 0:
        time.sleep(0.1)  # the work
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=1)
def cooperative(ctx, path, seconds):
    """Work for ``seconds`` in steps of 20 ms, ending at once when a cancel is requested
    (a ``C`` line: the body saw it), as docs/worker.md says a cancellable body does."""
    note(path, "S", ctx)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ctx.cancel_requested:
            note(path, "C", ctx)
            return "saw the cancel"
        time.sleep(0.02)
    note(path, "E", ctx)
    return "worked to the end"


@task(takes_context=True, max_attempts=2, timeout_seconds=3)
def effect_after_overrun(ctx, path, seconds):
    """Work ``seconds`` (swallowing ``BodyStopped``, as a bare ``except BaseException`` around
    each call does), then record the job's side effect (a ``K`` line if this attempt made it)."""
    note(path, "S", ctx)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.02)
        except BaseException:
            continue
    with ctx.side_effect(f"effect_after_overrun:{ctx.job_id}") as effect:
        if effect.created:
            note(path, "K", ctx)
    note(path, "E", ctx)


@task(takes_context=True, max_attempts=3)
def ticks_long(ctx, path, seconds):
    """Call the pretend service every 50 ms for ``seconds``."""
    note(path, "S", ctx)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        note(path, "T", ctx)
        time.sleep(0.05)
    note(path, "E", ctx)
