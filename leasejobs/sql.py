"""Every statement leasejobs runs against the queue, by name.

Claim, heartbeat, finish and release run on the worker's own psycopg
connections; enqueue and the side-effect fence run on Django's connection so
they join the caller's transaction. All of them are single statements with
bound parameters (nothing is ever formatted into the SQL text) and all
timestamps come from the database clock (``now()``): worker clocks never
decide who holds a lease.

The fencing rule, in one sentence: every write made on behalf of an attempt
matches the row on ``id AND attempt = <token> AND leased_by = <worker> AND
status = 'running'``, so once another claim has bumped ``attempt`` (or the
job left ``running``, or another worker holds it) the stale attempt's write
matches nothing.

Heartbeat, finish and release must find each of their rows by primary key,
whatever the table's statistics say: those lag behind a burst of enqueued
jobs (autovacuum analyzes up to a minute later), and the planner then
believes almost no row is running. With a plain join on ``status =
'running'`` it walked the whole claim index for every batch (18 ms instead of
2.5 ms to finish 100 jobs with 50,000 queued), or scanned the whole table.
So each looks its rows up in a LATERAL subquery, one primary-key probe per
id (the FOR UPDATE or LIMIT in it keeps the planner from flattening it into
a join), and tests the status as ``status IS NOT DISTINCT FROM 'running'``:
the same test, as the column is NOT NULL, but one the planner cannot match to
the claim index's predicate (``status IN ('queued', 'running')``), so the
primary key is the only index left for the probe.
"""

# -- enqueue -----------------------------------------------------------------

#: Insert one job. A repeated idempotency key inserts nothing (the caller then
#: reads the existing job). Workers are woken by a NOTIFY carrying the queue
#: name, delivered when the caller's transaction commits; a job scheduled for
#: later sends none (the workers' poll finds it when it is due).
#:
#: ``delay`` counts from this statement (``statement_timestamp()``), not from
#: the start of the caller's transaction (``now()``): enqueued late in a long
#: transaction, a job with ``delay=1`` must still wait a second.
#:
#: The NOTIFY is a ``RETURNING`` expression, so it runs only for a row that was
#: inserted: one plain INSERT, where a CTE around it cost about a sixth of a
#: single enqueue (planning and running the extra nodes).
ENQUEUE = """
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
    '', false, %(idempotency_key)s, '', '[]', '[]', statement_timestamp(), %(trace_context)s::jsonb,
    0, %(retry_policy)s::jsonb,
    %(concurrency_key)s, %(concurrency_limit)s
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, run_at, created_at,
    CASE WHEN run_at <= statement_timestamp() THEN pg_notify(%(channel)s, %(queue)s)::text END
"""

#: ``ENQUEUE`` for the common job: no idempotency key, due now, no
#: concurrency key, no retry policy of its own, no trace context. The same
#: row, with the options it does not use left to their NULL defaults; it is
#: due, so the NOTIFY is unconditional. Django binds client-side, so
#: PostgreSQL parses and plans each enqueue's text anew: this one costs about
#: half of ``ENQUEUE``'s, a fifth of a single enqueue.
ENQUEUE_PLAIN = """
INSERT INTO leasejobs_job (
    task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
    run_at, leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
)
VALUES (
    %(task_name)s, %(queue)s, %(priority)s, %(args)s, %(kwargs)s, 'queued', 0, %(max_attempts)s,
    statement_timestamp(), '', false, '', '[]', '[]', statement_timestamp(), 0
)
RETURNING id, run_at, created_at, pg_notify(%(channel)s, %(queue)s)::text
"""

#: Insert many jobs of one task with the same options in one statement, in
#: input order. ``calls`` is one JSON document, ``[[args, kwargs], ...]``:
#: PostgreSQL parses it in C, where adapting one array element at a time in
#: Python cost more than the insert itself. The options are bound once. No
#: idempotency key (a bulk enqueue cannot share one), so no conflict to
#: handle. One NOTIFY for the queue if the jobs are due. All rows share one
#: trace context (the bulk enqueue's span), or none.
#:
#: One row comes back: the ids in input order (they are drawn in the order the
#: rows are inserted), and the run_at and created_at every row shares (both
#: are fixed for the statement). A row per job with its two timestamps cost
#: the client about a fifth of a bulk enqueue to read.
BULK_ENQUEUE = """
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
           '', false, NULL, '', '[]', '[]', statement_timestamp(), %(trace_context)s::jsonb,
           0, %(retry_policy)s::jsonb,
           %(concurrency_key)s, %(concurrency_limit)s
    FROM jsonb_array_elements(%(calls)s::jsonb) WITH ORDINALITY AS c(call, ord)
    ORDER BY c.ord
    RETURNING id, run_at, created_at
),
notified AS (
    SELECT pg_notify(%(channel)s, %(queue)s)
    WHERE EXISTS (SELECT 1 FROM inserted WHERE run_at <= statement_timestamp())
)
SELECT array_agg(i.id ORDER BY i.id), min(i.run_at), min(i.created_at), (SELECT count(*) FROM notified)
FROM inserted AS i
"""

