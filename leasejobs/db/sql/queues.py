"""The ``leasejobs_queue`` and ``leasejobs_slot`` tables: queue controls (pause, limits
and their places) as the admin, the command and the functions set them, and the
queues' figures."""

from leasejobs.db.sql import workers

#: Wake the workers of one queue when the transaction commits.
NOTIFY_QUEUE = "SELECT pg_notify(%s, %s)"

#: Every queue row's limits, to compare with the settings.
QUEUE_LIMITS = "SELECT name, concurrency, rate_count, rate_seconds, limits_from_settings FROM leasejobs_queue"

#: Every queue row's name.
QUEUE_NAMES = "SELECT name FROM leasejobs_queue ORDER BY name"

SYNC_ROW = """
INSERT INTO leasejobs_queue (name, paused, concurrency, rate_count, rate_seconds,
                             limits_from_settings, updated_at)
VALUES (%(name)s, false, %(concurrency)s, %(rate_count)s, %(rate_seconds)s, true, now())
ON CONFLICT (name) DO UPDATE SET
    concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds, updated_at = now()
WHERE leasejobs_queue.limits_from_settings
  AND (leasejobs_queue.concurrency, leasejobs_queue.rate_count, leasejobs_queue.rate_seconds)
      IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate_count, EXCLUDED.rate_seconds)
"""

DROP_UNSET = """
UPDATE leasejobs_queue SET concurrency = NULL, rate_count = NULL, rate_seconds = NULL, updated_at = now()
WHERE limits_from_settings AND NOT (name = ANY(%(names)s::text[]))
  AND (concurrency IS NOT NULL OR rate_count IS NOT NULL)
"""

#: The places 1..limit of a queue's limits; free places above a lowered
#: limit are removed (held ones stay until freed, and are never taken again:
#: the claim takes places numbered up to the limit only). Rate places above
#: a lowered count are removed held or not: no attempt holds them (its
#: heartbeat looks at its concurrency places only) and none will take them
#: again; left to run out, up to a window's worth of them would sit among
#: the free places each claim reads first. The claims they recorded are
#: forgotten with them, so rate places added to a queue that has some (a
#: count raised, or lowered and raised again) are held for one window from
#: now: no window holds more claims than the highest count in force in it.
QUEUE_PLACES = """
WITH q AS (
    SELECT name, concurrency, rate_count, GREATEST(LEAST(rate_seconds, 31622400), 0) AS rate_seconds
    FROM leasejobs_queue WHERE name = %(name)s
),
made AS (
    INSERT INTO leasejobs_slot (kind, name, n, held_until)
    SELECT k.kind, q.name, n,
           CASE WHEN k.kind = 'rate'
                     AND EXISTS (SELECT 1 FROM leasejobs_slot AS o WHERE o.kind = 'rate' AND o.name = q.name)
                THEN now() + make_interval(secs => q.rate_seconds) END
    FROM q, LATERAL (VALUES ('concurrency', q.concurrency), ('rate', q.rate_count)) AS k(kind, lim),
         generate_series(1, k.lim) AS n
    ON CONFLICT (kind, name, n) DO NOTHING
)
DELETE FROM leasejobs_slot AS s
USING q
WHERE s.name = q.name
  AND ((s.kind = 'concurrency' AND s.n > COALESCE(q.concurrency, 0))
       OR (s.kind = 'rate' AND s.n > COALESCE(q.rate_count, 0)))
  AND (s.kind = 'rate' OR s.held_until IS NULL OR s.held_until < now())
"""

SET_PAUSED = """
INSERT INTO leasejobs_queue (name, paused, limits_from_settings, updated_at)
VALUES (%(name)s, %(paused)s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
"""

SET_LIMITS = """
INSERT INTO leasejobs_queue (name, paused, concurrency, rate_count, rate_seconds,
                             limits_from_settings, updated_at)
VALUES (%(name)s, false, %(concurrency)s, %(rate_count)s, %(rate_seconds)s, false, now())
ON CONFLICT (name) DO UPDATE SET
    concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds, limits_from_settings = false, updated_at = now()
"""

#: Queues whose places do not cover their limits (a limit raised by hand in the table).
MISSING_PLACES = """
SELECT EXISTS (
    SELECT 1 FROM leasejobs_queue AS q
    WHERE (q.concurrency IS NOT NULL AND q.concurrency > (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.kind = 'concurrency' AND s.name = q.name AND s.n <= q.concurrency))
       OR (q.rate_count IS NOT NULL AND q.rate_count > (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.kind = 'rate' AND s.name = q.name AND s.n <= q.rate_count))
)
"""

STATES = """
SELECT q.name, q.paused, q.concurrency, q.rate_count, q.rate_seconds, q.limits_from_settings,
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'concurrency' AND s.name = q.name AND s.held_until >= now()),
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'rate' AND s.name = q.name AND s.held_until >= now()),
       (SELECT count(*) FROM leasejobs_job AS j
        WHERE j.finished_at IS NULL AND j.status = 'queued' AND j.queue = q.name)
FROM leasejobs_queue AS q
ORDER BY q.name
"""

#: One row per (queue, status) of active jobs, plus the live-worker count on
#: every row; a queue-less row when no job is active.
STATS = f"""
SELECT a.queue, a.status, COALESCE(a.jobs, 0), a.oldest_due_age, COALESCE(a.expired, 0), w.live
FROM ({workers.COUNT_LIVE}) AS w(live)
LEFT JOIN LATERAL (
    SELECT queue, status, count(*) AS jobs,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'queued' AND run_at <= now()
                                                    AND isfinite(run_at)))
               AS oldest_due_age,
           count(*) FILTER (WHERE status = 'running' AND lease_until < now()) AS expired
    FROM leasejobs_job
    WHERE finished_at IS NULL
    GROUP BY queue, status
) AS a ON true
ORDER BY a.queue, a.status
"""

#: Every controlled queue with its places held now: the rows of
#: ``controls.states()`` without its count of queued jobs, a scan of the
#: job table per queue row (0.3 to 0.6 s at 1,000,000 jobs) that neither
#: page shows (the Queues page and the overview count jobs per queue once).
CONTROLS = """
SELECT q.name, q.paused, q.concurrency, q.rate_count, q.rate_seconds, q.limits_from_settings,
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'concurrency' AND s.name = q.name AND s.held_until >= now()),
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'rate' AND s.name = q.name AND s.held_until >= now())
FROM leasejobs_queue AS q
ORDER BY q.name
"""
