"""The two statements of periodic jobs, run by ``leasejobs.periodic.scheduler``.

Both run on the scheduler thread's Django connection in autocommit, so each
is its own transaction, and both take every time from the database clock
(``now()``): a worker's own clock never decides whether a tick is due.
"""

from leasejobs.db.sql.fragments import keyed_payload

#: Make sure each schedule this worker declares has its row, and take over a
#: schedule whose definition changed. A new schedule starts at ``now()``
#: (nothing fires for the past). A row with another ``signature`` is taken
#: over only by a worker that started (``started_at``, the database time of
#: its first REGISTER) no earlier than the worker that wrote it: the newest
#: deploy's definition wins, and its ``last_tick`` moves to ``now()`` so the
#: new expression does not fire for the past either. Returns one row per
#: declared name: the signature the row now has and its last tick.
REGISTER = """
WITH input AS (
    SELECT *
    FROM unnest(
        %(names)s::text[], %(task_names)s::text[], %(crons)s::text[], %(timezones)s::text[],
        %(signatures)s::text[]
    ) AS r(name, task_name, cron, timezone, signature)
),
started AS (
    SELECT COALESCE(%(started_at)s::timestamptz, now()) AS at
),
written AS (
    INSERT INTO leasejobs_periodic_schedule AS s (
        name, task_name, cron, timezone, signature, declared_at, last_tick,
        enqueued, skipped, created_at, updated_at
    )
    SELECT r.name, r.task_name, r.cron, r.timezone, r.signature, started.at, now(), 0, 0, now(), now()
    FROM input r CROSS JOIN started
    ON CONFLICT (name) DO UPDATE
    SET task_name = excluded.task_name, cron = excluded.cron, timezone = excluded.timezone,
        signature = excluded.signature, declared_at = excluded.declared_at,
        last_tick = GREATEST(s.last_tick, now()), updated_at = now()
    WHERE s.signature <> excluded.signature AND s.declared_at <= excluded.declared_at
    RETURNING s.name, s.signature, s.last_tick
)
SELECT now(), started.at, r.name,
       COALESCE(w.signature, s.signature), COALESCE(w.last_tick, s.last_tick), w.name IS NOT NULL
FROM input r
CROSS JOIN started
LEFT JOIN written w ON w.name = r.name
LEFT JOIN leasejobs_periodic_schedule s ON s.name = r.name
"""

#: Decide one schedule's due ticks and insert their jobs, in one statement.
#:
#: The schedule's row is locked (``prev``) only if one of the candidate
#: ticks is after its ``last_tick`` and not after ``now()``, and only such
#: ticks count. A second worker running the same statement for the same
#: tick waits for the lock, then finds the advanced ``last_tick`` (the lock
#: re-checks its condition on the newest row) and does nothing. ``last_tick``
#: only moves forward and moves in the same transaction as the insert, so a
#: tick is decided exactly once; the job's idempotency key (schedule and
#: tick) under its unique constraint makes a duplicate impossible even if
#: the row were reset. When nothing is due, or another worker was first, the
#: statement locks and writes nothing: a read, with no commit to flush.
#:
#: Rows match only the worker's own ``signature``: a worker whose definition
#: was replaced by a newer deploy changes nothing (and learns it from the
#: NULL ticks). ``keep`` is how many of the latest due ticks are enqueued:
#: ``max_catch_up`` for catch-up "all", 1 otherwise (catch-up "latest"/"none",
#: or overlap off); the worker may send one more due tick than that (a tick
#: of its lookahead the database has reached). ``late_seconds`` drops a tick
#: later than that (catch-up "none"); ``overlap`` false drops every tick
#: while the schedule's previous job is queued or running. Ticks not
#: enqueued are counted in ``skipped``.
TICK = f"""
WITH candidates AS (
    SELECT c.tick, c.run_at, c.key
    FROM unnest(%(ticks)s::timestamptz[], %(run_ats)s::timestamptz[], %(keys)s::text[])
        AS c(tick, run_at, key)
    WHERE c.tick <= now()
),
current AS (
    SELECT last_tick FROM leasejobs_periodic_schedule
    WHERE name = %(name)s AND signature = %(signature)s
),
prev AS (
    SELECT name, last_tick, last_job_id
    FROM leasejobs_periodic_schedule
    WHERE name = %(name)s AND signature = %(signature)s
      AND last_tick < (SELECT max(tick) FROM candidates)
    FOR UPDATE
),
due AS (
    SELECT c.tick, c.run_at, c.key
    FROM prev CROSS JOIN candidates c
    WHERE c.tick > prev.last_tick
),
busy AS (
    SELECT EXISTS (
        SELECT 1 FROM prev JOIN leasejobs_job j ON j.id = prev.last_job_id
        WHERE NOT %(overlap)s AND j.finished_at IS NULL
    ) AS busy
),
wanted AS (
    SELECT d.tick, d.run_at, d.key
    FROM due d CROSS JOIN busy
    WHERE NOT busy.busy
      AND d.tick >= (SELECT min(l.tick) FROM (SELECT tick FROM due ORDER BY tick DESC LIMIT %(keep)s) AS l)
      AND (%(late_seconds)s::float8 IS NULL OR d.tick >= now() - make_interval(secs => %(late_seconds)s))
),
inserted AS (
    INSERT INTO leasejobs_job (
        task_name, queue, priority, args, kwargs, status, attempt, max_attempts,
        run_at, leased_by, cancel_requested, idempotency_key, last_error,
        errors, worker_ids, created_at
    )
    SELECT %(task_name)s, %(queue)s, %(priority)s, %(args)s::jsonb, %(kwargs)s::jsonb,
           'queued', 0, %(max_attempts)s, w.run_at, '', false, w.key, '', NULL, NULL, now()
    FROM wanted w
    ORDER BY w.tick
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, priority, run_at, idempotency_key AS key
),
moved AS (
    UPDATE leasejobs_periodic_schedule s
    SET last_tick = (SELECT max(tick) FROM due),
        last_job_id = COALESCE((SELECT max(id) FROM inserted), s.last_job_id),
        enqueued = s.enqueued + (SELECT count(*) FROM inserted),
        skipped = s.skipped + (SELECT count(*) FROM due) - (SELECT count(*) FROM wanted),
        updated_at = now()
    FROM prev
    WHERE s.name = prev.name
    RETURNING s.last_tick
),
notified AS (
    SELECT pg_notify(%(channel)s, {keyed_payload("%(queue)s", "f", due=True)})
    FROM (SELECT priority, run_at, id FROM inserted WHERE run_at <= now() ORDER BY id LIMIT 1) AS f
)
SELECT now(),
       (SELECT last_tick FROM current),
       (SELECT max(tick) FROM candidates),
       (SELECT last_tick FROM moved),
       ARRAY(SELECT id FROM inserted ORDER BY id),
       ARRAY(SELECT key FROM inserted ORDER BY id),
       (SELECT count(*) FROM due) - (SELECT count(*) FROM wanted),
       (SELECT busy FROM busy),
       (SELECT count(*) FROM notified)
"""
