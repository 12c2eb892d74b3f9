"""Workflows: the edges between jobs, settled in the transaction that ends a parent.

The settling itself is a PL/pgSQL function made by migration 0009
(``SETTLE_FUNCTION``), called by every statement that can end a job of a
workflow: the worker's fenced ``FINISH``, the claim that ends a job which
must not run again, and the admin's cancel. Each calls it only for rows
whose ``workflow_id`` is set, so a plain job pays one filter over rows the
statement already has. A stale attempt's finish writes no row (the fence),
so it settles no edge.
"""

from leasejobs.db.sql.fragments import NEVER, notify_places

#: ``leasejobs_settle_parents(parents, outcomes, channel)``: the jobs
#: ``parents`` just ended with ``outcomes`` (done, failed, cancelled); settle
#: their edges, in the caller's transaction. Returns the children made due.
#:
#: 1. Every job this may change (children, and the descendants a failure may
#:    cancel) is read from the edges and locked in id order: two settlings
#:    that share a child (parents of one fan-in finishing in two workers'
#:    batches) wait for each other in the same order, never in a cycle.
#: 2. After the locks (each statement of the function takes a new snapshot),
#:    the descendants a failed or cancelled parent cancels: still queued,
#:    reached by edges not yet resolved whose child did not ask to run anyway
#:    (``run_on_failure``); ``last_error`` names the job whose end caused it.
#: 3. The edges that fire: those of done parents (read, not written: a job
#:    is done once), and those with ``run_on_failure`` out of failed or
#:    cancelled ones, marked resolved so that the parent, retried and done
#:    later, cannot count twice (the retry's restore unresolves the edge of a
#:    child not started yet, which waits for the retried job's end instead:
#:    the edge still counts once). Each child's ``pending_parents`` drops by
#:    its edges that fired; a queued child reaching 0 becomes due now, and its
#:    queue is NOTIFYed with the child's place (``channel`` NULL: none): due
#:    at the settling's clock, it may lie behind the keys of workers that
#:    claimed later jobs before the finish committed (``notify_places``).
SETTLE_FUNCTION = (
    """
CREATE OR REPLACE FUNCTION leasejobs_settle_parents(parents bigint[], outcomes text[], channel text)
RETURNS integer LANGUAGE plpgsql VOLATILE
SET jit = off SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    done_ids bigint[];
    ended_ids bigint[];
    touched bigint[];
    cancelled bigint[];
    made_due integer;
BEGIN
    SELECT COALESCE(array_agg(s.id) FILTER (WHERE s.outcome = 'done'), '{}'),
           COALESCE(array_agg(s.id) FILTER (WHERE s.outcome <> 'done'), '{}')
    INTO done_ids, ended_ids
    FROM unnest(parents, outcomes) AS s(id, outcome);

    IF cardinality(ended_ids) = 0 THEN
        -- Only done parents (every plain finish of a workflow): their children alone change.
        SELECT array_agg(t.id) INTO touched FROM (
            SELECT j.id FROM leasejobs_job AS j
            WHERE j.id IN (SELECT e.child_id FROM leasejobs_workflowedge AS e
                           WHERE e.parent_id = ANY(done_ids) AND NOT e.resolved)
            ORDER BY j.id FOR NO KEY UPDATE
        ) AS t;
    ELSE
        WITH RECURSIVE below(id, spreads) AS (
            -- spreads: the job may be cancelled here, so its children may change too.
            SELECT e.child_id, s.outcome <> 'done' AND NOT e.run_on_failure
            FROM unnest(parents, outcomes) AS s(id, outcome)
            JOIN leasejobs_workflowedge AS e ON e.parent_id = s.id
            UNION
            SELECT e.child_id, NOT e.run_on_failure FROM below AS b
            JOIN leasejobs_workflowedge AS e ON e.parent_id = b.id
            WHERE b.spreads
        )
        SELECT array_agg(t.id) INTO touched FROM (
            SELECT j.id FROM leasejobs_job AS j WHERE j.id IN (SELECT id FROM below)
            ORDER BY j.id FOR NO KEY UPDATE
        ) AS t;

        WITH RECURSIVE doomed(id, cause, outcome) AS (
            SELECT e.child_id, s.id, s.outcome
            FROM unnest(parents, outcomes) AS s(id, outcome)
            JOIN leasejobs_workflowedge AS e ON e.parent_id = s.id
            JOIN leasejobs_job AS c ON c.id = e.child_id
            WHERE s.outcome <> 'done' AND NOT e.run_on_failure AND NOT e.resolved AND c.status = 'queued'
            UNION
            SELECT e.child_id, d.cause, d.outcome FROM doomed AS d
            JOIN leasejobs_workflowedge AS e ON e.parent_id = d.id
            JOIN leasejobs_job AS c ON c.id = e.child_id
            WHERE NOT e.run_on_failure AND NOT e.resolved AND c.status = 'queued'
        ),
        cancelling AS (
            UPDATE leasejobs_job AS j SET
                status = 'cancelled', finished_at = clock_timestamp(),
                last_error = 'cancelled: job ' || d.cause || ' of its workflow '
                             || CASE d.outcome WHEN 'failed' THEN 'failed' ELSE 'was cancelled' END
            FROM (SELECT DISTINCT ON (id) id, cause, outcome FROM doomed ORDER BY id, cause) AS d
            WHERE j.id = d.id AND j.status = 'queued' AND j.id = ANY(touched)
            RETURNING j.id
        )
        SELECT COALESCE(array_agg(id), '{}') INTO cancelled FROM cancelling;
        ended_ids := ended_ids || cancelled;
    END IF;
    IF touched IS NULL THEN
        RETURN 0;
    END IF;

    WITH fired AS (
        -- A run-anyway edge out of a parent that failed or was cancelled fires
        -- now, once: marked, so that the same parent, retried and done later,
        -- does not count again. An edge out of a done parent is only read: a
        -- job is done once (the fence; no retry applies to a done job).
        UPDATE leasejobs_workflowedge AS e SET resolved = true
        WHERE e.parent_id = ANY(ended_ids) AND e.run_on_failure AND NOT e.resolved
        RETURNING e.child_id
    ),
    counted AS (
        SELECT f.id, count(*)::int AS n FROM (
            SELECT child_id AS id FROM fired
            UNION ALL
            SELECT e.child_id FROM leasejobs_workflowedge AS e
            WHERE e.parent_id = ANY(done_ids) AND NOT e.resolved
        ) AS f
        GROUP BY f.id
    ),
    due AS (
        UPDATE leasejobs_job AS j SET
            pending_parents = j.pending_parents - c.n,
            run_at = CASE WHEN j.pending_parents = c.n AND j.status = 'queued'
                          THEN clock_timestamp() ELSE j.run_at END
        FROM counted AS c
        WHERE j.id = c.id AND j.id = ANY(touched)
        RETURNING j.queue, j.priority, j.run_at, j.id,
                  j.pending_parents = 0 AND j.status = 'queued' AS now_due
    ),
    woken AS (
        """
    + notify_places("(SELECT * FROM due WHERE now_due AND channel IS NOT NULL) AS d", "channel")
    + """
    )
    SELECT count(*) FILTER (WHERE now_due) + 0 * (SELECT count(*) FROM woken) INTO made_due FROM due;
    RETURN made_due;
END
$fn$
"""
)

