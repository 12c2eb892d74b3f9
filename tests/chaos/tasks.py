"""Tasks of the chaos scenarios and the hostile-input tests.

``effect`` is the chaos job: it records one side effect keyed by its job
through ``ctx.side_effect`` and, only when this attempt recorded it, one
``Sent`` row in the same transaction. ``Sent`` has no unique constraint, so a
key with two ``Sent`` rows is a side effect that happened twice: the figure
"duplicates found". The result names the attempt and worker that wrote it, so
a scenario can check that a job's finish came from the attempt that held it.
"""

import ctypes
import os
import resource
import time

from django.db import connection

from leasejobs import task
from tests.journal import note
from tests.testapp.models import BodyRun, Sent

#: The name of a registered task made of the characters that break string-built SQL.
HOSTILE_NAME = "it's %s %(x)s {0} \\'; DROP TABLE leasejobs_job; --"


def effect_key(job_id: int) -> str:
    return f"chaos:{job_id}"


@task(takes_context=True)
def effect(ctx, seconds, first_attempt_seconds=None):
    """Sleep, record the job's one side effect, sleep again, return who finished."""
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    pause = first_attempt_seconds if ctx.attempt == 1 and first_attempt_seconds is not None else seconds
    time.sleep(pause / 2)
    with ctx.side_effect(effect_key(ctx.job_id)) as recorded:
        if recorded.created:
            Sent.objects.create(job_id=ctx.job_id, key=recorded.key, attempt=ctx.attempt)
    time.sleep(pause / 2)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@task(takes_context=True)
def journaled_effect(ctx, path, seconds):
    """``effect``, with its body's start and end noted in a journal (``tests.journal``).

    The start is stamped, then the database is asked whether the attempt
    holds its lease and its concurrency place; the start is noted ``X`` if
    it does not. A worker stopped past its lease between taking the job and
    starting the body runs a body that holds neither (its writes are fenced
    off): the test counts such a body only if its worker was not stopped
    just before it began (then nothing explains it, and that is a problem),
    and, for a stop between the stamp and the question, from the stamp to
    the stop.
    """
    began = time.time()
    note(path, "S" if _holds_lease_and_place(ctx) else "X", ctx, at=began)
    result = effect.func(ctx, seconds)
    note(path, "E", ctx)
    return result


#: One statement, so the lease and the place are judged at one instant (``now()``),
#: with the tests the claim and the heartbeat use (held while not before now).
HOLDS_LEASE_AND_PLACE = """
SELECT EXISTS (SELECT 1 FROM leasejobs_job
               WHERE id = %(job)s AND attempt = %(attempt)s AND leased_by = %(worker)s
                 AND status = 'running' AND lease_until >= now())
   AND EXISTS (SELECT 1 FROM leasejobs_slot
               WHERE job_id = %(job)s AND attempt = %(attempt)s AND kind = 'concurrency'
                 AND held_until >= now())
"""


def _holds_lease_and_place(ctx) -> bool:
    """Whether the database says this attempt holds an unexpired lease and concurrency place."""
    with connection.cursor() as cursor:
        params = {"job": ctx.job_id, "attempt": ctx.attempt, "worker": ctx.worker_id}
        cursor.execute(HOLDS_LEASE_AND_PLACE, params)
        return bool(cursor.fetchone()[0])


@task(name=HOSTILE_NAME, takes_context=True)
def hostile(ctx, key):
    """A task whose name, queue and side-effect key are hostile strings."""
    with ctx.side_effect(key) as recorded:
        return {"key": recorded.key, "created": recorded.created, "queue": ctx.queue}


@task(takes_context=True)
def side_effect_only(ctx, key):
    """Record one side effect and nothing else: what a least-privileged worker may do."""
    with ctx.side_effect(key, data={"attempt": ctx.attempt}) as recorded:
        return recorded.created


