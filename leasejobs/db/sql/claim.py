"""Claim: the worker's claim connection takes jobs, plain or under queue controls."""

from leasejobs.db.sql.fragments import COUNTER_END, NEVER, seconds_waited
from leasejobs.db.sql.workflows import settle


def _ended(alias: str) -> str:
    """Why a claimable row ends at the claim instead of running (NULL: it runs).

    ``cancelled``: a cancel is pending (its lease ran out first, or it was given
    back unfinished); ``exhausted``: a counter at its end; ``keyless``: a
    concurrency key written by SQL without a limit of at least 1 (both end
    ``failed``); ``failed``: its runs are used up, by an expired
    lease on the last run (a job that kills its worker cannot loop forever)
    or a last run given back with its run counted (a body stopped at the end
    of a stop's grace, a lease released from the admin): at most
    ``max_attempts`` bodies start, whatever ends them.
    """
    a = f"{alias}." if alias else ""
    return f"""CASE WHEN {a}cancel_requested THEN 'cancelled'
                    WHEN {a}attempt >= {COUNTER_END} OR {a}runs >= {COUNTER_END} THEN 'exhausted'
                    WHEN {a}concurrency_key IS NOT NULL AND COALESCE({a}concurrency_limit, 0) < 1
                         THEN 'keyless'
                    WHEN {a}runs >= {a}max_attempts THEN 'failed' END"""


#: What a claim writes to each row ``p`` it took: a new attempt holding a
#: fresh lease, or the end of a job that must not run again (``p.ended``).
#: ``p.counted``: its run counts now. Shared by ``CLAIM`` and ``CLAIM_LIMITED``.
_CLAIM_SET = """
        status       = CASE WHEN p.ended IN ('exhausted', 'keyless') THEN 'failed'
                            ELSE COALESCE(p.ended, 'running') END,
        attempt      = CASE WHEN p.ended IS NULL THEN j.attempt + 1 ELSE j.attempt END,
        runs         = CASE WHEN p.ended IS NULL AND p.counted THEN j.runs + 1 ELSE j.runs END,
        lease_until  = CASE WHEN p.ended IS NULL
                            THEN clock_timestamp() + make_interval(secs => COALESCE(
                                (%(task_leases)s::jsonb ->> j.task_name)::float8,
                                %(lease_seconds)s)) END,
        leased_by    = CASE WHEN p.ended IS NULL THEN %(worker_id)s ELSE j.leased_by END,
        -- NULL until this attempt's first heartbeat (started_at is its claim,
        -- admin.lease.RENEWED_AT): the claim's and the finish's versions carry
        -- no third copy of the claim's time.
        heartbeat_at = CASE WHEN p.ended IS NULL THEN NULL ELSE j.heartbeat_at END,
        started_at   = CASE WHEN p.ended IS NULL THEN clock_timestamp() ELSE j.started_at END,
        finished_at  = CASE WHEN p.ended IS NULL THEN NULL ELSE clock_timestamp() END,
        -- The latest claim's worker is leased_by alone: worker_ids takes the
        -- previous holder only when a new claim replaces it (rows claimed
        -- before migration 0013 already list it), so a job claimed once
        -- writes no worker id twice (71 B of WAL per job, docs/performance.md).
        -- (A hand-written non-array counts as empty: jsonb_array_length
        -- would fail the whole claim on it.)
        worker_ids   = CASE WHEN p.ended IS NULL AND j.leased_by <> ''
                                 AND CASE jsonb_typeof(j.worker_ids)
                                     WHEN 'array' THEN jsonb_array_length(j.worker_ids) ELSE 0 END
                                     < j.attempt
                            THEN COALESCE(j.worker_ids, '[]') || to_jsonb(j.leased_by::text)
                            ELSE j.worker_ids END,
        last_error   = CASE p.ended
                            WHEN 'failed' THEN CASE WHEN j.status = 'running'
                                 THEN 'lease expired on the last run (' || j.runs || ' of '
                                      || j.max_attempts || '): worker ' || j.leased_by
                                      || ' stopped heartbeating'
                                 ELSE 'its last run (' || j.runs || ' of ' || j.max_attempts
                                      || ') was given back unfinished by worker ' || j.leased_by END
                            WHEN 'cancelled' THEN CASE WHEN j.status = 'running'
                                 THEN 'cancelled: the lease of worker ' || j.leased_by
                                      || ' ran out before the job ended'
                                 -- Given back unfinished (a stop, an admin release) with
                                 -- the cancel pending: its worker may well be alive.
                                 ELSE 'cancelled: the cancel asked for while it ran took effect '
                                      || 'once it was given back unfinished' END
                            WHEN 'exhausted' THEN 'its attempt (' || j.attempt || ') or run ('
                                 || j.runs || ') counter is at the largest integer: '
                                 || 'it cannot be claimed again'
                            WHEN 'keyless' THEN 'its concurrency key ' || j.concurrency_key
                                 || ' has no limit of at least 1 (concurrency_limit '
                                 || COALESCE(j.concurrency_limit::text, 'NULL') || '): it can never run'
                            ELSE j.last_error END
"""