#: The places of a concurrency key's limit (1..limit), made when a job with
#: that key is enqueued (only then: jobs without a key run no such statement).
#: Existing places are kept; a higher limit adds the missing ones.
KEY_SLOTS = """
INSERT INTO leasejobs_slot (kind, name, n)
SELECT 'key', %(key)s, n FROM generate_series(1, %(limit)s) AS n
ON CONFLICT (kind, name, n) DO NOTHING
"""

# -- claim -------------------------------------------------------------------

#: What a claim writes to each row ``p`` it took: a new attempt holding a
#: fresh lease, or the end of a job that must not run again (``p.ended``).
#: ``p.counted``: its run counts now. Shared by ``CLAIM`` and ``CLAIM_LIMITED``.
_CLAIM_SET = """
        status       = COALESCE(p.ended, 'running'),
        attempt      = CASE WHEN p.ended IS NULL THEN j.attempt + 1 ELSE j.attempt END,
        runs         = CASE WHEN p.ended IS NULL AND p.counted THEN j.runs + 1 ELSE j.runs END,
        lease_until  = CASE WHEN p.ended IS NULL
                            THEN clock_timestamp() + make_interval(secs => COALESCE(
                                (%(task_leases)s::jsonb ->> j.task_name)::float8,
                                %(lease_seconds)s)) END,
        leased_by    = CASE WHEN p.ended IS NULL THEN %(worker_id)s ELSE j.leased_by END,
        heartbeat_at = CASE WHEN p.ended IS NULL THEN clock_timestamp() ELSE j.heartbeat_at END,
        started_at   = CASE WHEN p.ended IS NULL THEN clock_timestamp() ELSE j.started_at END,
        finished_at  = CASE WHEN p.ended IS NULL THEN NULL ELSE clock_timestamp() END,
        worker_ids   = CASE WHEN p.ended IS NULL
                            THEN j.worker_ids || to_jsonb(%(worker_id)s::text) ELSE j.worker_ids END,
        last_error   = CASE p.ended
                            WHEN 'failed' THEN 'lease expired on the last run (' || j.runs || ' of '
                                 || j.max_attempts || '): worker ' || j.leased_by
                                 || ' stopped heartbeating'
                            WHEN 'cancelled' THEN 'cancelled: its worker ' || j.leased_by
                                 || ' stopped before the job ended'
                            ELSE j.last_error END
"""

