"""The side-effect fence: Django's connection, inside the job body's transaction."""

#: The fence check: lock the job row (FOR SHARE blocks claims, heartbeats and
#: finishes of it until the side effect commits), read its token, state and
#: holder and how many places under limits this attempt still holds (a place
#: names its job and attempt; one taken by another claim no longer does),
#: and make this transaction's commit synchronous: a side effect acknowledged
#: to the body must not vanish in a crash.
FENCE_CHECK = """
SELECT j.attempt, j.status, j.leased_by, set_config('synchronous_commit', 'on', true),
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.job_id = j.id AND s.attempt = j.attempt AND s.kind <> 'rate')
FROM leasejobs_job AS j WHERE j.id = %(job_id)s FOR SHARE OF j
"""

#: Renew the lease as the side-effect transaction ends, before it commits.
#: Heartbeats skip the row while the block holds it, so a block longer than
#: the lease would otherwise commit with the lease already run out, and the
#: next claim would take the job over before its finish is written.
#: ``clock_timestamp()``: the transaction began when the block did. The
#: attempt's places under queue or key limits are renewed with it: a place
#: that ran out while its job's lease lives would let one job too many run.
#: Returns how many job rows (1 or 0) and places were renewed: a place that
#: is no longer this attempt's (taken while its worker was paused) fails the
#: fence, and the block rolls back. The places are named by the parameters,
#: not joined to the renewed row: while the places table's statistics said
#: it was empty, that join read every place of a limit (100,000 of a quota:
#: 44 ms for each block instead of 0.4).
RENEW_LEASE = """
WITH renewed AS (
    UPDATE leasejobs_job SET
        lease_until  = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        heartbeat_at = clock_timestamp()
    WHERE id = %(job_id)s AND attempt = %(attempt)s AND leased_by = %(worker_id)s AND status = 'running'
    RETURNING id, attempt, lease_until
),
places AS (
    UPDATE leasejobs_slot AS s SET held_until = (SELECT lease_until FROM renewed)
    WHERE s.job_id = %(job_id)s AND s.attempt = %(attempt)s AND s.kind <> 'rate'
      AND EXISTS (SELECT 1 FROM renewed)
    RETURNING s.n
)
SELECT (SELECT count(*) FROM renewed), (SELECT count(*) FROM places)
"""

#: Record a side effect unless its key exists. The unique key is the at-most-
#: once guarantee: two transactions racing on one key cannot both insert.
RECORD_SIDE_EFFECT = """
INSERT INTO leasejobs_sideeffect (job_id, key, fencing_token, data, created_at)
VALUES (%(job_id)s, %(key)s, %(fencing_token)s, %(data)s::jsonb, now())
ON CONFLICT (key) DO NOTHING
RETURNING id
"""