#: A claimed row of a workflow that the claim ended instead (failed: no runs
#: left after an expired lease; cancelled: a cancel pending when its worker
#: died) settles its edges here, as a finish would (``workflows.settle``).
#: No NOTIFY (no channel): such a child lies after this worker's keys; another
#: worker's may have passed it (its next walk finds it). Plain rows never reach it.
_SETTLED = (
    "settled AS (\n    "
    + settle(
        "claimed AS c WHERE c.ended IS NOT NULL AND c.workflow_id IS NOT NULL",
        "c.id",
        "c.ended",
        "NULL::text",
    )
    + "\n)"
)


def _claimable(after: str) -> str:
    """The plain claim's walk of one priority ``l.priority`` of the claim index, in
    claim order: its jobs that may be claimed now; ``after`` bounds the walk (a
    condition; empty: the whole priority). Shared by ``CLAIM``, ``CLAIM_AFTER``
    and ``FRONT_LOOK``, which must see the same jobs."""
    return (
        """
        FROM leasejobs_job
        WHERE priority = l.priority
          AND finished_at IS NULL
          AND run_at <= statement_timestamp()"""
        + after
        + """
          AND (status = 'queued' OR lease_until < statement_timestamp())
          AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
          AND (%(job_id)s::bigint IS NULL OR id = %(job_id)s::bigint)
          AND concurrency_key IS NULL
          AND queue <> ALL (ARRAY(SELECT name FROM leasejobs_queue
                                  WHERE paused OR concurrency IS NOT NULL OR rate_count IS NOT NULL))
        ORDER BY run_at, id"""
    )


