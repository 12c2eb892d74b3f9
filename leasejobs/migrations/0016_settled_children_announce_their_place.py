"""Workflow children made due announce their place (6 December).

``leasejobs_settle_parents`` (migration 0009) woke the queue of each child
it made due with a bare queue name. Such a child is due at the settling's
clock, and a worker that claimed later jobs before the finish committed had
its key past it: the child waited for the next walk from the front (10 s
under a pinned xmin horizon). The new text
(``leasejobs.db.sql.workflows.SETTLE_FUNCTION``) sends the child's place
instead (``leasejobs.db.sql.fragments.notify_places``), which moves the keys
back to it. Reversed, the function of 0009 comes back (``BEFORE``, its text
as it was).
"""

from django.db import migrations

from leasejobs.db.sql.workflows import SETTLE_FUNCTION

#: The function as migration 0009 made it.
BEFORE = """
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
        RETURNING j.queue, j.pending_parents = 0 AND j.status = 'queued' AS now_due
    ),
    woken AS (
        SELECT pg_notify(channel, queue)
        FROM (SELECT DISTINCT queue FROM due WHERE now_due AND channel IS NOT NULL) AS q
    )
    SELECT count(*) FILTER (WHERE now_due) + 0 * (SELECT count(*) FROM woken) INTO made_due FROM due;
    RETURN made_due;
END
$fn$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("leasejobs", "0015_restore_waits_for_every_parent"),
    ]

    operations = [migrations.RunSQL(SETTLE_FUNCTION, reverse_sql=BEFORE)]
