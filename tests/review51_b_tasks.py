"""Bodies for tests/integration/test_review51_b.py (hostile review 51, database side)."""

import os
import time

from leasejobs import task
from tests.testapp.models import BodyRun


@task
def naps(seconds):
    time.sleep(seconds)
    return seconds


@task(takes_context=True, concurrency_limit=1)
def naps_once_the_file_exists(ctx, path, seconds):
    """Under a key's limit: record the run, wait for ``path``, sleep durably ``seconds``, return."""
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    while not os.path.exists(path):
        time.sleep(0.02)
    ctx.sleep("nap", seconds)
    return "woke"


@task(takes_context=True, max_attempts=1)
def naps_once(ctx, seconds):
    """One attempt: record the run, sleep ``seconds``, return them."""
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    time.sleep(seconds)
    return seconds
