"""Helpers for testing your own code that enqueues and runs jobs.

- ``enqueued_jobs``, ``assert_enqueued``, ``assert_not_enqueued``: what your
  code put in the queue (queued jobs, due now or later).
- ``run_jobs`` and ``run_job``: run due jobs in the test's own process,
  through the worker's real claim statement, the real side-effect fence and
  the real finish statement, on Django's connection. Arguments come back
  from the database as JSON, exactly as a worker gets them: there is no
  "eager" mode, so a body that only works with the caller's Python objects
  fails here as it would in production.

They work inside a pytest-django ``db`` test (or a ``django.test.TestCase``):
everything, claims and finishes included, happens in the test's transaction
and is rolled back with it. A retry is due after its backoff, on the
database clock, as in production; ``run_job(id)`` runs it at once. With
pytest, the ``job_queue`` fixture (from the plugin in
``leasejobs.pytest_plugin``, registered on install) is this module with the
test database enabled.
"""

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models.functions import Now
from psycopg.pq import TransactionStatus

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.db.rows import effective_lease, encode_json
from leasejobs.db.store import (
    LIMITED_SCAN_FACTOR,
    LIMITED_SCAN_MIN,
    Attempt,
    ClaimedRow,
    FinishRow,
    Outcome,
    claim_params,
    finish_params,
    run_delta,
)
from leasejobs.jobs import registry
from leasejobs.models import UNFINISHED, Job
from leasejobs.worker import body, outcomes

logger = logging.getLogger("leasejobs.testing")

#: The worker id the jobs run by these helpers are claimed under.
WORKER_ID = "leasejobs.testing"

#: Django 6.1 renamed ``transaction.savepoint`` (5.2 and 6.0 have only that name).
_SAVEPOINT = getattr(transaction, "savepoint_create", None) or transaction.savepoint

#: ``run_jobs`` runs at most this many jobs by default: a queue that never
#: empties is a job that enqueues itself.
MAX_JOBS = 10_000


@dataclass(frozen=True)
class RanJob:
    """One attempt run by ``run_jobs``/``run_job``, and what became of it.

    ``outcome``: ``done``, ``retry`` (queued again after a failure),
    ``snoozed``, ``failed`` (retries used up, not retried by the policy, or
    a ``Discard``), ``cancelled``, or ``lost`` (the attempt no longer held
    the job: nothing was written). ``error`` is the line stored as the job's
    ``last_error``; ``exception`` what the body raised, to re-raise it in a
    test that wants its traceback.
    """

    id: int
    task_name: str
    attempt: int
    outcome: str
    result: Any = None
    error: str | None = None
    exception: BaseException | None = None


def _task_name(task: Any) -> str:
    return task if isinstance(task, str) else task.name


def enqueued_jobs(task: Any = None, queue: str | None = None) -> list[Any]:
    """The queued jobs (due now or later), oldest first; of one task and/or queue.

    ``task`` is a task or its name.
    """
    jobs = Job.objects.filter(UNFINISHED, status=Job.Status.QUEUED)
    if task is not None:
        jobs = jobs.filter(task_name=_task_name(task))
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return list(jobs.order_by("id"))


def _as_json(value: Any, what: str) -> Any:
    """``value`` as a job row holds it (tuples become lists...)."""
    return json.loads(encode_json(value, what))


def _matching(
    task: Any, args: Iterable[Any] | None, kwargs: dict[str, Any] | None, queue: str | None
) -> list[Any]:
    want_args = None if args is None else _as_json(list(args), "args")
    want_kwargs = None if kwargs is None else _as_json(dict(kwargs), "kwargs")
    return [
        job
        for job in enqueued_jobs(task, queue)
        if (want_args is None or job.args == want_args) and (want_kwargs is None or job.kwargs == want_kwargs)
    ]