#: ``leasejobs_restore_descendants(ids)``: jobs ``ids`` were retried (queued
#: again); the workflow goes on as if they had never ended. Every job it may
#: change is locked in id order first, like the settling.
#:
#: 1. Their descendants that a failure cancelled (cancelled, never claimed,
#:    no cancel request: an operator's cancel always sets one), reached by
#:    edges that do not run anyway, are the candidates.
#: 2. A candidate with another parent that failed or was cancelled (neither
#:    retried here nor a candidate put back) stays cancelled: that failure
#:    would have cancelled it had the retried job never failed. Dropping one
#:    can block its own children, so this repeats until nothing changes. A
#:    job kept cancelled gets a message naming the failure that keeps it so
#:    (the retried job's no longer holds): the nearest such ancestor.
#: 3. The candidates left wait for their parents again: queued, never due
#:    while a parent is pending.
#: 4. A run-anyway edge out of a retried or restored job fired when that job
#:    ended; a child that has not started yet (queued, never claimed) waits
#:    for it again: the edge is unresolved, the child's ``pending_parents``
#:    rises and it is never due until the parent ends once more, so it sees
#:    that end's result. A child that already started or ended keeps what it
#:    saw: the parent's new end does not count for it again (the edge stays
#:    resolved), and nothing runs it a second time.
RESTORE_FUNCTION = """
CREATE OR REPLACE FUNCTION leasejobs_restore_descendants(ids bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE
SET jit = off SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    found bigint[];
    back bigint[];
    blocked bigint[];
    kept bigint[];
    waiting bigint[];
    restored integer;
BEGIN
    WITH RECURSIVE below(id) AS (
        SELECT e.child_id FROM leasejobs_workflowedge AS e
        JOIN leasejobs_job AS c ON c.id = e.child_id
        WHERE e.parent_id = ANY(ids) AND NOT e.run_on_failure AND NOT e.resolved
          AND c.status = 'cancelled' AND c.attempt = 0 AND NOT c.cancel_requested
        UNION
        SELECT e.child_id FROM below AS b
        JOIN leasejobs_workflowedge AS e ON e.parent_id = b.id
        JOIN leasejobs_job AS c ON c.id = e.child_id
        WHERE NOT e.run_on_failure AND NOT e.resolved
          AND c.status = 'cancelled' AND c.attempt = 0 AND NOT c.cancel_requested
    )
    SELECT COALESCE(array_agg(id), '{}') INTO found FROM below;
    SELECT COALESCE(array_agg(DISTINCT e.child_id), '{}') INTO waiting
    FROM leasejobs_workflowedge AS e
    WHERE e.parent_id = ANY(ids || found) AND e.run_on_failure AND e.resolved;
    IF cardinality(found) = 0 AND cardinality(waiting) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM leasejobs_job WHERE id = ANY(found || waiting) ORDER BY id FOR NO KEY UPDATE;

    back := found;
    LOOP
        SELECT array_agg(DISTINCT e.child_id) INTO blocked
        FROM leasejobs_workflowedge AS e
        JOIN leasejobs_job AS p ON p.id = e.parent_id
        WHERE e.child_id = ANY(back) AND NOT e.run_on_failure
          AND p.status IN ('failed', 'cancelled') AND p.id <> ALL(ids) AND p.id <> ALL(back);
        EXIT WHEN blocked IS NULL;
        back := ARRAY(SELECT unnest(back) EXCEPT SELECT unnest(blocked));
    END LOOP;
    kept := ARRAY(SELECT unnest(found) EXCEPT SELECT unnest(back));

    IF cardinality(kept) > 0 THEN
        WITH RECURSIVE cause(id, by, outcome) AS (
            SELECT e.child_id, p.id, p.status FROM leasejobs_workflowedge AS e
            JOIN leasejobs_job AS p ON p.id = e.parent_id
            WHERE e.child_id = ANY(kept) AND NOT e.run_on_failure
              AND p.status IN ('failed', 'cancelled') AND p.id <> ALL(ids) AND p.id <> ALL(kept)
            UNION
            SELECT e.child_id, c.by, c.outcome FROM cause AS c
            JOIN leasejobs_workflowedge AS e ON e.parent_id = c.id
            WHERE e.child_id = ANY(kept) AND NOT e.run_on_failure
        ),
        message AS (
            SELECT DISTINCT ON (id) id,
                   'cancelled: job ' || by || ' of its workflow '
                   || CASE outcome WHEN 'failed' THEN 'failed' ELSE 'was cancelled' END AS text
            FROM cause ORDER BY id, by
        )
        UPDATE leasejobs_job AS j SET last_error = m.text
        FROM message AS m
        WHERE j.id = m.id AND j.status = 'cancelled' AND j.attempt = 0 AND NOT j.cancel_requested
          AND j.last_error IS DISTINCT FROM m.text;
    END IF;

    UPDATE leasejobs_job AS j SET
        status = 'queued', finished_at = NULL, last_error = '',
        run_at = CASE WHEN j.pending_parents > 0 THEN '9999-01-01 00:00:00+00'::timestamptz
                      ELSE clock_timestamp() END
    WHERE j.id = ANY(back) AND j.status = 'cancelled' AND j.attempt = 0 AND NOT j.cancel_requested;
    GET DIAGNOSTICS restored = ROW_COUNT;

    IF cardinality(waiting) > 0 THEN
        WITH reopened AS (
            UPDATE leasejobs_workflowedge AS e SET resolved = false
            FROM leasejobs_job AS c
            WHERE e.parent_id = ANY(ids || back) AND e.run_on_failure AND e.resolved
              AND c.id = e.child_id AND c.id = ANY(waiting) AND c.status = 'queued' AND c.attempt = 0
            RETURNING e.child_id
        )
        UPDATE leasejobs_job AS j SET
            pending_parents = j.pending_parents + r.n,
            run_at = '9999-01-01 00:00:00+00'::timestamptz
        FROM (SELECT child_id AS id, count(*)::int AS n FROM reopened GROUP BY child_id) AS r
        WHERE j.id = r.id;
    END IF;
    RETURN restored;
END
$fn$
"""