def _plain_claim(levels: str, after: str) -> str:
    """``CLAIM`` or ``CLAIM_AFTER``: ``levels`` names the priorities to walk
    (a CTE), ``after`` where each walk starts (a condition; empty: at the front)."""
    return (
        levels
        + """
picked AS (
    -- No ORDER BY: the levels come highest first and each walk in (run_at, id)
    -- order, so the rows arrive in claim order and the LIMIT stops the walks
    -- (and their locks) at the last row kept.
    SELECT c.* FROM levels AS l CROSS JOIN LATERAL (
        SELECT id, ctid AS tid, priority, run_at, status = 'running' AS taken_over,
               """
        + _ended("")
        + """ AS ended,
               args::text AS args_text, kwargs::text AS kwargs_text"""
        + _claimable(after)
        + """
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE l.priority IS NOT NULL
    LIMIT %(limit)s
),
sized AS (
    -- The bytes each job's arguments take in the worker, a row too large to
    -- hold counted as nothing (its arguments are not sent), and the bytes of
    -- the rows before it in claim order: the claim keeps rows only while
    -- they fit in ``max_bytes`` (the first always).
    SELECT p.*, b.bytes,
           sum(CASE WHEN b.bytes > %(max_row_bytes)s THEN 0 ELSE b.bytes END) OVER w AS upto,
           -- Kept rows are a prefix of this order (the bytes before a row only
           -- grow), so the first ``counted`` here are the first kept.
           row_number() OVER w <= %(counted)s AS counted
    FROM picked AS p
    CROSS JOIN LATERAL (SELECT octet_length(p.args_text) + octet_length(p.kwargs_text) AS bytes) AS b
    WINDOW w AS (ORDER BY p.priority DESC, p.run_at, p.id)
),
kept AS (
    SELECT * FROM sized
    WHERE upto - CASE WHEN bytes > %(max_row_bytes)s THEN 0 ELSE bytes END < %(max_bytes)s
),
durable AS (
    SELECT set_config('synchronous_commit', 'on', true) AS setting
),
claimed AS (
    UPDATE leasejobs_job AS j SET
"""
        + _CLAIM_SET
        + """    FROM kept AS p
    WHERE j.ctid = p.tid AND (SELECT setting FROM durable) IS NOT NULL  -- once, not per row
    RETURNING j.id, j.task_name, j.attempt, j.runs, j.max_attempts,
              j.queue, CASE WHEN p.ended IS NOT NULL THEN j.status END AS ended, j.last_error,
              p.counted, p.taken_over, j.priority, j.run_at,
              j.trace_context::text AS trace_context, j.snoozes, j.retry_policy::text AS retry_policy,
              CASE WHEN p.bytes <= %(max_row_bytes)s THEN p.args_text END AS args,
              CASE WHEN p.bytes <= %(max_row_bytes)s THEN p.kwargs_text END AS kwargs, p.bytes,
              j.workflow_id
),
"""
        + _SETTLED
        + """
SELECT id, task_name, args, kwargs, attempt, runs, max_attempts, queue, ended, last_error,
       counted, taken_over, """
        + seconds_waited("run_at")
        + """ AS waited,
       trace_context, snoozes, retry_policy, 0 AS slots, bytes, priority, run_at::text
FROM claimed
WHERE (SELECT count(*) FROM settled) >= 0
-- Qualified: a bare run_at would name the output column, the text.
ORDER BY claimed.priority DESC, claimed.run_at, claimed.id
"""
    )


#: The priorities of queued and running jobs, highest first (a skip scan of the
#: claim index): where ``CLAIM`` and ``FRONT_LOOK`` walk.
_LEVELS = """
WITH RECURSIVE levels(priority) AS (
    -- The priorities of queued and running jobs, highest first: one index probe each.
    (SELECT priority FROM leasejobs_job WHERE finished_at IS NULL
     ORDER BY priority DESC LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM leasejobs_job AS j
            WHERE j.finished_at IS NULL AND j.priority < l.priority
            ORDER BY j.priority DESC LIMIT 1)
    FROM levels AS l WHERE l.priority IS NOT NULL
)"""


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
#: limit, which is every claim of a worker keeping up: jobs due tomorrow
#: made each claim read their pages (docs/performance.md). A running job's
#: ``run_at`` is never later than its claim, so an expired lease is still
#: found inside the bound, except after a durable sleep or wait of its body
#: (``leasejobs.db.sql.steps``), which sets it to when the job is due again:
#: its lease, if its worker died before the finish, is found then, on purpose.
#: Each priority in use costs one probe and a few pages per claim (at most 201).
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
#: order, count their run now: a worker counts every row it claims, since
#: each goes straight to a child that starts it within milliseconds, so no
#: body ever starts with its run off the record (a job handed to a child
#: that never started it has its run taken back by its finish or release).
#: Rows come back ``ended`` instead of claimed
#: when they must not run again: ``'failed'`` for an expired lease with no
#: runs left (a job that kills its worker cannot loop forever),
#: ``'cancelled'`` when a cancel is pending (the worker that held it died
#: before it could end it).
#:
#: ``job_id`` (None for workers) claims that one job only: ``leasejobs.testing.run_job``.
#: The arguments come back as JSON text, never parsed by the worker (the
#: child that runs the body reads them, so a value Python refuses fails that
#: job alone). A claim keeps rows, in claim order, while their arguments fit
#: in ``max_bytes`` (the first row always): a worker's memory follows its
#: settings, not its jobs. A row whose arguments are larger than
#: ``max_row_bytes`` comes back without them, to be failed.
#:
#: Due means by this statement's time (``statement_timestamp()``): a job enqueued
#: inside a long transaction is stamped with its statement's time, and
#: ``leasejobs.testing`` claims inside the test's own transaction.
#:
#: The rows come back in claim order (an UPDATE's RETURNING has none), so a
#: worker that claims many at once still starts them in priority order. The
#: worker's claim connection turns sequential and bitmap scans off, so this
#: is always a walk of the partial index that stops after ``limit`` rows,
#: whatever the table's statistics say (see ``leasejobs.db.store``); the
#: UPDATE writes the versions the walk locked, by ``ctid`` (``leasejobs.db.sql``).
#: ``waited`` (seconds from ``run_at`` to the claim) and ``trace_context`` feed the
#: queue-time metric and the attempt's span.
#:
#: Queue controls: this claim leaves alone every job with a concurrency key
#: and every job of a paused or limited queue (read from ``leasejobs_queue``
#: once per statement, so a pause applies to the very next claim); those
#: are ``CLAIM_LIMITED``'s. With no queue row and no key, this is the claim
#: it always was, plus one look at an empty table.
CLAIM = _plain_claim(_LEVELS + ",", "")

