"""Django Tasks (``django.tasks``, Django 6.1) the backend tests enqueue.

Listed in LEASEJOBS["TASK_MODULES"] by tests/settings.py only when
``django.tasks`` exists, so Django 5.2 runs never import it. Bodies record
their runs in ``BodyRun`` and fenced receipts in ``Sent``, like the leasejobs
test tasks, through ``leasejobs.current_job()``.
"""

import asyncio
import time

from asgiref.sync import sync_to_async
from django.tasks import TaskContext, task

from leasejobs import current_job
from tests.testapp.models import Sent
from tests.testapp.tasks import _record_run


def _send_once(key: str) -> bool:
    """Send a receipt under the running job's fence; True if this attempt sent it."""
    ctx = current_job()
    assert ctx is not None
    with ctx.side_effect(key) as effect:
        if effect.created:
            Sent.objects.create(job_id=ctx.job_id, key=effect.key, attempt=ctx.attempt)
    return effect.created


@task
def noop(*args, **kwargs):
    return None


@task
async def noop_async(*args, **kwargs):
    return None


@task
def meaning_of_life():
    return 42


@task(takes_context=True)
def task_id(context: TaskContext):
    return context.task_result.id


@task(takes_context=True, lease_seconds=2)
def slow_receipt(context: TaskContext, order_id, first_attempt_seconds):
    """The story's job as a Django Task: slow on its first attempt, one fenced receipt.

    A 2 s lease of its own (a LeaseJobsTask field), far below the worker's 30 s.
    """
    _record_run()
    if context.attempt == 1:
        time.sleep(first_attempt_seconds)
    _send_once(f"django-receipt:{order_id}")
    return {"attempt": context.attempt, "worker_id": context.task_result.worker_ids[-1]}


@task(takes_context=True, max_attempts=3)
def flaky(context: TaskContext, fail_times):
    _record_run()
    if context.attempt <= fail_times:
        raise ValueError(f"failure {context.attempt} of {fail_times}")
    return context.attempt


@task
def always_fails():
    """No max_attempts of its own: the backend's OPTIONS["MAX_ATTEMPTS"] (2) applies."""
    _record_run()
    raise RuntimeError("always fails")


@task
def returns_a_set():
    return {1, 2}


@task(takes_context=True)
async def async_receipt(context: TaskContext, order_id):
    """An async Task: awaits, then records its run and a fenced receipt through sync_to_async."""
    await asyncio.sleep(0.01)
    ctx = current_job()
    assert ctx is not None and ctx.attempt == context.attempt
    await sync_to_async(_record_run)()
    created = await sync_to_async(_send_once)(f"django-async:{order_id}")
    return {"created": created, "job_id": ctx.job_id, "result_id": context.task_result.id}


@task
def forgot_context(context, order_id):
    """Its first parameter is Django's TaskContext, but takes_context=True is missing."""
    return order_id


@task
def steps_and_sleep():
    """A Django Task with durable steps around a durable sleep (issue 31)."""
    ctx = current_job()
    assert ctx is not None
    first = ctx.step("one", lambda: ctx.attempt)
    ctx.sleep("nap", 0)
    return [first, ctx.step("two", lambda: ctx.attempt)]