#: Claim up to ``limit`` jobs for this worker in one statement.
#:
#: Claimable: queued and due, or running with an expired lease (its worker
#: died, hung or was paused). SKIP LOCKED lets many workers claim at once
#: without waiting on each other; the order is priority, then run_at, then id,
#: served by the partial index ``leasejobs_job_claim``.
#:
#: The walk is bounded by the clock: each priority of queued and running
#: jobs (``levels``, a skip scan of the index) is walked on its own from its
#: oldest job up to ``run_at <= now``, never into the jobs scheduled later,
#: which sit after the due ones of their priority. One walk of the whole
#: index read all of those at every claim that found fewer due jobs than its
#: limit, which is every claim of a worker keeping up: 200,000 jobs due
#: tomorrow made each claim read 5,300 pages (60 ms). A running job's
#: ``run_at`` is never later than its claim (nothing in leasejobs writes one
#: later; a hand-written UPDATE could, and would hide that job's expired
#: lease until then), so an expired lease is still found inside the bound.
#: Each priority in use costs one probe and a few pages per claim, even when
#: it holds only jobs scheduled later: at most 201 (``PRIORITY_RANGE``).
#:
#: A claim bumps ``attempt`` (the fencing token) and stamps the lease from
#: the database clock at the moment the rows were locked
#: (``clock_timestamp()``, not the statement's start, which may have waited
#: on a lock); a task's own lease (``task_leases``, a JSON object of task
#: name to seconds) wins over the worker's. The commit is forced synchronous
#: (``set_config(..., true)`` lasts this transaction only): a claim lost in a
#: crash after the worker was told it holds the job would let a second worker
#: claim the same token.
#:
#: ``runs`` counts attempts whose body started; it is what ``max_attempts``
#: limits (a snooze takes its run back). The first ``counted`` rows, in claim
#: order, go to idle runners and start at once, so they count now; the rest
#: wait in the worker's prefetch buffer and count when they start (their
#: finish, or ``MARK_STARTED``). Rows come back ``ended`` instead of claimed
#: when they must not run again: ``'failed'`` for an expired lease with no
#: runs left (a job that kills its worker cannot loop forever),
#: ``'cancelled'`` when a cancel is pending (the worker that held it died
#: before it could end it).
#:
#: ``job_id`` (None for workers) claims that one job only: ``leasejobs.testing.run_job``.
#:
#: Due means by this statement's time (``statement_timestamp()``, which a
#: worker's one-statement transaction shares with ``now()``): a job enqueued
#: inside a long transaction is stamped with its statement's time, and
#: ``leasejobs.testing`` claims inside the test's own transaction.
#:
#: The rows come back in claim order (an UPDATE's RETURNING has none), so a
#: worker that claims many at once still starts them in priority order. The
#: worker's claim connection turns sequential and bitmap scans off, so this
#: is always a walk of the partial index that stops after ``limit`` rows,
#: whatever the table's statistics say (see ``leasejobs.store``).
#: ``waited`` (seconds from ``run_at`` to the claim, database clock) and
#: ``trace_context`` feed the queue-time metric and the attempt's span.
#:
#: Queue controls: this claim leaves alone every job with a concurrency key
#: and every job of a paused or limited queue (read from ``leasejobs_queue``
#: once per statement, so a pause applies to the very next claim); those
#: are ``CLAIM_LIMITED``'s. With no queue row and no key, this is the claim
#: it always was, plus one look at an empty table.
CLAIM = (
    """
WITH RECURSIVE levels(priority) AS (
    -- The priorities of queued and running jobs, highest first: one index probe each.
    (SELECT priority FROM leasejobs_job WHERE status IN ('queued', 'running')
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM leasejobs_job AS j
            WHERE j.status IN ('queued', 'running') AND j.priority < l.priority
            ORDER BY j.priority DESC LIMIT 1)
    FROM levels AS l WHERE l.priority IS NOT NULL
),
picked AS (
    -- No ORDER BY: the levels come highest first and each walk in (run_at, id)
    -- order, so the rows arrive in claim order and the LIMIT stops the walks
    -- (and their locks) at the last row kept.
    SELECT c.* FROM levels AS l CROSS JOIN LATERAL (
        SELECT id, priority, run_at, status = 'running' AS taken_over,
               CASE WHEN cancel_requested THEN 'cancelled'
                    WHEN status = 'running' AND runs >= max_attempts THEN 'failed' END AS ended
        FROM leasejobs_job
        WHERE priority = l.priority
          AND status IN ('queued', 'running')
          AND run_at <= statement_timestamp()
          AND (status = 'queued' OR lease_until < statement_timestamp())
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND (%(job_id)s::bigint IS NULL OR id = %(job_id)s::bigint)
          AND concurrency_key IS NULL
          AND queue <> ALL (ARRAY(SELECT name FROM leasejobs_queue
                                  WHERE paused OR concurrency IS NOT NULL OR rate_count IS NOT NULL))
        ORDER BY run_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE l.priority IS NOT NULL
    LIMIT %(limit)s
),
counted AS (
    -- The first rows in claim order: a top-N sort, not a ranking of them all.
    SELECT ARRAY(SELECT id FROM picked ORDER BY priority DESC, run_at, id LIMIT %(counted)s) AS ids
),
ranked AS (
    SELECT p.*, p.id = ANY (c.ids) AS counted FROM picked AS p, counted AS c
),
durable AS (
    SELECT set_config('synchronous_commit', 'on', true) AS setting
),
claimed AS (
    UPDATE leasejobs_job AS j SET
"""
    + _CLAIM_SET
    + """    FROM ranked AS p
    WHERE j.id = p.id AND (SELECT setting FROM durable) IS NOT NULL  -- once, not per row
    RETURNING j.id, j.task_name, j.args, j.kwargs, j.attempt, j.runs, j.max_attempts,
              j.queue, p.ended, j.last_error, p.counted, p.taken_over, j.priority, j.run_at,
              j.trace_context, j.snoozes, j.retry_policy
)
SELECT id, task_name, args, kwargs, attempt, runs, max_attempts, queue, ended, last_error,
       counted, taken_over, extract(epoch FROM statement_timestamp() - run_at)::float8 AS waited,
       trace_context, snoozes, retry_policy, 0 AS slots
FROM claimed
ORDER BY priority DESC, run_at, id
"""
)

