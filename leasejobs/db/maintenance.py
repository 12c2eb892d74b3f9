"""The statements of start-up checks and of the worker's vacuum thread, on psycopg connections.

``runworker``'s start checks the database on a short-lived connection of its
own (reachable, migrated, autovacuum on); the pooler check reads a
connection's server process; the vacuum thread runs on its own autocommit
``WorkerConnection``, where it also stores the overview charts' closed
buckets as they close (``leasejobs.db.chartpoints``). Their texts are
``leasejobs.db.sql``'s.
"""

import datetime as dt
from typing import Any

import psycopg

from leasejobs.db import chartpoints
from leasejobs.db.connection import WorkerConnection
from leasejobs.db.sql import connections as conn_sql
from leasejobs.db.sql import vacuum

Row = tuple[Any, ...]


def table_exists(conn: psycopg.Connection[Any]) -> bool:
    """Whether the job table exists (``migrate`` has run)."""
    found = conn.execute(conn_sql.TABLE_EXISTS).fetchone()
    return bool(found and found[0])


def autovacuum_status(conn: psycopg.Connection[Any]) -> Row | None:
    """(server runs autovacuum, the job table allows it); None without the table."""
    return conn.execute(vacuum.AUTOVACUUM_STATUS).fetchone()


def backend_pid(conn: psycopg.Connection[Any]) -> int:
    """The server process ``conn`` talks to."""
    row = conn.execute(conn_sql.BACKEND_PID).fetchone()
    assert row is not None
    return int(row[0])


def look(conn: WorkerConnection) -> list[Row]:
    """The vacuum thread's look at the job table (``VACUUM_LOOK``): no row without the table."""
    return conn.execute(vacuum.VACUUM_LOOK)


def may_vacuum(conn: WorkerConnection) -> list[Row]:
    """Whether this role may VACUUM the job table (``MAY_VACUUM``)."""
    return conn.execute(vacuum.MAY_VACUUM)


def vacuum_jobs(conn: WorkerConnection) -> None:
    """VACUUM the job table (``VACUUM``), outside any transaction."""
    conn.execute(vacuum.VACUUM)


def keep_chart_points(conn: WorkerConnection, settled: dt.timedelta) -> tuple[int | None, dt.datetime]:
    """Store the charts' closed buckets not stored yet (``chartpoints.keep``: how many, None
    when another worker does it now), in one transaction; and the database clock."""
    with conn.transaction() as cursor:
        computed = chartpoints.keep(cursor, settled)
        cursor.execute(conn_sql.STATEMENT_NOW)
        row = cursor.fetchone()
        assert row is not None
        return computed, row[0]
