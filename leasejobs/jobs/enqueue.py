"""Putting jobs into the queue, through Django's connection.

The insert runs on ``django.db.connection`` so it belongs to the caller's
``transaction.atomic()``: a rolled back transaction leaves no job, and the
NOTIFY that wakes workers is delivered only on commit. Everything a worker
will later trust (JSON arguments, a sane queue, an aware ``run_at``) is
checked here, where the caller can still see the error.
"""

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from django.db import ProgrammingError
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg import errors as pg_errors

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import facade, sql
from leasejobs.db.rows import (
    encode_json,
    encode_payload,
    validate_concurrency_limit,
    validate_key,
    validate_max_attempts,
    validate_priority,
    validate_queue,
)
from leasejobs.models import Job
from leasejobs.observability import tracing


class JobSpec(NamedTuple):
    """Everything needed to insert one job, already validated by ``build``.

    A named tuple, not a frozen dataclass: as immutable, and built several
    times faster, on the path of every ``enqueue()``.
    """

    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    args_json: str
    kwargs_json: str
    queue: str
    priority: int
    max_attempts: int
    run_at: dt.datetime | None
    delay: float
    idempotency_key: str | None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: A ``using(retry=...)`` policy (``RetryPolicy.to_json``), or None.
    retry_policy: dict[str, Any] | None = None


def build(
    task_name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    queue: str,
    priority: int,
    max_attempts: int | None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    retry_policy: dict[str, Any] | None = None,
) -> JobSpec:
    """Validate one job's options and encode its arguments."""
    args, kwargs = list(args), dict(kwargs)  # read once: an iterator has no second pass
    args_json, kwargs_json = encode_payload(task_name, args, kwargs)
    validate_queue(queue)
    validate_priority(priority)
    max_attempts = validate_max_attempts(conf.get("MAX_ATTEMPTS") if max_attempts is None else max_attempts)
    if run_at is not None and delay is not None:
        raise ValueError("give run_at or delay, not both.")
    if run_at is not None and (not isinstance(run_at, dt.datetime) or run_at.utcoffset() is None):
        raise ValueError("run_at must be an aware datetime (with a timezone).")
    seconds = delay.total_seconds() if isinstance(delay, dt.timedelta) else (delay or 0)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError("delay must be a number of seconds or a timedelta, not negative.")
    if idempotency_key is not None:
        validate_key(idempotency_key)
    _check_concurrency(task_name, concurrency_key, concurrency_limit)
    return JobSpec(
        task_name=task_name,
        args=args,
        kwargs=kwargs,
        args_json=args_json,
        kwargs_json=kwargs_json,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        delay=float(seconds),
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
        concurrency_limit=concurrency_limit if concurrency_key is not None else None,
        retry_policy=retry_policy,
    )


def _check_concurrency(task_name: str, key: str | None, limit: int | None) -> None:
    """A concurrency key needs a limit (a whole number of at least 1) to mean anything."""
    if limit is not None:
        validate_concurrency_limit(limit, f"concurrency_limit of {task_name}")
    if key is None:
        return
    validate_key(key, "concurrency_key")
    if limit is None:
        raise ValueError(
            f"{task_name} was given a concurrency_key but has no concurrency_limit: "
            "declare @task(concurrency_limit=N) or pass using(concurrency_limit=N)."
        )


class Call(NamedTuple):
    """One job of a bulk enqueue: its arguments, and both as the JSON pair ``[args,kwargs]``."""

    args: list[Any]
    kwargs: dict[str, Any]
    json: str


def build_many(
    task_name: str,
    calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
    bind: Callable[[list[Any], dict[str, Any], int], None] | None = None,
    **options: Any,
) -> tuple[JobSpec, list[Call]]:
    """``build`` for many calls of one task with the same options: the options, then each call.

    The options are checked once; each call only has its arguments encoded,
    which is what keeps a bulk enqueue of thousands of jobs cheap. Jobs cannot
    share one idempotency key, so a bulk enqueue takes none. ``bind(args,
    kwargs, position)``: raises if a call's arguments do not fit the task.
    """
    if options.get("idempotency_key") is not None:
        raise ValueError("bulk_enqueue cannot share one idempotency_key between jobs.")
    template = build(task_name, [], {}, **options)
    limit = conf.get("MAX_PAYLOAD_BYTES")
    built: list[Call] = []
    for given_args, given_kwargs in calls:
        args, kwargs = list(given_args), dict(given_kwargs)  # read once: an iterator has no second pass
        if bind is not None:
            bind(args, kwargs, len(built))
        args_json, kwargs_json = encode_payload(task_name, args, kwargs, limit)
        built.append(Call(args, kwargs, f"[{args_json},{kwargs_json}]"))
    return template, built


