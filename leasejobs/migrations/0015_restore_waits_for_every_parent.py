"""The admin retry's restore waits for every parent again (review 52d).

``leasejobs_restore_descendants`` (migration 0009) put back to waiting every
descendant a retried job's failure had cancelled, even one with another
parent that failed or was cancelled too: that job waited forever for a
parent that would never end again. It also left the run-anyway edges of the
retried job resolved, so a run-anyway child that had not started yet ran
before the retried job ended, and saw ``None`` for it.

The new text (``leasejobs.db.sql.workflows.RESTORE_FUNCTION``, commented
there) keeps such a descendant cancelled, naming the failure that still
holds, and makes a run-anyway child that has not started wait for the
retried job again. Reversed, the function of 0009 comes back (``BEFORE``,
its text as it was).
"""

from django.db import migrations

from leasejobs.db.sql.workflows import RESTORE_FUNCTION

#: The function as migration 0009 made it.
BEFORE = """
CREATE OR REPLACE FUNCTION leasejobs_restore_descendants(ids bigint[])
RETURNS integer LANGUAGE plpgsql VOLATILE
SET jit = off SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    back bigint[];
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
    SELECT array_agg(id) INTO back FROM below;
    IF back IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM leasejobs_job WHERE id = ANY(back) ORDER BY id FOR NO KEY UPDATE;
    UPDATE leasejobs_job AS j SET
        status = 'queued', finished_at = NULL, last_error = '',
        run_at = CASE WHEN j.pending_parents > 0 THEN '9999-01-01 00:00:00+00'::timestamptz
                      ELSE clock_timestamp() END
    WHERE j.id = ANY(back) AND j.status = 'cancelled' AND j.attempt = 0 AND NOT j.cancel_requested;
    GET DIAGNOSTICS restored = ROW_COUNT;
    RETURN restored;
END
$fn$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("leasejobs", "0014_task_bloom_uncompressed"),
    ]

    operations = [migrations.RunSQL(RESTORE_FUNCTION, reverse_sql=BEFORE)]
