"""The ``leasejobs_worker`` table: one row per running worker, kept fresh by its heartbeat thread.

It answers two questions no job row can: is this host's worker alive even
when it holds no job (``manage.py leasejobs_health --worker``), and how many
workers are live (the metrics view, the admin). A row is fresh while
``heartbeat_at`` is younger than ``STALE_AFTER`` heartbeat intervals; a clean
stop deletes it, a killed worker leaves a stale row that the next worker to
start deletes once it is a day old.
"""

#: A worker whose row is older than this many of its heartbeat intervals is
#: not live: one late tick is tolerated, two are not.
STALE_AFTER = 2

#: Upsert this worker's row (every heartbeat tick, on the heartbeat connection).
ALIVE = """
INSERT INTO leasejobs_worker (worker_id, hostname, pid, started_at, heartbeat_at, interval_seconds)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, now(), now(), %(interval)s)
ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now(), interval_seconds = EXCLUDED.interval_seconds
"""

#: At a clean stop.
GONE = "DELETE FROM leasejobs_worker WHERE worker_id = %(worker_id)s"

#: At start: forget workers that died without a clean stop a day ago or more.
FORGET_DEAD = "DELETE FROM leasejobs_worker WHERE heartbeat_at < now() - interval '1 day'"

#: SQL fragment: the row of a live worker (alias ``w``).
LIVE = f"w.heartbeat_at > now() - make_interval(secs => {STALE_AFTER} * w.interval_seconds)"

#: How many workers are live.
COUNT_LIVE = f"SELECT count(*) FROM leasejobs_worker AS w WHERE {LIVE}"

#: This host's newest worker (or the one named), with its heartbeat age and interval.
HEALTH_WORKER = """
SELECT w.worker_id, extract(epoch FROM now() - w.heartbeat_at)::float8, w.interval_seconds
FROM leasejobs_worker AS w
WHERE (%(worker_id)s::text IS NULL AND w.hostname = %(hostname)s) OR w.worker_id = %(worker_id)s
ORDER BY w.started_at DESC
LIMIT 1
"""

#: Every worker row (live, or late until a starting worker forgets it a day
#: later) with the jobs it holds, plus any holder of a held lease without a
#: row. ``live``: a fresh row (``workers.LIVE``), or a held lease, which
#: its holder's heartbeat renewed within one lease.
OVERVIEW = f"""
WITH holders AS (
    SELECT leased_by AS worker_id, count(*) AS jobs, max(COALESCE(heartbeat_at, started_at)) AS beat
    FROM leasejobs_job
    WHERE finished_at IS NULL AND status = 'running' AND lease_until > now()
    GROUP BY leased_by
)
SELECT COALESCE(w.worker_id, h.worker_id), COALESCE(w.hostname, ''), COALESCE(h.jobs, 0),
       now() - COALESCE(w.heartbeat_at, h.beat), w.interval_seconds,
       w.worker_id IS NULL OR {LIVE} OR h.worker_id IS NOT NULL
FROM leasejobs_worker AS w
FULL OUTER JOIN holders AS h ON h.worker_id = w.worker_id
ORDER BY 6 DESC, 1
"""