#: Open a workflow: its row, in the block's transaction.
CREATE_WORKFLOW = """
INSERT INTO leasejobs_workflow (name, created_at) VALUES (%(name)s, now()) RETURNING id
"""

#: Make a job just enqueued a node of a workflow: never due while it has
#: parents (``pending_parents``), and one edge per parent. Only a job no
#: workflow has yet, queued and never claimed (the one this transaction
#: just inserted).
ADD_NODE = f"""
WITH node AS (
    UPDATE leasejobs_job SET
        workflow_id = %(workflow_id)s,
        pending_parents = cardinality(%(parents)s::bigint[]),
        run_at = CASE WHEN cardinality(%(parents)s::bigint[]) > 0
                      THEN '{NEVER}'::timestamptz ELSE run_at END
    WHERE id = %(id)s AND workflow_id IS NULL AND status = 'queued' AND attempt = 0
    RETURNING id, run_at
),
edges AS (
    INSERT INTO leasejobs_workflowedge (parent_id, child_id, run_on_failure, resolved)
    SELECT p.id, node.id, %(run_on_failure)s, false
    FROM node CROSS JOIN unnest(%(parents)s::bigint[]) AS p(id)
)
SELECT id, run_at FROM node
"""

#: The results of a job's parents, for ``ctx.parent_results``.
PARENT_RESULTS = """
SELECT e.parent_id, j.result::text
FROM leasejobs_workflowedge AS e
LEFT JOIN leasejobs_job AS j ON j.id = e.parent_id
WHERE e.child_id = %(id)s
ORDER BY e.parent_id
"""

#: A workflow's nodes and edges, for its admin page.
WORKFLOW_NODES = """
SELECT id, task_name, status, attempt, pending_parents, created_at, started_at, finished_at,
       last_error, run_at
FROM leasejobs_job WHERE workflow_id = %(workflow_id)s ORDER BY id
"""

WORKFLOW_EDGES = """
SELECT e.parent_id, e.child_id, e.run_on_failure, e.resolved
FROM leasejobs_workflowedge AS e
JOIN leasejobs_job AS j ON j.id = e.child_id
WHERE j.workflow_id = %(workflow_id)s
ORDER BY e.parent_id, e.child_id
"""


def settle(source: str, ids: str, outcomes: str, channel: str = "%(channel)s") -> str:
    """A CTE body that settles the edges of the jobs of ``source`` that ended.

    ``ids`` and ``outcomes``: the columns of ``source`` (with a filter of the
    rows that ended); only rows of a workflow reach the function, so a batch
    of plain jobs calls nothing.
    """
    return (
        f"SELECT leasejobs_settle_parents(array_agg({ids}), array_agg({outcomes}), {channel})\n"
        f"    FROM {source}\n"
        f"    HAVING count(*) > 0"
    )
