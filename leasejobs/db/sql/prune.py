"""Pruning (manage.py leasejobs_prune): Django's connection, one transaction per batch."""

#: The cutoff, from the database clock: now less ``older_than`` seconds.
PRUNE_CUTOFF = "SELECT now() - make_interval(secs => %s)"

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
