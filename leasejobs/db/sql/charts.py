"""The overview's charts: four queries over the jobs table, and the stored points
of closed buckets (``leasejobs_chartpoint``), run by ``leasejobs.db.chartpoints``."""

#: Every bucket start from ``since`` (a bucket start) to now, oldest first; the last
#: one is the current, still open bucket.
_BUCKETS = """
buckets AS (SELECT generate_series(%(since)s::timestamptz, now(), %(step)s) AS t)"""

#: The start of the bucket that holds the moment %(ago)s before now, on the
#: database clock (ago zero: the current bucket).
BUCKET_AGO = "SELECT date_bin(%(step)s, now() - %(ago)s, TIMESTAMPTZ '2000-01-01')"

#: The start of the first bucket that may still change: the one that holds the
#: moment %(ago)s before now, or the start of the oldest transaction open on this
#: database, if earlier. A job's ``created_at`` is its enqueuing transaction's
#: start (``now()``), so a transaction open across a bucket's end can still add
#: a job to the backlog of a bucket that has closed; only the sessions this role
#: may see count (its own, or all with ``pg_read_all_stats``), the others are
#: covered by %(ago)s alone.
UNSETTLED_BUCKET = """
SELECT date_bin(%(step)s,
                LEAST(now() - %(ago)s,
                      (SELECT min(xact_start) FROM pg_stat_activity
                       WHERE datname = current_database() AND pid <> pg_backend_pid())),
                TIMESTAMPTZ '2000-01-01')"""

#: The keeper's bounds: a lock held on the points table (a migration, a
#: ``VACUUM FULL``) fails its step at once instead of holding up the vacuum
#: thread that runs it, and no step runs for more than a minute.
KEEP_BOUNDS = "SELECT set_config('lock_timeout', '1s', true), set_config('statement_timeout', '60s', true)"

THROUGHPUT = f"""
WITH {_BUCKETS},
agg AS (
    SELECT date_bin(%(step)s, finished_at, TIMESTAMPTZ '2000-01-01') AS t,
           count(*) AS finished, count(*) FILTER (WHERE status = 'failed') AS failed
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
    GROUP BY 1
)
SELECT b.t, COALESCE(a.finished, 0), COALESCE(a.failed, 0)
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

QUEUE_TIME = f"""
WITH {_BUCKETS},
agg AS (
    SELECT date_bin(%(step)s, finished_at, TIMESTAMPTZ '2000-01-01') AS t,
           percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (
               ORDER BY extract(epoch FROM started_at - run_at)) AS p
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
      AND started_at IS NOT NULL AND isfinite(run_at)  -- '-infinity' (by SQL) has no queue time
    GROUP BY 1
)
SELECT b.t, a.p[1], a.p[2]
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

#: The jobs that can matter to a window: active now, or finished within it.
_RECENT = """
recent AS (
    SELECT queue, status, run_at, created_at, started_at, finished_at, attempt, errors, last_error
    FROM leasejobs_job WHERE finished_at IS NULL
    UNION ALL
    SELECT queue, status, run_at, created_at, started_at, finished_at, attempt, errors, last_error
    FROM leasejobs_job
    WHERE status IN ('done', 'failed', 'cancelled') AND finished_at >= (SELECT min(t) FROM buckets)
)"""

BACKLOG = f"""
WITH {_BUCKETS}, {_RECENT},
spans AS (
    SELECT queue, GREATEST(run_at, created_at) AS enter,
           CASE WHEN status = 'queued' THEN 'infinity'::timestamptz
                WHEN started_at >= GREATEST(run_at, created_at) THEN started_at
                ELSE COALESCE(finished_at, 'infinity'::timestamptz) END AS leave
    FROM recent
),
events AS (
    SELECT queue, GREATEST(date_bin(%(step)s, enter, TIMESTAMPTZ '2000-01-01'),
                           (SELECT min(t) FROM buckets)) AS t, 1 AS d
    FROM spans WHERE enter <= now() AND leave > (SELECT min(t) FROM buckets) AND leave > enter
    UNION ALL
    SELECT queue, date_bin(%(step)s, leave, TIMESTAMPTZ '2000-01-01'), -1
    FROM spans WHERE enter <= now() AND leave > (SELECT min(t) FROM buckets) AND leave > enter
                 AND leave <= now()
),
per_bucket AS (SELECT queue, t, sum(d) AS d FROM events GROUP BY queue, t),
queues AS (SELECT DISTINCT queue FROM per_bucket)
SELECT b.t, q.queue,
       sum(COALESCE(p.d, 0)) OVER (PARTITION BY q.queue ORDER BY b.t)::int AS backlog
FROM buckets AS b CROSS JOIN queues AS q
LEFT JOIN per_bucket AS p ON p.queue = q.queue AND p.t = b.t
ORDER BY q.queue, b.t
"""

LEASES_LOST = f"""
WITH {_BUCKETS}, {_RECENT},
agg AS (
    SELECT date_bin(%(step)s, started_at, TIMESTAMPTZ '2000-01-01') AS t,
           sum(GREATEST(0, attempt - COALESCE(jsonb_array_length(errors), 0)
                           - CASE WHEN status = 'queued' THEN 0 ELSE 1 END)
               + CASE WHEN status = 'failed' AND last_error LIKE 'lease expired on the last run%%'
                      THEN 1 ELSE 0 END) AS lost
    FROM recent
    WHERE started_at >= (SELECT min(t) FROM buckets)
    GROUP BY 1
)
SELECT b.t, COALESCE(a.lost, 0)::int
FROM buckets AS b LEFT JOIN agg AS a USING (t)
ORDER BY b.t
"""

QUERIES = {"throughput": THROUGHPUT, "queue_time": QUEUE_TIME, "backlog": BACKLOG, "leases_lost": LEASES_LOST}

#: Stored points of closed buckets: (chart, step, bucket) rows; a bucket with
#: no data is stored as one row with series '' so it is not computed again.
READ_POINTS = """
SELECT t, series, value FROM leasejobs_chartpoint
WHERE chart = %(chart)s AND step_seconds = %(step_seconds)s AND t >= %(first)s AND t < %(current)s
"""

WRITE_POINTS = """
INSERT INTO leasejobs_chartpoint (chart, step_seconds, t, series, value)
SELECT %(chart)s, %(step_seconds)s, p.t, p.series, p.value
FROM unnest(%(ts)s::timestamptz[], %(series)s::text[], %(values)s::float8[]) AS p(t, series, value)
ON CONFLICT (chart, step_seconds, t, series) DO NOTHING
"""

#: Who stores closed buckets as they close: one transaction at a time, the others
#: do not wait (a key of its own: the one-key form never meets the two-key
#: locks of ``steps.LOCK_EVENT_KEY``).
KEEP_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('leasejobs_chartpoint'))"

#: Points are kept two days: the longest window is one.
FORGET_POINTS = "DELETE FROM leasejobs_chartpoint WHERE t < now() - interval '2 days'"

#: Compiling these short queries (JIT) costs more than it saves (docs/performance.md).
JIT_OFF = "SET LOCAL jit = off"
