"""Tasks of the chaos scenarios and the hostile-input tests.

``effect`` is the chaos job: it records one side effect keyed by its job
through ``ctx.side_effect`` and, only when this attempt recorded it, one
``Sent`` row in the same transaction. ``Sent`` has no unique constraint, so a
key with two ``Sent`` rows is a side effect that happened twice: the figure
"duplicates found". The result names the attempt and worker that wrote it, so
a scenario can check that a job's finish came from the attempt that held it.
"""

import time

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
    """``effect``, with its body's start and end noted in a journal (``tests.journal``)."""
    note(path, "S", ctx)
    result = effect.func(ctx, seconds)
    note(path, "E", ctx)
    return result


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