# -- the mixed storm (tests/chaos/test_mixed_storm.py) ------------------------------
#
# Each records the job's one side effect as ``effect`` does and returns who
# finished, so the shared ``check`` applies to all of them. Twenty attempts
# allowed: no storm of kills and pauses ends twenty attempts of one job, so
# one of these that fails ran out for another reason.


def _deliver(ctx) -> None:
    with ctx.side_effect(effect_key(ctx.job_id)) as recorded:
        if recorded.created:
            Sent.objects.create(job_id=ctx.job_id, key=recorded.key, attempt=ctx.attempt)


def _started(ctx) -> dict:
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@task(takes_context=True, lease_seconds=1.0, max_attempts=20)
def short_lease(ctx, seconds):
    """A body longer than its task's own 1 s lease (the worker's is longer)."""
    result = _started(ctx)
    time.sleep(seconds / 2)
    _deliver(ctx)
    time.sleep(seconds / 2)
    return result


@task(takes_context=True, lease_seconds=1.5, max_attempts=20)
def long_block(ctx, seconds):
    """A slow external call inside the side-effect block, past the task's 1.5 s lease."""
    result = _started(ctx)
    with ctx.side_effect(effect_key(ctx.job_id)) as recorded:
        time.sleep(seconds)
        if recorded.created:
            Sent.objects.create(job_id=ctx.job_id, key=recorded.key, attempt=ctx.attempt)
    return result


@task(takes_context=True, lease_seconds=2.0, max_attempts=20)
def cancellable(ctx, seconds):
    """Slow on attempt 1 (stops early when cancelled); later attempts deliver at once.

    So a job cancelled while its worker lay dead is delivered by its next
    attempt unless that attempt knows of the cancel from its first line.
    """
    result = _started(ctx)
    deadline = time.monotonic() + (seconds if ctx.attempt == 1 else 0)
    while time.monotonic() < deadline and not ctx.cancel_requested:
        time.sleep(0.05)
    if not ctx.cancel_requested:
        _deliver(ctx)
    return result


@task(takes_context=True, max_attempts=1)
def nul_result(ctx):
    """Delivers, then returns a value PostgreSQL cannot store (a NUL in jsonb): the job fails."""
    result = _started(ctx)
    _deliver(ctx)
    return {**result, "note": "nul \u0000 here"}


# -- hostile bodies (tests/chaos/test_hostile_bodies.py) ----------------------------
#
# On their first attempt these do what a body must never be able to do to
# its worker; later attempts deliver like ``effect``. Twenty attempts, as above.


@task(takes_context=True, lease_seconds=2.0, max_attempts=20)
def gil_hog(ctx, seconds):
    """One C call that holds the GIL for 3 s, past the task's 2 s lease, then the effect."""
    result = _started(ctx)
    ctypes.PyDLL(None).sleep(3)  # libc's sleep, the GIL held (ctypes.PyDLL does not release it)
    time.sleep(seconds)
    _deliver(ctx)
    return result


@task(takes_context=True, max_attempts=20)
def crash_once(ctx, how, seconds):
    """Its first attempt crashes its process (``segfault``, ``exit``) or exhausts its memory
    (``memory``: an address-space limit, then a 1 GiB allocation); later attempts deliver."""
    result = _started(ctx)
    if ctx.attempt == 1:
        if how == "segfault":
            ctypes.string_at(0)
        elif how == "exit":
            os._exit(3)
        elif how == "memory":
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (_address_space() + 64 * 2**20, hard))
            try:
                bytearray(2**30)
            finally:
                resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    time.sleep(seconds)
    _deliver(ctx)
    return result


_kept: list[bytes] = []


@task(takes_context=True, max_attempts=20)
def keeps_memory(ctx, mib, seconds):
    """Leaves ``mib`` MiB behind in its process each run, as a leak does."""
    result = _started(ctx)
    _kept.append(os.urandom(1024) * (mib * 1024))
    time.sleep(seconds)
    _deliver(ctx)
    return result


def _address_space() -> int:
    """This process's virtual memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
