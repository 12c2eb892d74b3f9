"""Enqueue: the statements run on Django's connection, in the caller's transaction."""

from leasejobs.db.sql.fragments import announced, keyed_payload

#: Insert one job. A repeated idempotency key inserts nothing (the caller then
#: reads the existing job). Workers are woken by a NOTIFY carrying the queue
#: name and the job's place in claim order (``keyed_payload``), delivered when
#: the caller's transaction commits. A job due within 10 s says it is not due
#: yet, and wakes a worker only if it lies behind its keys (committed after it
#: fell due); one due later sends none (the workers' poll finds it when due).
#:
#: ``delay`` counts from this statement (``statement_timestamp()``), not from
#: the start of the caller's transaction (``now()``): enqueued late in a long
#: transaction, a job with ``delay=1`` must still wait a second.
#:
#: The NOTIFY is a ``RETURNING`` expression, so it runs only for a row that was
#: inserted: one plain INSERT, where a CTE around it cost a good part of a
#: single enqueue (planning and running the extra nodes; docs/performance.md).
ENQUEUE = f"""
INSERT INTO leasejobs_job (
    task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
    run_at, leased_by, cancel_requested, idempotency_key, last_error,
    errors, worker_ids, created_at, trace_context, snoozes, retry_policy,
    concurrency_key, concurrency_limit
)
VALUES (
    %(task_name)s, %(queue)s, %(priority)s, %(args)s::jsonb, %(kwargs)s::jsonb,
    'queued', 0, %(max_attempts)s,
    COALESCE(%(run_at)s::timestamptz, statement_timestamp() + make_interval(secs => %(delay)s)),
    '', false, %(idempotency_key)s, '', NULL, NULL, statement_timestamp(), %(trace_context)s::jsonb,
    0, %(retry_policy)s::jsonb,
    %(concurrency_key)s, %(concurrency_limit)s
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, run_at, created_at,
    CASE WHEN {announced()} THEN pg_notify(%(channel)s, {keyed_payload("%(queue)s")})::text END
"""

#: ``ENQUEUE`` for the common job: no idempotency key, due now, no
#: concurrency key, no retry policy of its own, no trace context. The same
#: row, with the options it does not use left to their NULL defaults; it is
#: due, so the NOTIFY is unconditional. Django binds client-side, so
#: PostgreSQL parses and plans each enqueue's text anew: this one costs about
#: half of ``ENQUEUE``'s, a fifth of a single enqueue.
ENQUEUE_PLAIN = f"""
INSERT INTO leasejobs_job (
    task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
    run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
)
VALUES (
    %(task_name)s, %(queue)s, %(priority)s, %(args)s, %(kwargs)s, 'queued', 0, %(max_attempts)s,
    statement_timestamp(), '', false, '', NULL, NULL, statement_timestamp(), 0
)
RETURNING id, run_at, created_at, pg_notify(%(channel)s, {keyed_payload("%(queue)s", due=True)})::text
"""

#: Insert many jobs of one task with the same options in one statement, in
#: input order. ``calls`` is one JSON document, ``[[args, kwargs], ...]``:
#: PostgreSQL parses it in C, where adapting one array element at a time in
#: Python cost more than the insert itself. The options are bound once. No
#: idempotency key (a bulk enqueue cannot share one), so no conflict to
#: handle. One NOTIFY for the queue if the jobs are due within 10 s, keyed by
#: the first job (the rows share priority and ``run_at``). All rows share one
#: trace context (the bulk enqueue's span), or none.
#:
#: One row comes back: the ids in input order (they are drawn in the order the
#: rows are inserted), and the run_at and created_at every row shares (both
#: are fixed for the statement). A row per job with its two timestamps cost
#: the client about a fifth of a bulk enqueue to read.
BULK_ENQUEUE = f"""
WITH inserted AS (
    INSERT INTO leasejobs_job (
        task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
        run_at, leased_by, cancel_requested, idempotency_key, last_error,
        errors, worker_ids, created_at, trace_context, snoozes, retry_policy,
        concurrency_key, concurrency_limit
    )
    SELECT %(task_name)s, %(queue)s, %(priority)s, c.call -> 0, c.call -> 1,
           'queued', 0, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, statement_timestamp() + make_interval(secs => %(delay)s)),
           '', false, NULL, '', NULL, NULL, statement_timestamp(), %(trace_context)s::jsonb,
           0, %(retry_policy)s::jsonb,
           %(concurrency_key)s, %(concurrency_limit)s
    FROM jsonb_array_elements(%(calls)s::jsonb) WITH ORDINALITY AS c(call, ord)
    ORDER BY c.ord
    RETURNING id, priority, run_at, created_at
),
notified AS (
    SELECT pg_notify(%(channel)s, {keyed_payload("%(queue)s", "f")})
    FROM (SELECT priority, run_at, id FROM inserted WHERE {announced()} ORDER BY id LIMIT 1) AS f
)
SELECT array_agg(i.id ORDER BY i.id), min(i.run_at), min(i.created_at), (SELECT count(*) FROM notified)
FROM inserted AS i
"""

#: The places of a concurrency key's limit (1..limit), made when a job with
#: that key is enqueued (only then: jobs without a key run no such statement).
#: Existing places are kept; a higher limit adds the missing ones.
KEY_PLACES = """
INSERT INTO leasejobs_slot (kind, name, n)
SELECT 'key', %(key)s, n FROM generate_series(1, %(limit)s) AS n
ON CONFLICT (kind, name, n) DO NOTHING
"""