#: ``CLAIM``, walking on from where this worker's claims stopped: each
#: priority it has claimed from (``after_priorities``) is walked from just
#: after the last job of that priority it kept (``after_run_ats``,
#: ``after_ids``), not from the front of the claim index.
#:
#: Why: while something pins the xmin horizon (a transaction left idle, a
#: long ``REPEATABLE READ`` report, a replica's feedback) no VACUUM can remove
#: the index entries of the jobs finished meanwhile, and they sit exactly at
#: the front, in ``run_at`` order before every job still queued. A claim from
#: the front visits the heap for each: 35 buffers a look on a clean table,
#: 388,631 after two minutes of a pinned horizon at 5,000 jobs a second
#: (docs/performance.md, "Steady under pressure"). From the last key it
#: passes only the jobs other workers claimed since this one's last claim.
#:
#: What it cannot see: a job due before the key (an expired lease, a job given
#: back by another worker; one enqueued behind it moves the key back by its
#: NOTIFY), and priorities this worker has not claimed from. The worker's front
#: look (``FRONT_LOOK``, beside the claims) finds those often enough
#: (``leasejobs.worker.claim_start``); the worker
#: claims from the front (``CLAIM``) only before it has keys, and when
#: ``--burst`` asks whether anything is left.
#:
#: The keys travel as text, in and out (``run_at::text``, which ``CLAIM``
#: returns): the worker never reads them, and a ``run_at`` Python cannot
#: hold (before year 1 in the session's time zone, written by SQL) must
#: not fail a claim whose rows are already committed.
CLAIM_AFTER = _plain_claim(
    """
WITH levels(priority, after_run_at, after_id) AS (
    SELECT * FROM unnest(%(after_priorities)s::smallint[], %(after_run_ats)s::text[]::timestamptz[],
                         %(after_ids)s::bigint[])
    ORDER BY 1 DESC
),""",
    """
          AND (run_at, id) > (l.after_run_at, l.after_id)""",
)

