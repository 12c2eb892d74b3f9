"""Vacuum: the worker's vacuum thread, on its own autocommit connection, and the
autovacuum check of runworker's start."""

#: What the vacuum thread looks at every second, for the job table: its dead
#: and live row versions, from the statistics every backend reports (a
#: second late when it is busy, up to ten when it has gone idle); whether
#: PostgreSQL counts them at all (``track_counts``); how many VACUUMs, manual
#: and automatic, it has had (one that ended since the last look left its
#: remainder in the dead count); and whether a VACUUM of it is running now in
#: this database (another worker's of the same role: others' are visible only
#: to roles that may read all statistics, and SKIP_LOCKED covers them); and
#: the oldest xid another backend of this database holds, as its own or as
#: its snapshot's xmin (NULL: none), which is what holds back the horizon of
#: a VACUUM of this table. Any role may read ``backend_xid`` and
#: ``backend_xmin``; backends of other databases do not hold this table's
#: rows (their xids made the cluster-wide snapshot xmin used before wrong:
#: another database's transaction ending brought forward a VACUUM in vain).
#: No row when the table does not exist.
VACUUM_LOOK = """
SELECT pg_stat_get_dead_tuples(t.oid),
       pg_stat_get_live_tuples(t.oid),
       current_setting('track_counts')::boolean,
       pg_stat_get_vacuum_count(t.oid) + pg_stat_get_autovacuum_count(t.oid),
       EXISTS (SELECT FROM pg_stat_progress_vacuum AS p
               WHERE p.relid = t.oid
                 AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database())),
       (SELECT h.xid::text::bigint
        FROM pg_stat_activity AS a,
             LATERAL (VALUES (a.backend_xid), (a.backend_xmin)) AS h(xid)
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND h.xid IS NOT NULL
        ORDER BY age(h.xid) DESC
        LIMIT 1)
FROM (SELECT to_regclass('leasejobs_job') AS oid) AS t
WHERE t.oid IS NOT NULL
"""

#: Whether this role may VACUUM the job table, as PostgreSQL decides it: the
#: table's owner (or a member of its role, or a superuser), the database's
#: owner, and from PostgreSQL 17 a role granted MAINTAIN. Anyone else's
#: VACUUM is a notice and no work. NULL when the table does not exist.
MAY_VACUUM = """
SELECT pg_has_role(c.relowner, 'USAGE')
       OR pg_has_role(d.datdba, 'USAGE')
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END
FROM pg_class AS c, pg_database AS d
WHERE c.oid = to_regclass('leasejobs_job') AND d.datname = current_database()
"""

#: Remove the job table's dead row versions, unthrottled (a manual VACUUM has
#: no cost delay). SKIP_LOCKED: when another worker (or autovacuum) is
#: vacuuming it already, PostgreSQL says so in a notice and returns at once,
#: instead of queueing behind it. TRUNCATE false: giving the empty pages at
#: the table's end back to the system takes an ACCESS EXCLUSIVE lock, which
#: would stop every claim and finish meanwhile; autovacuum does that when it
#: can without waiting. It cannot run in a transaction block.
VACUUM = "VACUUM (SKIP_LOCKED, TRUNCATE false) leasejobs_job"

#: The server's switches (autovacuum needs ``track_counts`` too, to know what
#: to visit) and the job table's own ``autovacuum_enabled`` (unset: on). All
#: must be on for autovacuum to visit the table.
AUTOVACUUM_STATUS = """
SELECT current_setting('autovacuum')::boolean AND current_setting('track_counts')::boolean,
       COALESCE((SELECT option_value::boolean FROM pg_options_to_table(c.reloptions)
                 WHERE option_name = 'autovacuum_enabled'), true)
FROM pg_class AS c
WHERE c.oid = to_regclass('leasejobs_job')
"""
