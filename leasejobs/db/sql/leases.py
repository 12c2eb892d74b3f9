"""Leases: heartbeat, finish and release, run on the worker's own connections.

Each finds its rows by primary key (see ``leasejobs.db.sql``) and writes only
while the attempt still holds the job (``fragments.fence``)."""

from leasejobs.db.sql.fragments import FREE_PLACES, fence, held_places, notify_queues
from leasejobs.db.sql.workflows import settle

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
#: follows the renewed lease; for a row skipped as locked, ``places_renewed``
#: says how many of its places were renewed all the same (a side-effect
#: block of its body holds the row: nobody can take the job, and its places
#: are what could run out).
HEARTBEAT = f"""
WITH held AS (
    SELECT h.id, h.attempt, h.lease_seconds, h.slots
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(lease_seconds)s::float8[],
                %(slots)s::int[])
         AS h(id, attempt, lease_seconds, slots)
),
locked AS (
    SELECT l.id, l.tid, h.attempt
    FROM held AS h
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid AS tid FROM leasejobs_job AS j
        {fence("h", 8)}
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
    WHERE j.ctid = l.tid
    RETURNING j.id, j.attempt, j.cancel_requested, j.lease_until
),
holding AS (
    -- The attempts with places that still hold their job, as last committed
    -- (read, not locked: their own side-effect block may hold the row), and
    -- every one of their places, unexpired. (``OFFSET 0``: a probe of each
    -- row by its key, never a semi-join that, while the job table's
    -- statistics say it is empty, reads every job's key.)
    SELECT h.* FROM held AS h
    WHERE h.slots > 0
      AND EXISTS (SELECT 1 FROM leasejobs_job AS j
                  {fence("h", 16)}
                  OFFSET 0)
      AND h.slots <= (SELECT count(*) FROM leasejobs_slot AS s
                      WHERE s.job_id = h.id AND s.attempt = h.attempt AND s.kind <> 'rate'
                        AND s.held_until >= now())
),
places AS (
    -- Every place of such an attempt, also when its job row is locked right
    -- now (a side-effect block of the body): the row's lease is renewed when
    -- the block commits, but a place left to run out meanwhile would let
    -- another claim take it while this body still runs. An attempt whose
    -- lease was released (from the admin) or taken over renews none: its
    -- place runs out while its body is stopped.
    UPDATE leasejobs_slot AS s SET held_until = clock_timestamp() + make_interval(secs => h.lease_seconds)
    FROM {held_places("holding", "h")}
    WHERE s.ctid = h.tid
    RETURNING s.job_id, s.attempt
),
unrenewed AS MATERIALIZED (
    -- Only these are probed below (a row locked right now, or no longer
    -- ours): probing every held row and keeping the unrenewed ones is the
    -- plan PostgreSQL picks for the plain outer join.
    SELECT h.* FROM held AS h
    WHERE NOT EXISTS (SELECT 1 FROM renewed AS r WHERE r.id = h.id AND r.attempt = h.attempt)
)
SELECT r.id, r.attempt, true AS renewed, r.cancel_requested, true AS held, 0 AS places_renewed
FROM renewed AS r
UNION ALL
SELECT u.id, u.attempt, false, COALESCE(still.cancel_requested, false), still.id IS NOT NULL,
       (SELECT count(*) FROM places AS p WHERE p.job_id = u.id AND p.attempt = u.attempt)::int
FROM unrenewed AS u
LEFT JOIN LATERAL (
    SELECT j.id, j.cancel_requested FROM leasejobs_job AS j
    {fence("u", 4)}
      AND (u.slots = 0 OR u.slots <= (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.job_id = u.id AND s.attempt = u.attempt AND s.kind <> 'rate'
                AND s.held_until >= now()))
    LIMIT 1
) AS still ON true
"""