def _describe(task: Any, args: Any, kwargs: Any, queue: str | None) -> str:
    parts = [_task_name(task)]
    if args is not None:
        parts.append(f"args={list(args)!r}")
    if kwargs is not None:
        parts.append(f"kwargs={dict(kwargs)!r}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    return " ".join(parts)


def assert_enqueued(
    task: Any,
    args: Iterable[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
) -> Any:
    """Fail unless a queued job of ``task`` has these arguments (None: any); return it.

    The expected arguments go through JSON first, as the enqueued ones did.
    """
    found = _matching(task, args, kwargs, queue)
    if not found:
        queued = [
            f"{j.task_name}(args={j.args!r}, kwargs={j.kwargs!r}, queue={j.queue!r})" for j in enqueued_jobs()
        ]
        raise AssertionError(
            f"no queued job {_describe(task, args, kwargs, queue)}; queued: {', '.join(queued) or 'none'}"
        )
    return found[0]


def assert_not_enqueued(
    task: Any,
    args: Iterable[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
) -> None:
    """Fail if a queued job of ``task`` has these arguments (None: any)."""
    found = _matching(task, args, kwargs, queue)
    if found:
        raise AssertionError(
            f"{len(found)} queued job(s) {_describe(task, args, kwargs, queue)}: ids {[j.id for j in found]}"
        )


def run_jobs(
    queue: str | Iterable[str] | None = None, until_empty: bool = True, max_jobs: int = MAX_JOBS
) -> list[RanJob]:
    """Run the due jobs (of ``queue``: a name or several) in this process; return what ran.

    One claim for the jobs due, then a body and a finish per job, in claim
    order (priority, then due time, then id). ``until_empty`` goes on with the jobs that become due
    meanwhile (the ones the bodies enqueue, retries without backoff) until
    none is left; else each job due at the call runs once. More than
    ``max_jobs`` is an error (a job that enqueues itself).
    """
    queues = [queue] if isinstance(queue, str) else (None if queue is None else list(queue))
    ran: list[RanJob] = []
    while True:
        # All the due jobs in one claim, as a worker with a prefetch does: a
        # claim per job would walk past every row the test's transaction
        # has already finished (their old versions stay in the index).
        rows = _claim(queues, limit=max(1, max_jobs - len(ran)))
        if not rows:
            return ran
        if len(ran) >= max_jobs:
            raise RuntimeError(
                f"run_jobs ran {max_jobs} jobs and the queue is still not empty: a job enqueues itself? "
                "Use run_jobs(until_empty=False), or a larger max_jobs."
            )
        ran.extend(_run(row) for row in rows)
        if not until_empty:
            return ran


def run_job(job_id: int) -> RanJob:
    """Run the queued job ``job_id`` now, even if it is scheduled later (a delay, a backoff)."""
    # Due by this statement's time; the claim, a later statement, finds it due.
    made_due = Job.objects.filter(pk=job_id, status=Job.Status.QUEUED).update(run_at=Now())
    rows = _claim(None, limit=1, job_id=job_id) if made_due else []
    if not rows:
        status = Job.objects.filter(pk=job_id).values_list("status", flat=True).first()
        raise ValueError(f"job {job_id} cannot run: it is {status or 'not in the table'}, not queued.")
    return _run(rows[0])


def _claim(queues: list[str] | None, limit: int, job_id: int | None = None) -> list[ClaimedRow]:
    """The worker's claim statements, on Django's connection (each claimed job runs at once: counted).

    The plain claim, then (for ``run_jobs``) the claim of jobs under queue or
    key limits, which takes their places as a worker's would.
    """
    params = claim_params(
        limit=limit,
        counted=limit,
        queues=queues,
        lease_seconds=float(conf.get("LEASE_SECONDS")),
        task_leases={n: float(t.lease_seconds) for n, t in registry.all_tasks().items() if t.lease_seconds},
        worker_id=WORKER_ID,
        job_id=job_id,
    )

    def limited(claimed: int) -> dict[str, Any] | None:
        if job_id is not None or claimed >= limit:
            return None
        return {
            **params,
            "limit": limit - claimed,
            "scan": max(limit * LIMITED_SCAN_FACTOR, LIMITED_SCAN_MIN),
        }

    return [ClaimedRow._make(row) for row in facade.testing_claim(params, limited)]


def _finish(key: Attempt, outcome: Outcome, *, started: bool, places: int) -> str | None:
    """The worker's finish statement for one outcome, on Django's connection: the status
    written (a pending cancel turns a retry into ``cancelled``), or None if stale."""
    delta = run_delta(started=started, counted=True, snoozed=outcome.gives_back_run)
    params = finish_params([(key, outcome, delta)], WORKER_ID, slotted=bool(places))
    rows = [FinishRow._make(row) for row in facade.testing_finish(params)]
    return next((row.status for row in rows if row.written), None)


def _run(row: ClaimedRow) -> RanJob:
    """Run one claimed job's body and write its outcome, as a worker's child does
    (through the same ``leasejobs.worker.body.run``)."""
    if row.ended is not None:
        return RanJob(row.id, row.task_name, row.attempt, row.ended, error=row.last_error)
    key = Attempt(row.id, row.attempt)
    task = registry.get(row.task_name)
    lease = effective_lease(task.lease_seconds if task else None, float(conf.get("LEASE_SECONDS")))
    raised: BaseException | None = None
    try:
        ready = body.prepare(
            row,
            row.args or "null",
            row.kwargs or "null",
            worker_id=WORKER_ID,
            lease_seconds=lease,
            places=row.slots,
        )
    except ValueError as exc:
        outcome = outcomes.refusal(str(exc))
        started = False
    else:
        savepoint = _SAVEPOINT() if connections[db_alias()].in_atomic_block else None
        ran = body.run(ready.task, ready.ctx, ready.facts, ready.args, ready.kwargs, None)
        _end_savepoint(savepoint)
        if ran.outcome is None:
            return RanJob(
                row.id, row.task_name, row.attempt, "lost", error=str(ran.raised), exception=ran.raised
            )
        outcome, raised, started = ran.outcome, ran.raised, True
    written = _finish(key, outcome, started=started, places=row.slots)
    if written is None:
        return RanJob(row.id, row.task_name, row.attempt, "lost", error="the job moved on: nothing written")
    if written != outcome.status:
        name = written  # a retry a pending cancel turned into a cancel
    elif outcome.snoozed:
        name = "snoozed"
    elif outcome.suspended:
        name = "suspended"
    else:
        name = "retry" if written == "queued" else written
    logger.info("%s job=%s attempt=%s worker=%s", name, row.id, row.attempt, WORKER_ID)
    value = None if outcome.result is None else json.loads(outcome.result)
    return RanJob(row.id, row.task_name, row.attempt, name, value, outcome.last_error, raised)


def _end_savepoint(savepoint: str | None) -> None:
    """Keep a body's writes, as autocommit would; roll back to before it only if
    it left the transaction aborted (a failed statement), so the test goes on."""
    if savepoint is None:
        return
    connection = connections[db_alias()]
    raw = connection.connection
    if connection.needs_rollback or (
        raw is not None and raw.info.transaction_status == TransactionStatus.INERROR
    ):
        connection.needs_rollback = False
        transaction.savepoint_rollback(savepoint)
    else:
        transaction.savepoint_commit(savepoint)