#: The look from the front that a claim from the keys cannot make: per
#: priority, the first job a plain claim could take now at or before this
#: worker's key (any, without a key); nothing locked or written. Such a job
#: is one ``CLAIM_AFTER`` walks past (an expired lease, a job given back by
#: another worker, one enqueued with an earlier ``run_at`` or committed long
#: after its statement); the worker moves its key to just before it. It runs
#: on a connection and thread of its own (``leasejobs.worker.front_look``):
#: under a pinned xmin horizon it walks every entry the pin keeps, for
#: seconds, and claims that waited for it left arriving jobs to other workers.
#:
#: Each walk is bounded by its key (a missing key: the end of time). Its
#: priorities are the keys' and those of jobs between and around them: a
#: keyed priority probed from the front too walked a pin's entries twice.
FRONT_LOOK = (
    """
WITH RECURSIVE keys(priority, run_at, id) AS (
    SELECT * FROM unnest(%(after_priorities)s::smallint[], %(after_run_ats)s::text[]::timestamptz[],
                         %(after_ids)s::bigint[])
),
levels(priority) AS (
    -- Down from above every priority: the next key's, or a job's above it (GREATEST skips NULL).
    SELECT 32768
    UNION ALL
    SELECT GREATEST(k.below, (SELECT j.priority FROM leasejobs_job AS j
                              WHERE j.finished_at IS NULL AND j.priority < l.priority
                                AND j.priority > COALESCE(k.below, -32769)
                              ORDER BY j.priority DESC LIMIT 1))
    FROM levels AS l
    CROSS JOIN LATERAL (SELECT max(priority) AS below FROM keys WHERE priority < l.priority) AS k
    WHERE l.priority IS NOT NULL
)
SELECT c.priority, c.run_at::text, c.id
FROM levels AS l
LEFT JOIN keys AS k ON k.priority = l.priority
CROSS JOIN LATERAL (
    SELECT priority, run_at, id"""
    + _claimable(
        """
          AND (run_at, id) <= (COALESCE(k.run_at, 'infinity'), COALESCE(k.id, 9223372036854775807))"""
    )
    + """
    LIMIT 1
) AS c
WHERE l.priority < 32768
ORDER BY c.priority DESC
"""
)