#: Write the outcome of many attempts in one statement: done, retry (back to
#: queued, due after ``retry_delay`` seconds of database time), failed or
#: cancelled. A snooze is a retry with ``snoozed`` true: queued, due after
#: its delay, ``snoozes`` + 1, and no error entry. Each row is written only
#: while the attempt still holds the job (id AND attempt AND holder AND
#: running); a retry of a job with a pending cancel is written as cancelled
#: instead. ``run_deltas`` adjusts ``runs``: +1 for the run of an attempt
#: that was not counted at its claim (it waited in the buffer), -1 to take
#: back a counted run that ended in a snooze (a snooze is not a run).
#: ``results`` arrive as JSON text, already checked by the worker. A queued
#: outcome with no delay (a durable sleep or wait, ``suspended``) keeps the
#: row's ``run_at``, which the body's fenced sleep or wait set (and an event
#: sent since may have made due again: see ``leasejobs.db.sql.steps``).
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
#:
#: A written job of a workflow that ended (done, failed, cancelled) settles
#: its edges in this same transaction (``workflows.settle``): its children's
#: count of pending parents drops, the last parent's finish makes a child
#: due, a failure cancels the descendants that do not run anyway. Rows
#: without ``workflow_id`` never reach the function: a batch of plain jobs
#: pays one filter over the rows it wrote.
#: The outcomes, one row each (``FINISH``, ``FINISH_WAITING``).
_OUTCOME = """
WITH outcome AS (
    SELECT *
    FROM unnest(
        %(ids)s::bigint[], %(attempts)s::int[], %(statuses)s::text[],
        %(results)s::text[], %(last_errors)s::text[], %(error_entries)s::jsonb[],
        %(retry_delays)s::float8[], %(run_deltas)s::int[], %(snoozed)s::boolean[]
    ) AS o(id, attempt, status, result, last_error, error_entry, retry_delay, run_delta, snoozed)
)"""

#: What a finish writes to each row ``j`` it holds, from its outcome ``o``.
_FINISH_SET = """\
    UPDATE leasejobs_job AS j SET
        status      = CASE WHEN o.status = 'queued' AND j.cancel_requested THEN 'cancelled'
                           ELSE o.status END,
        result      = o.result::jsonb,
        runs        = GREATEST(0, j.runs + o.run_delta),
        last_error  = COALESCE(o.last_error, j.last_error),
        errors      = CASE WHEN o.error_entry IS NULL THEN j.errors
                           ELSE COALESCE(j.errors, '[]') || jsonb_build_array(o.error_entry) END,
        run_at      = CASE WHEN o.status = 'queued' AND NOT j.cancel_requested
                           THEN COALESCE(clock_timestamp() + make_interval(secs => o.retry_delay),
                                         j.run_at)
                           ELSE j.run_at END,
        finished_at = CASE WHEN o.status = 'queued' AND NOT j.cancel_requested THEN NULL
                           ELSE clock_timestamp() END,
        lease_until = NULL,
        snoozes     = j.snoozes + CASE WHEN o.snoozed THEN 1 ELSE 0 END
"""

#: What ends with the written rows: their places freed, their queues woken,
#: their workflows settled (each CTE reads ``written``).
_AFTER_WRITTEN = f"""\
freed AS (
    {FREE_PLACES}
    FROM {held_places("written", "w")}
    WHERE s.ctid = w.tid
    RETURNING w.queue
),
woken AS (
    {notify_queues("freed")}
),
settled AS (
    {settle("written AS w WHERE w.workflow_id IS NOT NULL AND w.status <> 'queued'", "w.id", "w.status")}
)"""

FINISH = f"""{_OUTCOME},
locked AS (
    SELECT l.id, l.tid, o.attempt
    FROM outcome AS o
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid AS tid FROM leasejobs_job AS j
        {fence("o", 8)}
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS l
),
written AS (
{_FINISH_SET}    FROM locked AS l
    JOIN outcome AS o ON o.id = l.id AND o.attempt = l.attempt
    WHERE j.ctid = l.tid
    RETURNING j.id, j.attempt, j.queue, j.status, j.workflow_id
),
{_AFTER_WRITTEN},
unwritten AS MATERIALIZED (
    -- Only these are probed below: probing every outcome and discarding the
    -- written ones afterwards (the plan PostgreSQL picks for the plain
    -- anti-join) cost a quarter of the statement.
    SELECT o.id, o.attempt FROM outcome AS o
    WHERE NOT EXISTS (SELECT 1 FROM written AS w WHERE w.id = o.id AND w.attempt = o.attempt)
)
SELECT id, attempt, true, status FROM written
WHERE (SELECT count(*) FROM woken) >= 0 AND (SELECT count(*) FROM settled) >= 0
UNION ALL
SELECT u.id, u.attempt, false, NULL
FROM unwritten AS u
CROSS JOIN LATERAL (
    SELECT 1 FROM leasejobs_job AS j
    {fence("u", 4)}
    LIMIT 1
) AS still
"""

#: How long ``FINISH_WAITING`` waits for a row another transaction holds
#: before it gives way to ``FINISH``. The worker's own heartbeat never holds
#: a row it finishes (``WorkerStore`` keeps them apart), so this is a rare
#: admin action, a user's transaction or a claim in progress: one such row
#: holds a batch up this long, once.
FINISH_WAIT_MS = 200

