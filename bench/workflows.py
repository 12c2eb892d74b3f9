"""``leasejobs_bench --workflow N``: a fan-out/fan-in of N no-op jobs against N plain no-op jobs.

The workflow is one root, N - 2 jobs after it, and one callback after all of
those: every edge is settled in a finish (the root's finish makes N - 2
children due at once; each middle job's finish counts down the callback's
parents, on one row shared by every batch). Both runs drain with the same
workers in the same run of the bench, alternating, and are timed the same
way: from the first job's start to the last job's finish (database clock).
"""

import time
from typing import Any

from django.db import transaction

import leasejobs
from bench.run import Bench, _worker_args
from bench.tasks import QUEUE
from leasejobs.conf import db_alias


def _drain_seconds(b: Bench, jobs: int, timeout: float) -> float:
    """Wait until the bench queue's ``jobs`` jobs are done; first start to last finish."""
    deadline = time.monotonic() + timeout
    while True:
        row = b.conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status IN ('failed', "
            "'cancelled')), extract(epoch FROM max(finished_at) - min(started_at)) "
            "FROM leasejobs_job WHERE queue = %s",
            [QUEUE],
        ).fetchone()
        assert row is not None
        if int(row[1]):
            raise RuntimeError(f"{row[1]} bench jobs failed or were cancelled")
        if int(row[0]) == jobs:
            return float(row[2] or 0)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{jobs - int(row[0])} bench jobs still unfinished after {timeout:.0f} s")
        time.sleep(0.2)


def _one(b: Bench, jobs: int, workers: int, args: list[str], graph: bool, timeout: float) -> float:
    """One drain of ``jobs`` no-op jobs, as a fan-out/fan-in (``graph``) or plain; jobs per second."""
    noop = b.tasks["noop"]
    b.clear()
    # The bench's database is its own (see Bench): the previous run's edges go
    # whole, with no dead rows left for the next run's settlings to walk.
    b.conn.execute("TRUNCATE leasejobs_workflowedge, leasejobs_workflow")
    with b.workers(workers, args):
        if graph:
            with leasejobs.workflow("bench fan-out/fan-in") as wf:
                root = wf.add(noop)
                middle = [wf.add(noop, after=[root]) for _ in range(jobs - 2)]
                wf.add(noop, after=middle)
        else:
            with transaction.atomic(using=db_alias()):
                for start in range(0, jobs, 5000):
                    noop.bulk_enqueue([((), {})] * min(5000, jobs - start))
        seconds = _drain_seconds(b, jobs, timeout)
    return jobs / seconds if seconds > 0 else float("inf")


def compare(
    b: Bench,
    jobs: int,
    workers: int,
    concurrency: int,
    prefetch: int | None,
    repeat: int,
    timeout: float = 900,
) -> dict[str, Any]:
    """Plain and workflow drains, alternating, ``repeat`` times each; the medians and their ratio."""
    if jobs < 3:
        raise RuntimeError("--workflow needs at least 3 jobs (a root, a middle job and the callback).")
    args = _worker_args(concurrency, prefetch)
    plain: list[float] = []
    graph: list[float] = []
    for _ in range(repeat):
        plain.append(_one(b, jobs, workers, args, False, timeout))
        graph.append(_one(b, jobs, workers, args, True, timeout))
    p, g = sorted(plain)[len(plain) // 2], sorted(graph)[len(graph) // 2]
    return {
        "jobs": jobs,
        "workers": workers,
        "concurrency": concurrency,
        "plain_jobs_per_s": [round(x, 1) for x in plain],
        "workflow_jobs_per_s": [round(x, 1) for x in graph],
        "plain_median": round(p, 1),
        "workflow_median": round(g, 1),
        "ratio": round(g / p, 3) if p else None,
    }


def render(result: dict[str, Any]) -> str:
    return (
        f"fan-out/fan-in of {result['jobs']:,} no-op jobs, {result['workers']} worker(s) x "
        f"c{result['concurrency']}: {result['workflow_median']:,.0f} jobs/s "
        f"(runs {result['workflow_jobs_per_s']}); the same jobs without edges: "
        f"{result['plain_median']:,.0f} jobs/s (runs {result['plain_jobs_per_s']}); "
        f"ratio {result['ratio']:.0%}\n"
    )