#: Claim up to ``limit`` jobs that a limit governs: jobs of queues with a
#: concurrency or rate limit (not paused), and jobs with a concurrency key.
#: Each such job needs one free place of every limit on it (``leasejobs_slot``:
#: its queue's concurrency, its queue's rate, its key's concurrency).
#:
#: The places are taken in this statement: ``free`` locks the free places of
#: the limits at stake ``FOR UPDATE SKIP LOCKED``. A place another claim is
#: taking right now is locked and skipped; one taken and committed since this
#: statement's snapshot is re-read under the lock (PostgreSQL re-checks a
#: locked row's conditions on its newest version) and is no longer free. So
#: two claims never take one place, whatever the snapshots saw: this is what
#: a count of running rows in a CTE cannot give (PgQueuer #761).
#:
#: Candidates are ranked within each limit in claim order, free places are
#: numbered within each limit, and the k-th candidate of a limit gets its
#: k-th free place; a job runs only if it got a place of every limit on it.
#: Candidates come only from queues and keys that have a free place as this
#: snapshot sees it (``open``, the key test), so a queue or a key at its
#: limit never fills the candidates and starves the others.
#:
#: A concurrency or key place is held until the attempt's lease runs out
#: (``held_until`` = ``lease_until``, renewed by each heartbeat) unless its
#: finish or release frees it first; a rate place is held for the rate window
#: from its claim, so any window of that length holds at most N claims. As
#: in ``CLAIM``, the first ``counted`` rows go to idle runners and count their
#: run now; the others wait behind the worker's short prefetch buffer.
CLAIM_LIMITED = (
    """
WITH ctl AS (
    SELECT name, concurrency, rate_count, rate_seconds
    FROM leasejobs_queue
    WHERE NOT paused AND (concurrency IS NOT NULL OR rate_count IS NOT NULL)
      AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
),
paused AS (
    SELECT name FROM leasejobs_queue WHERE paused
),
open AS (
    SELECT c.name FROM ctl AS c
    WHERE (c.concurrency IS NULL OR EXISTS (
              SELECT 1 FROM leasejobs_slot AS s
              WHERE s.kind = 'concurrency' AND s.name = c.name AND s.n <= c.concurrency
                AND (s.held_until IS NULL OR s.held_until < now())))
      AND (c.rate_count IS NULL OR EXISTS (
              SELECT 1 FROM leasejobs_slot AS s
              WHERE s.kind = 'rate' AND s.name = c.name AND s.n <= c.rate_count
                AND (s.held_until IS NULL OR s.held_until < now())))
),
candidate AS (
    SELECT j.id, j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at,
           j.status = 'running' AS taken_over,
           CASE WHEN j.cancel_requested THEN 'cancelled'
                WHEN j.status = 'running' AND j.runs >= j.max_attempts THEN 'failed' END AS ended
    FROM leasejobs_job AS j
    WHERE j.status IN ('queued', 'running')
      AND ((j.status = 'queued' AND j.run_at <= statement_timestamp())
           OR (j.status = 'running' AND j.lease_until < statement_timestamp()))
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND (j.queue IN (SELECT name FROM open)
           OR (j.concurrency_key IS NOT NULL
               AND j.queue NOT IN (SELECT name FROM ctl)
               AND j.queue NOT IN (SELECT name FROM paused)))
      AND (j.concurrency_key IS NULL OR EXISTS (
              SELECT 1 FROM leasejobs_slot AS s
              WHERE s.kind = 'key' AND s.name = j.concurrency_key AND s.n <= j.concurrency_limit
                AND (s.held_until IS NULL OR s.held_until < now())))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(scan)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
need AS (
    SELECT c.id, 'concurrency' AS kind, c.queue AS name, q.concurrency AS lim, NULL::float8 AS hold
    FROM candidate AS c JOIN ctl AS q ON q.name = c.queue
    WHERE c.ended IS NULL AND q.concurrency IS NOT NULL
    UNION ALL
    SELECT c.id, 'rate', c.queue, q.rate_count, q.rate_seconds
    FROM candidate AS c JOIN ctl AS q ON q.name = c.queue
    WHERE c.ended IS NULL AND q.rate_count IS NOT NULL
    UNION ALL
    SELECT c.id, 'key', c.concurrency_key, c.concurrency_limit, NULL
    FROM candidate AS c
    WHERE c.ended IS NULL AND c.concurrency_key IS NOT NULL
),
ranked_need AS (
    SELECT n.*, row_number() OVER (PARTITION BY n.kind, n.name
                                   ORDER BY c.priority DESC, c.run_at, c.id) AS rank
    FROM need AS n JOIN candidate AS c ON c.id = n.id
),
free AS (
    SELECT s.kind, s.name, s.n
    FROM leasejobs_slot AS s
    WHERE (s.kind, s.name) IN (SELECT kind, name FROM need)
      AND s.n <= (SELECT max(m.lim) FROM need AS m WHERE m.kind = s.kind AND m.name = s.name)
      AND (s.held_until IS NULL OR s.held_until < now())
    FOR UPDATE SKIP LOCKED
),
free_ranked AS (
    SELECT f.*, row_number() OVER (PARTITION BY f.kind, f.name ORDER BY f.n) AS rank
    FROM free AS f
),
matched AS (
    SELECT r.id, r.kind, r.name, f.n, r.hold
    FROM ranked_need AS r
    LEFT JOIN free_ranked AS f
           ON f.kind = r.kind AND f.name = r.name AND f.rank = r.rank AND f.n <= r.lim
),
granted AS (
    SELECT c.* FROM candidate AS c
    WHERE c.ended IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM matched AS m WHERE m.id = c.id AND m.n IS NULL)
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
chosen AS (
    SELECT g.*, row_number() OVER (ORDER BY g.priority DESC, g.run_at, g.id) <= %(counted)s AS counted
    FROM granted AS g
),
durable AS (
    SELECT set_config('synchronous_commit', 'on', true) AS setting
),
claimed AS (
    UPDATE leasejobs_job AS j SET
"""
    + _CLAIM_SET
    + """    FROM chosen AS p
    WHERE j.id = p.id AND (SELECT setting FROM durable) IS NOT NULL
    RETURNING j.id, j.task_name, j.args, j.kwargs, j.attempt, j.runs, j.max_attempts,
              j.queue, p.ended, j.last_error, p.counted, p.taken_over, j.priority, j.run_at,
              j.trace_context, j.snoozes, j.retry_policy, j.lease_until
),
taken AS (
    UPDATE leasejobs_slot AS s SET
        job_id     = c.id,
        attempt    = c.attempt,
        held_until = CASE WHEN m.hold IS NULL THEN c.lease_until
                          ELSE clock_timestamp() + make_interval(secs => m.hold) END
    FROM matched AS m JOIN claimed AS c ON c.id = m.id
    WHERE c.ended IS NULL AND s.kind = m.kind AND s.name = m.name AND s.n = m.n
    RETURNING s.job_id, s.kind
)
SELECT c.id, c.task_name, c.args, c.kwargs, c.attempt, c.runs, c.max_attempts, c.queue, c.ended,
       c.last_error, c.counted, c.taken_over,
       extract(epoch FROM statement_timestamp() - c.run_at)::float8 AS waited,
       c.trace_context, c.snoozes, c.retry_policy,
       (SELECT count(*) FROM taken AS t WHERE t.job_id = c.id AND t.kind <> 'rate')::int AS slots
FROM claimed AS c
ORDER BY c.priority DESC, c.run_at, c.id
"""
)