def _jobs(
    spec: JobSpec,
    calls: Iterable[tuple[list[Any], dict[str, Any]]],
    ids: Iterable[int],
    run_at: dt.datetime,
    created_at: dt.datetime,
    trace_context: dict[str, str] | None,
) -> list[Job]:
    """The Jobs a fresh insert made (one per call and id), without reading them back.

    As ``Model.from_db`` builds rows Django reads (saved, in their database),
    and through ``from_db`` itself whenever a ``pre_init`` or ``post_init``
    receiver listens to ``Job``. Otherwise without ``Model.__init__``'s walk
    over the fields and its two signals: a bulk enqueue of 1,000 jobs spent
    more time there than in PostgreSQL.
    """
    shared = {
        "task_name": spec.task_name,
        "queue": spec.queue,
        "priority": spec.priority,
        "status": Job.Status.QUEUED,
        "attempt": 0,
        "max_attempts": spec.max_attempts,
        "runs": 0,
        "run_at": run_at,
        "lease_until": None,
        "leased_by": "",
        "heartbeat_at": None,
        "cancel_requested": False,
        "idempotency_key": spec.idempotency_key,
        "last_error": "",
        "result": None,
        "created_at": created_at,
        "started_at": None,
        "finished_at": None,
        "concurrency_key": spec.concurrency_key,
        "concurrency_limit": spec.concurrency_limit,
        "trace_context": trace_context,
        "snoozes": 0,
        "retry_policy": spec.retry_policy,
        "workflow_id": None,
        "pending_parents": 0,
    }
    alias = db_alias()
    signalled = pre_init.has_listeners(Job) or post_init.has_listeners(Job)
    jobs = []
    for (args, kwargs), job_id in zip(calls, ids, strict=True):
        values = {**shared, "id": job_id, "args": args, "kwargs": kwargs, "errors": [], "worker_ids": []}
        if signalled:
            jobs.append(Job.from_db(alias, _JOB_FIELDS, [values[name] for name in _JOB_FIELDS]))
            continue
        job = Job.__new__(Job)
        job.__dict__.update(values)
        state = job._state = ModelState()
        state.adding = False
        state.db = alias
        jobs.append(job)
    return jobs


#: Job's columns in model order, as ``Model.from_db`` takes them.
_JOB_FIELDS = [f.attname for f in Job._meta.concrete_fields]


def insert(spec: JobSpec) -> Job:
    """Insert one job (or return the job that already has its idempotency key).

    With tracing on, inside a ``send <queue>`` span whose context the job keeps.
    """
    if not tracing.enabled():
        return _insert(spec, None)
    with tracing.enqueue_span(spec.queue, 1) as (span, carrier):
        job = _insert(spec, carrier)
        tracing.set_message_ids(span, [job.id])
        return job


def _insert(spec: JobSpec, trace_context: dict[str, str] | None) -> Job:
    try:
        row = facade.enqueue(*_enqueue_statement(spec, trace_context), _key(spec))
    except ProgrammingError as exc:
        _refuse_unmigrated(exc)
        raise
    if row is None:
        return Job.objects.using(db_alias()).get(idempotency_key=spec.idempotency_key)
    return _jobs(spec, [(spec.args, spec.kwargs)], [row[0]], row[1], row[2], trace_context)[0]


def _enqueue_statement(spec: JobSpec, trace_context: dict[str, str] | None) -> tuple[str, dict[str, Any]]:
    """``ENQUEUE_PLAIN`` for a job that uses none of the options it leaves out, else ``ENQUEUE``."""
    params = {
        "task_name": spec.task_name,
        "queue": spec.queue,
        "priority": spec.priority,
        "args": spec.args_json,
        "kwargs": spec.kwargs_json,
        "max_attempts": spec.max_attempts,
        "channel": conf.get("NOTIFY_CHANNEL"),
    }
    if (
        spec.idempotency_key is None
        and spec.run_at is None
        and not spec.delay
        and spec.concurrency_key is None
        and spec.retry_policy is None
        and trace_context is None
    ):
        return sql.ENQUEUE_PLAIN, params
    params.update(
        run_at=spec.run_at,
        delay=spec.delay,
        idempotency_key=spec.idempotency_key,
        concurrency_key=spec.concurrency_key,
        concurrency_limit=spec.concurrency_limit,
        retry_policy=_policy_json(spec.retry_policy),
        trace_context=None if trace_context is None else encode_json(trace_context, "trace"),
    )
    return sql.ENQUEUE, params


