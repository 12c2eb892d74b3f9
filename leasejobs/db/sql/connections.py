"""One-line statements of connection set-up and checks, and the database clock."""

#: The server process of a connection (``leasejobs.db.pooling`` tells a pooler by it).
BACKEND_PID = "SELECT pg_backend_pid()"

#: Whether the job table exists (``runworker``'s start: migrated or not).
TABLE_EXISTS = "SELECT to_regclass('leasejobs_job') IS NOT NULL"

#: The database clock at the start of the transaction (``now()``).
NOW = "SELECT now()"

#: The database clock at this statement (inside a test's transaction ``now()`` stands still).
STATEMENT_NOW = "SELECT statement_timestamp()"

#: The planner's count of a table's rows (-1 before its first ANALYZE).
TABLE_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass"

#: The most common values of a text column, as the table's last ANALYZE
#: sampled them (``pg_stats``; none before the first ANALYZE).
COMMON_VALUES = """
SELECT unnest(s.most_common_vals::text::text[])
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname
WHERE c.oid = %s::regclass AND s.attname = %s
"""

#: JIT off for this transaction (``leasejobs.testing``'s claims inside a test's transaction).
JIT_OFF_LOCAL = "SELECT set_config('jit', 'off', true)"

#: JIT off for the session, returning what it was, to be put back with ``JIT_BACK``.
JIT_OFF_SESSION = "SELECT current_setting('jit'), set_config('jit', 'off', false)"

#: Put the session's JIT setting back.
JIT_BACK = "SELECT set_config('jit', %s, false)"