#: What ``CLAIM_LIMITED`` may have to do for a worker of these queues: the
#: limited queues that are not paused, and whether concurrency keys are in
#: use (their places are made by the first enqueue with a key). Read about
#: twice a second, not per claim.
LIMITS_APPLY = """
SELECT ARRAY(
    SELECT name FROM leasejobs_queue
    WHERE NOT paused AND (concurrency IS NOT NULL OR rate_count IS NOT NULL)
      AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
), EXISTS (SELECT 1 FROM leasejobs_slot WHERE kind = 'key')
"""

#: Count the run of a claimed job that waited in the prefetch buffer, before
#: its body starts. Only for a job taken over from an expired lease (the
#: case a job that kills its worker keeps coming back as): its run must be
#: on record before the body can kill this worker too. Fenced like every
#: write of an attempt; forced synchronous like the claim.
MARK_STARTED = """
WITH durable AS (SELECT set_config('synchronous_commit', 'on', true) AS setting)
UPDATE leasejobs_job AS j SET runs = j.runs + 1
FROM durable
WHERE j.id = %(id)s AND j.attempt = %(attempt)s AND j.leased_by = %(worker_id)s
  AND j.status = 'running' AND durable.setting IS NOT NULL
RETURNING j.runs
"""

# -- heartbeat ---------------------------------------------------------------

#: Extend the lease of every job this worker holds, in one statement per tick.
#:
#: Each job is matched on id AND attempt AND holder AND running: a row whose
#: attempt moved on, or that another worker holds, is no longer ours
#: (``held`` false: the lease is lost). A row locked by someone else right
#: now (a side-effect transaction of our own job body, or a claim in
#: progress) is skipped, not waited for (``renewed`` false, ``held`` true:
#: try again next tick). Only ``lease_until`` and ``heartbeat_at`` change,
#: and neither is indexed, so this is a HOT update. ``cancel_requested``
#: rides back so a running body can see a cancel.
#:
#: An attempt that holds places under limits (``slots``, from its claim)
#: keeps the job only while it still holds every one of them, unexpired: a
#: holder whose lease ran out (a paused process) has lost its places, maybe
#: to a newer attempt, and must not go on. Its places' ``held_until``
#: follows the renewed lease.
HEARTBEAT = """
WITH held AS (
    SELECT h.id, h.attempt, h.lease_seconds, h.slots
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_seconds)s::float8[],
                %(slots)s::int[])
         AS h(id, attempt, lease_seconds, slots)
),
locked AS (
    SELECT l.id, h.attempt
    FROM held AS h
    CROSS JOIN LATERAL (
        SELECT j.id FROM leasejobs_job AS j
        WHERE j.id = h.id AND j.attempt = h.attempt AND j.leased_by = %(worker_id)s
          AND j.status IS NOT DISTINCT FROM 'running'
          AND (h.slots = 0 OR h.slots <= (
                  SELECT count(*) FROM leasejobs_slot AS s
                  WHERE s.job_id = h.id AND s.attempt = h.attempt AND s.kind <> 'rate'
                    AND s.held_until >= now()))
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS l
),
renewed AS (
    UPDATE leasejobs_job AS j SET
        lease_until  = clock_timestamp() + make_interval(secs => h.lease_seconds),
        heartbeat_at = clock_timestamp()
    FROM locked AS l
    JOIN held AS h ON h.id = l.id AND h.attempt = l.attempt
    WHERE j.id = l.id
    RETURNING j.id, j.attempt, j.cancel_requested, j.lease_until
),
places AS (
    -- Every place of a held attempt, also when its job row is locked right
    -- now (a side-effect block of the body): the row's lease is renewed when
    -- the block commits, but a place left to run out meanwhile would let
    -- another claim take it while this body still runs. A place names its
    -- job and attempt, so a stale attempt renews only its own old place.
    UPDATE leasejobs_slot AS s SET held_until = clock_timestamp() + make_interval(secs => h.lease_seconds)
    FROM held AS h
    WHERE %(slotted)s AND s.job_id = h.id AND s.attempt = h.attempt AND s.kind <> 'rate'
),
unrenewed AS MATERIALIZED (
    -- Only these are probed below (a row locked right now, or no longer
    -- ours): probing every held row and keeping the unrenewed ones is the
    -- plan PostgreSQL picks for the plain outer join.
    SELECT h.* FROM held AS h
    WHERE NOT EXISTS (SELECT 1 FROM renewed AS r WHERE r.id = h.id AND r.attempt = h.attempt)
)
SELECT r.id, r.attempt, true AS renewed, r.cancel_requested, true AS held
FROM renewed AS r
UNION ALL
SELECT u.id, u.attempt, false, COALESCE(still.cancel_requested, false), still.id IS NOT NULL
FROM unrenewed AS u
LEFT JOIN LATERAL (
    SELECT j.id, j.cancel_requested FROM leasejobs_job AS j
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.leased_by = %(worker_id)s
      AND j.status IS NOT DISTINCT FROM 'running'
      AND (u.slots = 0 OR u.slots <= (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.job_id = u.id AND s.attempt = u.attempt AND s.kind <> 'rate'
                AND s.held_until >= now()))
    LIMIT 1
) AS still ON true
"""