def _key(spec: JobSpec) -> tuple[str, int] | None:
    """The job's concurrency key and limit, whose places are made in the job's transaction."""
    if spec.concurrency_key is None or spec.concurrency_limit is None:
        return None
    return spec.concurrency_key, spec.concurrency_limit


def insert_many(spec: JobSpec, calls: list[Call]) -> list[Job]:
    """Insert one job per call, all with ``spec``'s options, in one statement; in input order."""
    if not calls:
        return []
    (ids, run_at, created_at), trace_context = _insert_rows(spec, calls)
    return _jobs(spec, [(c.args, c.kwargs) for c in calls], ids, run_at, created_at, trace_context)


def insert_many_ids(spec: JobSpec, calls: list[Call]) -> list[int]:
    """``insert_many`` returning only the new jobs' ids, in input order.

    Building a ``Job`` per row is most of a bulk enqueue's Python time; a
    producer that only needs the ids skips it.
    """
    if not calls:
        return []
    (ids, _, _), _ = _insert_rows(spec, calls)
    return ids


def _insert_rows(
    spec: JobSpec, calls: list[Call]
) -> tuple[tuple[list[int], dt.datetime, dt.datetime], dict[str, str] | None]:
    """The new jobs' ids in input order, their run_at and created_at, and the trace context they got."""
    if not tracing.enabled():
        return _insert_many(spec, calls, None), None
    with tracing.enqueue_span(spec.queue, len(calls)) as (span, carrier):
        inserted = _insert_many(spec, calls, carrier)
        tracing.set_message_ids(span, inserted[0])
        return inserted, carrier


def _insert_many(
    spec: JobSpec, calls: list[Call], trace_context: dict[str, str] | None
) -> tuple[list[int], dt.datetime, dt.datetime]:
    try:
        ids, run_at, created_at = _bulk_insert(spec, calls, trace_context)
    except ProgrammingError as exc:
        _refuse_unmigrated(exc)
        raise
    return ids, run_at, created_at


def _bulk_insert(
    spec: JobSpec, calls: list[Call], trace_context: dict[str, str] | None
) -> tuple[list[int], dt.datetime, dt.datetime]:
    ids, run_at, created_at, _ = facade.enqueue_many(
        {
            "task_name": spec.task_name,
            "queue": spec.queue,
            "priority": spec.priority,
            # Each is JSON already (encode_payload): joined, not encoded again.
            "calls": "[" + ",".join([c.json for c in calls]) + "]",
            "max_attempts": spec.max_attempts,
            "run_at": spec.run_at,
            "delay": spec.delay,
            "concurrency_key": spec.concurrency_key,
            "concurrency_limit": spec.concurrency_limit,
            "retry_policy": _policy_json(spec.retry_policy),
            "channel": conf.get("NOTIFY_CHANNEL"),
            "trace_context": None if trace_context is None else encode_json(trace_context, "trace"),
        },
        _key(spec),
    )
    return ids, run_at, created_at


def _refuse_unmigrated(exc: ProgrammingError) -> None:
    """An enqueue before ``migrate`` (or after an upgrade without it): say to run migrate.

    PostgreSQL's own words (``relation "leasejobs_job" does not exist``)
    name a table, not the command that makes it.
    """
    if not isinstance(exc.__cause__, pg_errors.UndefinedTable | pg_errors.UndefinedColumn):
        return
    alias = db_alias()
    command = "python manage.py migrate" + ("" if alias == "default" else f" --database {alias}")
    reason = str(exc.__cause__).strip().splitlines()[0]
    raise ProgrammingError(
        f"The leasejobs tables are missing or out of date in the database {alias!r} ({reason}): "
        f"run `{command}` first."
    ) from exc


def _policy_json(policy: dict[str, Any] | None) -> str | None:
    """A ``using(retry=...)`` policy as the row stores it (``RetryPolicy.to_json``), or None."""
    return None if policy is None else encode_json(policy, "a retry policy")