#: ``FINISH`` without its ``FOR NO KEY UPDATE SKIP LOCKED`` step: each row's
#: version that matches the fence is found (a primary-key probe, no lock) and
#: updated by its ``ctid``, as one UPDATE. Locking the rows
#: first, to skip any another transaction holds, wrote a lock record per
#: job (54 B of WAL) and found each row twice: a fifth of the finish's
#: PostgreSQL CPU, for a row that is almost never held by anyone else
#: (docs/performance.md, "A finish that does not lock first").
#:
#: A row another transaction holds is waited for, at most
#: ``FINISH_WAIT_MS`` (``lock_timeout`` for this transaction only, set before
#: the first row is written); then the statement fails with
#: ``LockNotAvailable`` and the worker writes the batch with ``FINISH``,
#: which skips that row and reports it. A row another transaction changed
#: and committed while this one waited is not written (its version found is
#: gone, and a TID scan does not follow it to the newer one), whatever the
#: change: the store writes every outcome this statement did not with
#: ``FINISH``, which checks the fence on the newest version, so an attempt
#: that moved on meanwhile (another claim, a release, a cancel that ended it)
#: matches nothing, and one that still holds the job (a cancel requested) is
#: written. Returns the written rows only.
FINISH_WAITING = f"""{_OUTCOME},
waiting AS (
    SELECT set_config('lock_timeout', '{FINISH_WAIT_MS}', true) AS setting
),
found AS (
    SELECT o.*, f.tid
    FROM outcome AS o
    CROSS JOIN LATERAL (
        SELECT j.ctid AS tid FROM leasejobs_job AS j
        {fence("o", 8)}
        LIMIT 1
    ) AS f
),
written AS (
{_FINISH_SET}    FROM found AS o
    WHERE j.ctid = o.tid AND j.attempt = o.attempt AND j.leased_by = %(worker_id)s
      AND j.status = 'running'
      AND (SELECT setting FROM waiting) IS NOT NULL  -- once, before the first row
    RETURNING j.id, j.attempt, j.queue, j.status, j.workflow_id
),
{_AFTER_WRITTEN}
SELECT id, attempt, true, status FROM written
WHERE (SELECT count(*) FROM woken) >= 0 AND (SELECT count(*) FROM settled) >= 0
"""

#: Which of these attempts this worker still holds, read as last committed
#: (no lock: a row another transaction holds is not waited for). The claimer
#: asks it of a give-back that found its row locked, to stop trying once the
#: job has moved on (an operator's release or cancel committed meanwhile).
STILL_HELD = f"""
SELECT h.id, h.attempt
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
WHERE EXISTS (
    SELECT 1 FROM leasejobs_job AS j
    {fence("h", 4)}
)
"""

#: Give leases back: the jobs are queued again and claimable at once (the next
#: claim bumps the token, so this attempt stays fenced off). ``refunds`` (1)
#: undoes the claim of a job whose body never started and never will (claimed
#: beyond what the children had room for, or held at a stop): its run, its
#: attempt and its holder are taken back (``leased_by`` becomes the previous
#: claim's worker again, taken off ``worker_ids``), so a deploy or a busy
#: worker costs no job an attempt and the job shows the attempts its bodies
#: ran. Lowering the token is safe here because the row leaves 'running':
#: every fenced write also asks for 'running' and this worker, and the only
#: way back to 'running' is a claim, which bumps the token again. A row locked
#: by another transaction is skipped, so a stuck lock cannot keep the worker
#: from exiting; that lease runs out on its own. Places under limits held by a
#: released attempt are freed, and their queues NOTIFYed.
RELEASE = f"""
WITH mine AS (
    SELECT l.id, l.tid, h.attempt, h.refund
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(refunds)s::int[]) AS h(id, attempt, refund)
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid AS tid FROM leasejobs_job AS j
        {fence("h", 8)}
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS l
),
released AS (
    UPDATE leasejobs_job AS j SET status = 'queued', lease_until = NULL,
                                  runs = GREATEST(0, j.runs - mine.refund),
                                  attempt = j.attempt - mine.refund,
                                  leased_by = CASE WHEN mine.refund = 1
                                                   THEN COALESCE(j.worker_ids ->> -1, '')
                                                   ELSE j.leased_by END,
                                  -- (A hand-written non-array is kept: ``- -1``
                                  -- would fail the whole give-back on it.)
                                  worker_ids = CASE WHEN mine.refund = 1
                                                     AND jsonb_typeof(j.worker_ids) = 'array'
                                                    THEN j.worker_ids - -1
                                                    ELSE j.worker_ids END
    FROM mine
    WHERE j.ctid = mine.tid
    RETURNING j.id, mine.attempt, j.queue, j.status
),
freed AS (
    {FREE_PLACES}
    FROM {held_places("released", "r")}
    WHERE s.ctid = r.tid
    RETURNING r.queue
),
woken AS (
    {notify_queues("freed")}
)
SELECT id, attempt FROM released WHERE (SELECT count(*) FROM woken) >= 0
"""