# -- finish ------------------------------------------------------------------

#: Write the outcome of many attempts in one statement: done, retry (back to
#: queued, due after ``retry_delay`` seconds of database time), failed or
#: cancelled. A snooze is a retry with ``snoozed`` true: queued, due after
#: its delay, ``snoozes`` + 1, and no error entry. Each row is written only
#: while the attempt still holds the job (id AND attempt AND holder AND
#: running); a retry of a job with a pending cancel is written as cancelled
#: instead. ``run_deltas`` adjusts ``runs``: +1 for the run of an attempt
#: that was not counted at its claim (it waited in the buffer), -1 to take
#: back a counted run that ended in a snooze (a snooze is not a run).
#: ``results`` arrive as JSON text, already checked by the worker.
#: Returns ``(id, attempt, written, status)``: written true for the rows
#: written, with the status written (``cancelled`` for a retry turned into
#: a cancel, so the worker counts and logs what the row says); false, status
#: NULL, for a row that is still this attempt's but locked by another
#: transaction right now (skipped, not waited for, like the heartbeat: one
#: locked row must not hold up every other outcome; the worker tries it
#: again). Any other attempt is not returned: a stale attempt whose outcome
#: is dropped.
#:
#: A written attempt frees the concurrency and key places it holds (matched
#: on job AND attempt, so a stale attempt never frees a newer one's place)
#: and NOTIFYs its queue, so workers waiting on that limit claim at once.
#: ``slotted`` false (no attempt of the batch holds a place) skips that part
#: whole (a one-time filter): a batch of plain jobs does no more than before.
FINISH = """
WITH outcome AS (
    SELECT *
    FROM unnest(
        %(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
        %(results)s::text[], %(last_errors)s::text[], %(error_entries)s::jsonb[],
        %(retry_delays)s::float8[], %(run_deltas)s::int[], %(snoozed)s::boolean[]
    ) AS o(id, attempt, status, result, last_error, error_entry, retry_delay, run_delta, snoozed)
),
locked AS (
    SELECT l.id, o.attempt
    FROM outcome AS o
    CROSS JOIN LATERAL (
        SELECT j.id FROM leasejobs_job AS j
        WHERE j.id = o.id AND j.attempt = o.attempt AND j.leased_by = %(worker_id)s
          AND j.status IS NOT DISTINCT FROM 'running'
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS l
),
written AS (
    UPDATE leasejobs_job AS j SET
        status      = CASE WHEN o.status = 'queued' AND j.cancel_requested THEN 'cancelled'
                           ELSE o.status END,
        result      = o.result::jsonb,
        runs        = GREATEST(0, j.runs + o.run_delta),
        last_error  = COALESCE(o.last_error, j.last_error),
        errors      = CASE WHEN o.error_entry IS NULL THEN j.errors
                           ELSE j.errors || jsonb_build_array(o.error_entry) END,
        run_at      = CASE WHEN o.status = 'queued' AND NOT j.cancel_requested
                           THEN clock_timestamp() + make_interval(secs => o.retry_delay)
                           ELSE j.run_at END,
        finished_at = CASE WHEN o.status = 'queued' AND NOT j.cancel_requested THEN NULL
                           ELSE clock_timestamp() END,
        lease_until = NULL,
        snoozes     = j.snoozes + CASE WHEN o.snoozed THEN 1 ELSE 0 END
    FROM locked AS l
    JOIN outcome AS o ON o.id = l.id AND o.attempt = l.attempt
    WHERE j.id = l.id
    RETURNING j.id, j.attempt, j.queue, j.status
),
freed AS (
    UPDATE leasejobs_slot AS s SET job_id = NULL, attempt = NULL, held_until = NULL
    FROM written AS w
    WHERE %(slotted)s AND s.job_id = w.id AND s.attempt = w.attempt AND s.kind <> 'rate'
    RETURNING w.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM freed) AS q
),
unwritten AS MATERIALIZED (
    -- Only these are probed below: probing every outcome and discarding the
    -- written ones afterwards (the plan PostgreSQL picks for the plain
    -- anti-join) cost a quarter of the statement.
    SELECT o.id, o.attempt FROM outcome AS o
    WHERE NOT EXISTS (SELECT 1 FROM written AS w WHERE w.id = o.id AND w.attempt = o.attempt)
)
SELECT id, attempt, true, status FROM written WHERE (SELECT count(*) FROM woken) >= 0
UNION ALL
SELECT u.id, u.attempt, false, NULL
FROM unwritten AS u
CROSS JOIN LATERAL (
    SELECT 1 FROM leasejobs_job AS j
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.leased_by = %(worker_id)s
      AND j.status IS NOT DISTINCT FROM 'running'
    LIMIT 1
) AS still
"""