#: Claim up to ``limit`` jobs that a limit governs: jobs of queues with a
#: concurrency or rate limit (not paused), and jobs with a concurrency key.
#: Each such job needs one free place of every limit on it (``leasejobs_slot``:
#: its queue's concurrency, its queue's rate, its key's concurrency).
#:
#: The places are taken in this statement. For each limit at stake,
#: ``key_free`` and ``queue_free`` read its free places (``COALESCE(held_until,
#: '-infinity')`` before ``now()``: one range of the index ``leasejobs_slot_free``;
#: the bound ``n + 0`` keeps plans off the unique index, which walked all of a
#: quota's places while statistics called the table empty) and lock at most as
#: many as candidates need, ``FOR UPDATE SKIP LOCKED``; a queue limit's, at most
#: the claim's ``limit``. A claim's cost follows its candidates, not the size of
#: the limit: locking every free place made each claim under a ``100000/d`` rate
#: take 2 s and 5.4 MB of WAL (issue 28). A place another claim is taking right
#: now is locked and skipped; one taken and committed since this statement's
#: snapshot is re-read under the lock (PostgreSQL re-checks a locked row's
#: conditions on its newest version) and is no longer free. So two claims never
#: take one place, whatever the snapshots saw, which a count of running rows in
#: a CTE cannot promise (PgQueuer #761).
#:
#: Candidates are ranked within each limit in claim order, free places are
#: numbered within each limit, and the k-th candidate of a limit gets its
#: k-th free place; a job runs only if it got a place of every limit on it.
#: Key places are matched first, and only the candidates that got theirs are
#: ranked for their queue's limits, so a candidate held back by its key
#: costs its queue no place.
#: Candidates come only from queues and keys that have a free place as this
#: snapshot sees it (``open``, the key test), so a queue or a key at its
#: limit never fills the candidates and starves the others.
#:
#: A concurrency or key place is held until the attempt's lease runs out
#: (``held_until`` = ``lease_until``, renewed by each heartbeat) unless its
#: finish or release frees it first; a rate place is held for the rate window
#: from its claim, so any window of that length holds at most N claims. As
#: in ``CLAIM``, the first ``counted`` rows count their run now (a worker
#: claims jobs under limits only for idle children, which start them at once).
CLAIM_LIMITED = (
    """
WITH ctl AS (
    -- A rate window written by hand outside 0 to 366 days (refused where rates are set)
    -- is read within them: never added to a timestamp past PostgreSQL's range.
    SELECT name, concurrency, rate_count, GREATEST(LEAST(rate_seconds, 31622400), 0) AS rate_seconds
    FROM leasejobs_queue
    WHERE NOT paused AND (concurrency IS NOT NULL OR rate_count IS NOT NULL)
      AND (%(queues)s::text[] IS NULL OR name = ANY(%(queues)s::text[]))
),
paused AS (
    SELECT name FROM leasejobs_queue WHERE paused
),
open AS (
    -- A queue with a free place of each of its limits. Each test reads the
    -- limit's places soonest free first (the index leasejobs_slot_free) and
    -- stops at the first one numbered within the limit: a free place if
    -- there is one, else the held place that ends first.
    SELECT c.name FROM ctl AS c
    WHERE (c.concurrency IS NULL OR (
              SELECT COALESCE(s.held_until, '-infinity'::timestamptz) FROM leasejobs_slot AS s
              WHERE s.kind = 'concurrency' AND s.name = c.name AND s.n + 0 <= c.concurrency
              ORDER BY COALESCE(s.held_until, '-infinity'::timestamptz)
              LIMIT 1) < now())
      AND (c.rate_count IS NULL OR (
              SELECT COALESCE(s.held_until, '-infinity'::timestamptz) FROM leasejobs_slot AS s
              WHERE s.kind = 'rate' AND s.name = c.name AND s.n + 0 <= c.rate_count
              ORDER BY COALESCE(s.held_until, '-infinity'::timestamptz)
              LIMIT 1) < now())
),
candidate AS (
    SELECT j.id, j.ctid AS tid, j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at,
           j.status = 'running' AS taken_over,
           """
    + _ended("j")
    + """ AS ended
    FROM leasejobs_job AS j
    WHERE j.finished_at IS NULL
      AND j.run_at <= statement_timestamp()  -- as CLAIM: a durable sleep's run_at is its end
      AND (j.status = 'queued' OR j.lease_until < statement_timestamp())
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND (j.queue IN (SELECT name FROM open)
           OR (j.concurrency_key IS NOT NULL
               AND j.queue NOT IN (SELECT name FROM ctl)
               AND j.queue NOT IN (SELECT name FROM paused)))
      AND (j.concurrency_key IS NULL OR COALESCE(j.concurrency_limit, 0) < 1 OR (
              SELECT COALESCE(s.held_until, '-infinity'::timestamptz) FROM leasejobs_slot AS s
              WHERE s.kind = 'key' AND s.name = j.concurrency_key AND s.n + 0 <= j.concurrency_limit
              ORDER BY COALESCE(s.held_until, '-infinity'::timestamptz)
              LIMIT 1) < now())
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(scan)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
key_need AS (
    -- The candidates with a concurrency key, ranked per key in claim order.
    SELECT c.id, c.concurrency_key AS name, c.concurrency_limit AS lim,
           row_number() OVER (PARTITION BY c.concurrency_key
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rank
    FROM candidate AS c
    WHERE c.ended IS NULL AND c.concurrency_key IS NOT NULL
),
key_free AS (
    -- Per key, at most as many free places as its candidates, locked as they
    -- are read (see "free places" above), then numbered.
    SELECT w.name, f.n, row_number() OVER (PARTITION BY w.name ORDER BY f.n) AS rank
    FROM (SELECT name, count(*) AS places, max(lim) AS lim FROM key_need GROUP BY name) AS w
    CROSS JOIN LATERAL (
        SELECT s.n FROM leasejobs_slot AS s
        WHERE s.kind = 'key' AND s.name = w.name AND s.n + 0 <= w.lim
          AND COALESCE(s.held_until, '-infinity'::timestamptz) < now()
        ORDER BY COALESCE(s.held_until, '-infinity'::timestamptz)
        LIMIT w.places
        FOR UPDATE SKIP LOCKED
    ) AS f
),
key_matched AS (
    -- The k-th candidate of a key gets its k-th free place, if within its limit.
    SELECT k.id, 'key' AS kind, k.name, f.n, NULL::float8 AS hold
    FROM key_need AS k
    LEFT JOIN key_free AS f ON f.name = k.name AND f.rank = k.rank AND f.n <= k.lim
),
queue_need AS (
    -- The candidates that got their key's place (or have none), ranked per
    -- limit of their queue in claim order.
    SELECT c.id, l.kind, c.queue AS name, l.lim, l.hold,
           row_number() OVER (PARTITION BY l.kind, c.queue
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rank
    FROM candidate AS c
    JOIN ctl AS q ON q.name = c.queue
    CROSS JOIN LATERAL (VALUES ('concurrency', q.concurrency, NULL::float8),
                               ('rate', q.rate_count, q.rate_seconds)) AS l(kind, lim, hold)
    WHERE c.ended IS NULL AND l.lim IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM key_matched AS k WHERE k.id = c.id AND k.n IS NULL)
),
queue_free AS (
    -- Per queue limit, at most as many free places as candidates need it,
    -- and never more than the claim's limit: every candidate ranked within
    -- it gets the places of all its limits (its key's were taken above), so
    -- one ranked after it is never claimed.
    SELECT w.kind, w.name, f.n, row_number() OVER (PARTITION BY w.kind, w.name ORDER BY f.n) AS rank
    FROM (SELECT kind, name, LEAST(count(*), %(limit)s) AS places, max(lim) AS lim
          FROM queue_need GROUP BY kind, name) AS w
    CROSS JOIN LATERAL (
        SELECT s.n FROM leasejobs_slot AS s
        WHERE s.kind = w.kind AND s.name = w.name AND s.n + 0 <= w.lim
          AND COALESCE(s.held_until, '-infinity'::timestamptz) < now()
        ORDER BY COALESCE(s.held_until, '-infinity'::timestamptz)
        LIMIT w.places
        FOR UPDATE SKIP LOCKED
    ) AS f
),
matched AS (
    -- Every place each candidate needs, and the one it got (n NULL: none).
    SELECT k.id, k.kind, k.name, k.n, k.hold FROM key_matched AS k
    UNION ALL
    SELECT q.id, q.kind, q.name, f.n, q.hold
    FROM queue_need AS q
    LEFT JOIN queue_free AS f ON f.kind = q.kind AND f.name = q.name AND f.rank = q.rank
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
    WHERE j.ctid = p.tid AND (SELECT setting FROM durable) IS NOT NULL
    RETURNING j.id, j.task_name, j.attempt, j.runs, j.max_attempts,
              j.queue, CASE WHEN p.ended IS NOT NULL THEN j.status END AS ended, j.last_error,
              p.counted, p.taken_over, j.priority, j.run_at,
              j.trace_context::text AS trace_context, j.snoozes, j.retry_policy::text AS retry_policy,
              j.lease_until, j.args::text AS args, j.kwargs::text AS kwargs, j.workflow_id
),
"""
    + _SETTLED
    + """,
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
SELECT c.id, c.task_name,
       CASE WHEN b.bytes <= %(max_row_bytes)s THEN c.args END,
       CASE WHEN b.bytes <= %(max_row_bytes)s THEN c.kwargs END,
       c.attempt, c.runs, c.max_attempts, c.queue, c.ended,
       c.last_error, c.counted, c.taken_over, """
    + seconds_waited("c.run_at")
    + """ AS waited,
       c.trace_context, c.snoozes, c.retry_policy,
       (SELECT count(*) FROM taken AS t WHERE t.job_id = c.id AND t.kind <> 'rate')::int AS slots,
       b.bytes, c.priority, c.run_at::text
FROM claimed AS c
CROSS JOIN LATERAL (SELECT octet_length(c.args) + octet_length(c.kwargs) AS bytes) AS b
WHERE (SELECT count(*) FROM settled) >= 0
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

#: What ``runworker --burst`` leaves behind when it finds no job ready: jobs
#: of its queues claimed before (a retry, a snooze, a lease given back, a
#: durable sleep) and due later, and in how many seconds the first is due.
#: Run once, at exit. A job that is never due (``fragments.NEVER``: waiting
#: for its parents, or for an event with no timeout) is not one of them.
PENDING_RETRIES = f"""
SELECT count(*), extract(epoch FROM min(run_at) - statement_timestamp())::float8
FROM leasejobs_job
WHERE finished_at IS NULL AND status = 'queued' AND attempt > 0 AND run_at > statement_timestamp()
  AND run_at < '{NEVER}'::timestamptz
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
"""
