"""Admin actions: Django's connection, one statement per action.

Each action is fenced on what the operator saw: every selected row comes
with the status and attempt shown on the page, and a row is changed only
while it still has both. A job claimed, finished or re-claimed since the
page was rendered is left alone and counted as "changed since". None of
them lowers ``attempt``: it is the fencing token, and a lower one would
let a stale worker's writes match again (only the worker's own ``RELEASE``
of a claim whose body never started does, see ``leases.RELEASE``).
"""

from leasejobs.db.sql.fragments import COUNTER_END, NEVER, notify_places
from leasejobs.db.sql.workflows import settle

#: Give a running job's lease back now: queued again, claimable at once (the
#: next claim bumps the token, so the holder's later heartbeat, side effects
#: and finish are all fenced off). Like ``RELEASE``, plus a NOTIFY on commit
#: so idle workers claim it without waiting for their poll. Unlike
#: ``RELEASE``, it leaves the attempt's places under limits alone: its body
#: may run until its worker's next heartbeat notices, so a place frees only
#: when its hold runs out (the worker can no longer renew it), and a limit
#: still counts that body meanwhile.
ADMIN_RELEASE = f"""
WITH released AS (
    UPDATE leasejobs_job AS j SET status = 'queued', lease_until = NULL
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS s(id, attempt)
    WHERE j.id = s.id AND j.attempt = s.attempt AND j.status = 'running'
    RETURNING j.id, j.attempt, j.leased_by, j.queue, j.priority, j.run_at
),
notified AS (
    {notify_places("released")}
)
SELECT r.id, r.attempt, r.leased_by, (SELECT count(*) FROM notified) FROM released AS r
"""

#: The queued jobs of workflows a cancel just ended.
_CANCELLED_NODES = "cancelled AS c WHERE c.workflow_id IS NOT NULL AND c.status = 'queued'"

#: Cancel: a queued job is cancelled at once; a running one gets
#: ``cancel_requested``, which its worker's next heartbeat hands to
#: ``ctx.cancel_requested`` (the worker then ends the job as cancelled).
#: Returns each changed job with the status it had. A queued job of a
#: workflow cancelled here settles its edges at once (its descendants are
#: cancelled, or run if they asked to); a running one settles them when its
#: worker ends it; a child made due so is announced with its place.
ADMIN_CANCEL = f"""
WITH cancelled AS (
    UPDATE leasejobs_job AS j SET
        status           = CASE WHEN j.status = 'queued' THEN 'cancelled' ELSE j.status END,
        finished_at      = CASE WHEN j.status = 'queued' THEN now() ELSE j.finished_at END,
        cancel_requested = true
    FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(attempts)s::int[]) AS s(id, status, attempt)
    WHERE j.id = s.id AND j.status = s.status AND j.attempt = s.attempt
      AND j.finished_at IS NULL
    RETURNING j.id, j.attempt, j.leased_by, s.status, j.workflow_id
),
settled AS (
    {settle(_CANCELLED_NODES, "c.id", "'cancelled'::text")}
)
SELECT c.id, c.attempt, c.leased_by, c.status FROM cancelled AS c WHERE (SELECT count(*) FROM settled) >= 0
"""

#: Retry now: a failed or cancelled job is queued again, due now, with room
#: for one more run (``max_attempts`` raised to at least ``runs`` + 1, the
#: runs its bodies started; the attempt itself is never lowered); a
#: queued job scheduled for later becomes due now. NOTIFY on commit wakes the workers of those queues.
#: A job of a workflow still waiting for parents stays never due; a retried
#: job's descendants that its failure cancelled, and its run-anyway
#: children not started yet, wait for it again
#: (``leasejobs_restore_descendants``), so the workflow continues.
ADMIN_RETRY = f"""
WITH retried AS (
    UPDATE leasejobs_job AS j SET
        status           = 'queued',
        run_at           = CASE WHEN j.pending_parents > 0 THEN '{NEVER}'::timestamptz
                                WHEN j.status = 'queued' THEN LEAST(j.run_at, now()) ELSE now() END,
        max_attempts     = GREATEST(j.max_attempts, j.runs + 1),
        finished_at      = NULL,
        lease_until      = NULL,
        cancel_requested = false
    FROM unnest(%(ids)s::bigint[], %(statuses)s::text[], %(attempts)s::int[]) AS s(id, status, attempt)
    WHERE j.id = s.id AND j.status = s.status AND j.attempt = s.attempt
      AND j.status IN ('queued', 'failed', 'cancelled')
      AND j.runs < {COUNTER_END} AND j.attempt < {COUNTER_END}  -- (a row one more run would overflow)
    RETURNING j.id, j.attempt, j.leased_by, j.queue, j.workflow_id, j.priority, j.run_at
),
restored AS (
    SELECT leasejobs_restore_descendants(array_agg(r.id))
    FROM retried AS r WHERE r.workflow_id IS NOT NULL
    HAVING count(*) > 0
),
notified AS (
    {notify_places("retried")}
)
SELECT r.id, r.attempt, r.leased_by, (SELECT count(*) FROM notified) FROM retried AS r
WHERE (SELECT count(*) FROM restored) >= 0
"""
