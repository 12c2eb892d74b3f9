"""Whether autovacuum looks after the job table, and what to tell a user when it does not.

Every claim and every finish writes a new version of the job's row (neither
can be a HOT update: both change ``status``, which the claim index's predicate
reads), and each leaves a dead version behind in the table and its indexes.
Only VACUUM removes them. With autovacuum off, server-wide or for
``leasejobs_job``, they pile up without end: every claim walks the claim index
past the dead entries of the jobs drained since the last VACUUM and slows
down as they grow, and the table and its indexes bloat. Nothing breaks, so
nothing says so: ``runworker`` logs a warning at start, and the database
system check ``leasejobs.W001`` reports it.
"""

from typing import Any

import psycopg

from leasejobs.db import maintenance


def problem(server: bool, table: bool) -> str | None:
    """The sentence to show when autovacuum does not visit the job table, else None."""
    if server and table:
        return None
    where = (
        "autovacuum does not run on this PostgreSQL server (autovacuum or track_counts is off)"
        if not server
        else "autovacuum is off for leasejobs_job (autovacuum_enabled = false)"
    )
    return (
        f"{where}: every claim and finish leaves a dead row version that only VACUUM removes, "
        "so claims slow down and the table bloats as they pile up; turn it on, or run "
        "VACUUM leasejobs_job often."
    )


def status_problem(conn: psycopg.Connection[Any]) -> str | None:
    """``problem`` for the database ``conn`` is connected to.

    None when the job table does not exist yet (``migrate`` reports that),
    and when the role may not read the catalog: a warning that cannot be
    checked is no reason to keep a worker from starting.
    """
    try:
        row = maintenance.autovacuum_status(conn)
    except psycopg.Error:
        if not conn.autocommit:
            conn.rollback()
        return None
    return None if row is None else problem(bool(row[0]), bool(row[1]))
