"""Tasks of the workflow tests: each records its run and returns what it saw of its parents."""

import time

from leasejobs import current_job, task
from tests.testapp.models import BodyRun


def _record_run() -> None:
    ctx = current_job()
    assert ctx is not None
    BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)


@task(takes_context=True)
def node(ctx, name, seconds=0.0):
    """A node of a graph: returns its name and its parents' results (keys as text, as JSON has)."""
    _record_run()
    time.sleep(seconds)
    return {"name": name, "parents": {str(k): v for k, v in sorted(ctx.parent_results.items())}}


@task(takes_context=True)
def leaf(ctx, i, seconds=0.0):
    """A parent of a fan-in: returns its number."""
    _record_run()
    time.sleep(seconds)
    return i


@task(takes_context=True)
def gather(ctx):
    """A fan-in's callback: how many parent results it saw, their sum, and the parents without one."""
    _record_run()
    results = ctx.parent_results
    missing = sorted(k for k, v in results.items() if v is None)
    return {"n": len(results), "sum": sum(v for v in results.values() if v is not None), "missing": missing}


@task(max_attempts=1)
def boom():
    """Fails at once, with no retry left."""
    _record_run()
    raise ValueError("boom")


@task(takes_context=True, max_attempts=50)
def storm_leaf(ctx, i, seconds=0.0):
    """A fan-in parent under kills and pauses: enough attempts to outlive the storm."""
    _record_run()
    time.sleep(seconds)
    return i