#: Give leases back at shutdown: the jobs are queued again and claimable at
#: once (the next claim bumps the token, so this attempt stays fenced off).
#: ``refunds`` takes back the run counted at the claim of a job whose body
#: never started, so a deploy costs no job an attempt. A row locked by
#: another transaction is skipped, so a stuck lock cannot keep the worker
#: from exiting; that lease runs out on its own. Places under limits held by
#: a released attempt are freed, and their queues NOTIFYed.
RELEASE = """
WITH mine AS (
    SELECT l.id, h.refund
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(refunds)s::int[]) AS h(id, attempt, refund)
    CROSS JOIN LATERAL (
        SELECT j.id FROM leasejobs_job AS j
        WHERE j.id = h.id AND j.attempt = h.attempt AND j.leased_by = %(worker_id)s
          AND j.status IS NOT DISTINCT FROM 'running'
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS l
),
released AS (
    UPDATE leasejobs_job AS j SET status = 'queued', lease_until = NULL,
                                  runs = GREATEST(0, j.runs - mine.refund)
    FROM mine
    WHERE j.id = mine.id
    RETURNING j.id, j.attempt, j.queue, j.status
),
freed AS (
    UPDATE leasejobs_slot AS s SET job_id = NULL, attempt = NULL, held_until = NULL
    FROM released AS r
    WHERE %(slotted)s AND s.job_id = r.id AND s.attempt = r.attempt AND s.kind <> 'rate'
    RETURNING r.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM freed) AS q
)
SELECT id, attempt FROM released WHERE (SELECT count(*) FROM woken) >= 0
"""

# -- side effects (Django's connection, inside the job body's transaction) --

#: The fence check: lock the job row (FOR SHARE blocks claims, heartbeats and
#: finishes of it until the side effect commits), read its token, state and
#: holder, and make this transaction's commit synchronous: a side effect
#: acknowledged to the body must not vanish in a crash.
FENCE_CHECK = """
SELECT attempt, status, leased_by, set_config('synchronous_commit', 'on', true)
FROM leasejobs_job WHERE id = %(job_id)s FOR SHARE
"""

#: Renew the lease as the side-effect transaction ends, before it commits.
#: Heartbeats skip the row while the block holds it, so a block longer than
#: the lease would otherwise commit with the lease already run out, and the
#: next claim would take the job over before its finish is written.
#: ``clock_timestamp()``: the transaction began when the block did. The
#: attempt's places under queue or key limits are renewed with it: a place
#: that ran out while its job's lease lives would let one job too many run.
RENEW_LEASE = """
WITH renewed AS (
    UPDATE leasejobs_job SET
        lease_until  = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        heartbeat_at = clock_timestamp()
    WHERE id = %(job_id)s AND attempt = %(attempt)s AND leased_by = %(worker_id)s AND status = 'running'
    RETURNING id, attempt, lease_until
)
UPDATE leasejobs_slot AS s SET held_until = r.lease_until
FROM renewed AS r
WHERE s.job_id = r.id AND s.attempt = r.attempt AND s.kind <> 'rate'
"""

#: Record a side effect unless its key exists. The unique key is the at-most-
#: once guarantee: two transactions racing on one key cannot both insert.
RECORD_SIDE_EFFECT = """
INSERT INTO leasejobs_sideeffect (job_id, key, fencing_token, data, created_at)
VALUES (%(job_id)s, %(key)s, %(fencing_token)s, %(data)s::jsonb, now())
ON CONFLICT (key) DO NOTHING
RETURNING id
"""

# -- admin actions (Django's connection, one statement per action) -----------
#
# Each action is fenced on what the operator saw: every selected row comes
# with the status and attempt shown on the page, and a row is changed only
# while it still has both. A job claimed, finished or re-claimed since the
# page was rendered is left alone and counted as "changed since". None of
# them lowers ``attempt``: it is the fencing token, and a lower one would
# let a stale worker's writes match again.

#: Give a running job's lease back now: queued again, claimable at once (the
#: next claim bumps the token, so the holder's later heartbeat, side effects
#: and finish are all fenced off). Like ``RELEASE``, plus a NOTIFY on commit
#: so idle workers claim it without waiting for their poll.
ADMIN_RELEASE = """
WITH released AS (
    UPDATE leasejobs_job AS j SET status = 'queued', lease_until = NULL
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS s(id, attempt)
    WHERE j.id = s.id AND j.attempt = s.attempt AND j.status = 'running'
    RETURNING j.id, j.attempt, j.leased_by, j.queue
),
freed AS (
    UPDATE leasejobs_slot AS s SET job_id = NULL, attempt = NULL, held_until = NULL
    FROM released AS r
    WHERE s.job_id = r.id AND s.attempt = r.attempt AND s.kind <> 'rate'
),
notified AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT r.id, r.attempt, r.leased_by, (SELECT count(*) FROM notified) FROM released AS r
"""

#: Cancel: a queued job is cancelled at once; a running one gets
#: ``cancel_requested``, which its worker's next heartbeat hands to
#: ``ctx.cancel_requested`` (the worker then ends the job as cancelled).
#: Returns each changed job with the status it had.
ADMIN_CANCEL = """
UPDATE leasejobs_job AS j SET
    status           = CASE WHEN j.status = 'queued' THEN 'cancelled' ELSE j.status END,
    finished_at      = CASE WHEN j.status = 'queued' THEN now() ELSE j.finished_at END,
    cancel_requested = true
FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(attempts)s::int[]) AS s(id, status, attempt)
WHERE j.id = s.id AND j.status = s.status AND j.attempt = s.attempt
  AND j.status IN ('queued', 'running')
RETURNING j.id, j.attempt, j.leased_by, s.status
"""

