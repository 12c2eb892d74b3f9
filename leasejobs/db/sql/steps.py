"""Durable steps and events: Django's connection, inside the job body's fenced transaction
(``ctx.step``, ``ctx.sleep``, ``ctx.wait_for``) or the sender's (``send_event``).

Every write of a step runs after ``side_effects.FENCE_CHECK`` locked the job
row and found it still held by the attempt, and before ``RENEW_LEASE``
(which fails the block when the attempt no longer holds it), in one
transaction: a stale attempt writes no step. A sleep or a wait sets the
job's ``run_at`` while the job is still running (nothing else reads it
then): the finish of the suspended attempt keeps the row's ``run_at``
(``leases.FINISH`` with a NULL delay), so an event sent between the wait's
commit and the finish still makes the job due, and a worker that dies in
between leaves a job that is reclaimed when it is due, not before.

A wait and ``send_event`` serialise on the event key (``LOCK_EVENT_KEY``,
taken before the job row): either the wait sees the event, or the sender
sees the wait and makes the job due.
"""

from leasejobs.db.sql.fragments import NEVER, notify_places

#: Every step row of a job, read once per attempt at its first step.
STEPS = """
SELECT name, kind, attempt, result::text, event_key, event_id, done
FROM leasejobs_step WHERE job_id = %(job_id)s
"""

#: The result of a completed ``ctx.step``.
RECORD_STEP = """
INSERT INTO leasejobs_step (job_id, name, kind, attempt, result, done, created_at, done_at)
VALUES (%(job_id)s, %(name)s, 'step', %(attempt)s, %(result)s::jsonb, true, clock_timestamp(),
        clock_timestamp())
RETURNING result::text
"""

#: A ``ctx.sleep``: its row, and the job due when it ends.
SLEEP = """
WITH slept AS (
    INSERT INTO leasejobs_step (job_id, name, kind, attempt, wake_at, done, created_at)
    VALUES (%(job_id)s, %(name)s, 'sleep', %(attempt)s,
            clock_timestamp() + make_interval(secs => %(seconds)s), true, clock_timestamp())
    RETURNING job_id, wake_at
)
UPDATE leasejobs_job AS j SET run_at = s.wake_at FROM slept AS s WHERE j.id = s.job_id
"""

#: Serialise a wait and a send of one event key (the two-key form: class
#: 0x6c6a6f62, "ljob", so leasejobs' locks do not meet an application's).
LOCK_EVENT_KEY = "SELECT pg_advisory_xact_lock(1819963234, hashtext(%(key)s))"

#: The event of a key, if it was sent before the deadline of the job's wait (an
#: event sent after it came too late, however soon a worker got to the job), and
#: the database clock.
LOOK_EVENT = """
SELECT e.id, e.payload::text, clock_timestamp()
FROM (SELECT 1) AS one
LEFT JOIN leasejobs_event AS e
       ON e.key = %(key)s
      AND NOT EXISTS (SELECT FROM leasejobs_step AS s
                      WHERE s.job_id = %(job_id)s AND s.name = %(name)s AND NOT s.done
                        AND s.wake_at < e.created_at)
"""

#: A wait that received its event: the payload is the step's result.
RECEIVE = """
INSERT INTO leasejobs_step (job_id, name, kind, attempt, result, event_key, event_id, done,
                            created_at, done_at)
VALUES (%(job_id)s, %(name)s, 'wait', %(attempt)s, %(payload)s::jsonb, %(key)s, %(event_id)s, true,
        clock_timestamp(), clock_timestamp())
ON CONFLICT (job_id, name) DO UPDATE SET
    attempt = EXCLUDED.attempt, result = EXCLUDED.result, event_id = EXCLUDED.event_id,
    done = true, done_at = EXCLUDED.done_at
"""

#: A wait whose deadline passed with no event: done, no event; returns whether it had.
TIME_OUT = """
UPDATE leasejobs_step SET done = true, done_at = clock_timestamp(), attempt = %(attempt)s
WHERE job_id = %(job_id)s AND name = %(name)s AND NOT done AND wake_at <= clock_timestamp()
"""

#: A wait with no event yet: its row (kept if an earlier attempt wrote it:
#: the deadline counts from the first wait), and the job due at the
#: deadline, or never until the event comes (``fragments.NEVER``).
WAIT = f"""
WITH waiting AS (
    INSERT INTO leasejobs_step (job_id, name, kind, attempt, event_key, wake_at, done, created_at)
    VALUES (%(job_id)s, %(name)s, 'wait', %(attempt)s, %(key)s,
            clock_timestamp() + make_interval(secs => %(timeout)s), false, clock_timestamp())
    ON CONFLICT (job_id, name) DO UPDATE SET done = false
    RETURNING job_id, wake_at
)
UPDATE leasejobs_job AS j SET run_at = COALESCE(w.wake_at, '{NEVER}'::timestamptz)
FROM waiting AS w WHERE j.id = w.job_id
"""

#: ``send_event``: the event (the first send of a key wins), and every job
#: waiting for the key due now: queued, or still running between its wait
#: and its finish (the finish keeps ``run_at``). Wakes their queues' workers.
#: Returns (1 if this send stored the event, jobs made due).
SEND_EVENT = f"""
WITH sent AS (
    INSERT INTO leasejobs_event (key, payload, created_at)
    VALUES (%(key)s, %(payload)s::jsonb, clock_timestamp())
    ON CONFLICT (key) DO NOTHING
    RETURNING id
),
woken AS (
    UPDATE leasejobs_job AS j SET run_at = clock_timestamp()
    FROM leasejobs_step AS s
    WHERE s.event_key = %(key)s AND s.kind = 'wait' AND NOT s.done
      AND j.id = s.job_id AND j.finished_at IS NULL AND j.run_at > clock_timestamp()
    RETURNING j.queue, j.priority, j.run_at, j.id
),
notified AS (
    {notify_places("woken")}
)
SELECT (SELECT count(*) FROM sent), (SELECT count(*) FROM woken)
WHERE (SELECT count(*) FROM notified) >= 0
"""

#: Pruning: events sent before the cutoff, a batch at a time (steps go with their jobs).
PRUNE_EVENTS = """
DELETE FROM leasejobs_event
WHERE id IN (
    SELECT id FROM leasejobs_event WHERE created_at < %(cutoff)s ORDER BY id LIMIT %(limit)s
)
"""

#: The admin's job page: a job's steps, oldest first.
JOB_STEPS = """
SELECT name, kind, attempt, created_at, done_at, done, wake_at, event_key, event_id,
       result::text, octet_length(result::text)
FROM leasejobs_step WHERE job_id = %(job_id)s
ORDER BY created_at, name
"""