#: Retry now: a failed or cancelled job is queued again, due now, with room
#: for one more run (``max_attempts`` raised to at least ``runs`` + 1, the
#: runs its bodies started; the attempt itself is never lowered); a
#: queued job scheduled for later becomes due now. NOTIFY on commit wakes the workers of those queues.
ADMIN_RETRY = """
WITH retried AS (
    UPDATE leasejobs_job AS j SET
        status           = 'queued',
        run_at           = CASE WHEN j.status = 'queued' THEN LEAST(j.run_at, now()) ELSE now() END,
        max_attempts     = GREATEST(j.max_attempts, j.runs + 1),
        finished_at      = NULL,
        lease_until      = NULL,
        cancel_requested = false
    FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(attempts)s::int[]) AS s(id, status, attempt)
    WHERE j.id = s.id AND j.status = s.status AND j.attempt = s.attempt
      AND j.status IN ('queued', 'failed', 'cancelled')
    RETURNING j.id, j.attempt, j.leased_by, j.queue
),
notified AS (
    SELECT pg_notify(%(channel)s, queue) FROM (SELECT DISTINCT queue FROM retried) AS q
)
SELECT r.id, r.attempt, r.leased_by, (SELECT count(*) FROM notified) FROM retried AS r
"""

# -- pruning (manage.py leasejobs_prune; Django's connection, one transaction per batch)

#: Lock the next batch of finished jobs older than the cutoff, oldest first,
#: through the partial index ``leasejobs_job_finished``. SKIP LOCKED: a row an
#: operator or the admin is touching right now waits for the next run.
PRUNE_PICK = """
SELECT id FROM leasejobs_job
WHERE status IN ('done', 'failed', 'cancelled') AND finished_at < %(cutoff)s
ORDER BY finished_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

#: Forget the side-effect keys of the picked jobs (only with --side-effects:
#: by default a key outlives its job, so a late retry elsewhere still finds it).
PRUNE_SIDE_EFFECTS = """
DELETE FROM leasejobs_sideeffect WHERE job_id = ANY(%(ids)s::bigint[])
"""

#: Delete the picked jobs. Their remaining side effects are unlinked, not
#: deleted (``ON DELETE SET NULL``): the keys stay used.
PRUNE_JOBS = """
DELETE FROM leasejobs_job WHERE id = ANY(%(ids)s::bigint[])
"""

#: With --side-effects: keys whose job was pruned earlier, older than the cutoff.
PRUNE_ORPHAN_SIDE_EFFECTS = """
DELETE FROM leasejobs_sideeffect
WHERE id IN (
    SELECT id FROM leasejobs_sideeffect
    WHERE job_id IS NULL AND created_at < %(cutoff)s
    ORDER BY id
    LIMIT %(limit)s
)
"""

# -- vacuum (the worker's vacuum thread, its own autocommit connection) -------

#: What the vacuum thread looks at every second, for the job table: its dead
#: and live row versions, from the statistics every backend reports (a
#: second late when it is busy, up to ten when it has gone idle); whether
#: PostgreSQL counts them at all (``track_counts``); how many VACUUMs, manual
#: and automatic, it has had (one that ended since the last look left its
#: remainder in the dead count); and whether a VACUUM of it is running now in
#: this database (another worker's of the same role: others' are visible only
#: to roles that may read all statistics, and SKIP_LOCKED covers them). No
#: row when the table does not exist.
VACUUM_LOOK = """
SELECT pg_stat_get_dead_tuples(t.oid),
       pg_stat_get_live_tuples(t.oid),
       current_setting('track_counts')::boolean,
       pg_stat_get_vacuum_count(t.oid) + pg_stat_get_autovacuum_count(t.oid),
       EXISTS (SELECT FROM pg_stat_progress_vacuum AS p
               WHERE p.relid = t.oid
                 AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database()))
FROM (SELECT to_regclass('leasejobs_job') AS oid) AS t
WHERE t.oid IS NOT NULL
"""

#: Whether this role may VACUUM the job table, as PostgreSQL decides it: the
#: table's owner (or a member of its role, or a superuser), the database's
#: owner, and from PostgreSQL 17 a role granted MAINTAIN. Anyone else's
#: VACUUM is a notice and no work. NULL when the table does not exist.
MAY_VACUUM = """
SELECT pg_has_role(c.relowner, 'USAGE')
       OR pg_has_role(d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
FROM pg_class AS c, pg_database AS d
WHERE c.oid = to_regclass('leasejobs_job') AND d.datname = current_database()
"""

#: Remove the job table's dead row versions, unthrottled (a manual VACUUM has
#: no cost delay). SKIP_LOCKED: when another worker (or autovacuum) is
#: vacuuming it already, PostgreSQL says so in a notice and returns at once,
#: instead of queueing behind it. TRUNCATE false: giving the empty pages at
#: the table's end back to the system takes an ACCESS EXCLUSIVE lock, which
#: would stop every claim and finish meanwhile; autovacuum does that when it
#: can without waiting. It cannot run in a transaction block.
VACUUM = "VACUUM (SKIP_LOCKED, TRUNCATE false) leasejobs_job"
