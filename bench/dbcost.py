"""What a processing run costs the database, per job: WAL, transactions, row versions, CPU.

Throughput on a machine where PostgreSQL, the workers and the bench share
the cores says little about what a queue costs the primary it lives on.
Queues that publish their cost (awa's WAL bytes per job, Hatchet's
transactions per task) measure it as done here, from PostgreSQL's own
counters read before and after the run:

- WAL bytes: ``pg_current_wal_lsn()`` moved, and full-page images
  (``pg_stat_wal.wal_fpi``). A ``CHECKPOINT`` just before the window makes
  the first change of each page write its whole page, as it does in
  production between checkpoints. WAL is the whole server's: run on a server
  nothing else writes to.
- transactions: commits and rollbacks of this database (``pg_stat_database``);
- row versions: rows inserted, updated and deleted in every table of the
  database (``pg_stat_user_tables``: a queue's jobs, its log or events, its
  workers' rows); each update and delete leaves a dead version. Run each
  queue in a database of its own, as ``bench/compare`` does;
- statements: calls recorded by ``pg_stat_statements`` in this database,
  where that extension is installed;
- PostgreSQL CPU: user + system time of this database's backends from
  ``/proc`` (the server on this machine), not counting the bench's own.

The cumulative statistics reach the shared counters when a backend
reports (at most once a second, and when it exits), so ``read`` is called
after the workers have stopped; the backends' CPU is read while they live
(``backend_cpu``).
"""

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

HZ = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment."""

    wal_bytes: int
    wal_fpi: int | None
    xacts: int
    inserted: int
    updated: int
    deleted: int
    statements: int | None


def checkpoint(conn: psycopg.Connection[Any]) -> bool:
    """Start the window on a fresh checkpoint; False where the role may not (no superuser)."""
    try:
        conn.execute("CHECKPOINT")
    except psycopg.Error:
        return False
    return True


def read(conn: psycopg.Connection[Any]) -> Reading:
    """The counters now (``conn`` in autocommit)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        """
        SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
               d.xact_commit + d.xact_rollback,
               t.ins, t.upd, t.del
        FROM pg_stat_database d,
             (SELECT coalesce(sum(n_tup_ins), 0) AS ins, coalesce(sum(n_tup_upd), 0) AS upd,
                     coalesce(sum(n_tup_del), 0) AS del
              FROM pg_stat_user_tables) t
        WHERE d.datname = current_database()
        """
    ).fetchone()
    assert row is not None
    fpi = _optional(conn, "SELECT wal_fpi FROM pg_stat_wal")
    statements = _optional(
        conn,
        "SELECT sum(calls)::bigint FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return Reading(int(row[0]), fpi, int(row[1]), int(row[2]), int(row[3]), int(row[4]), statements)


def _optional(conn: psycopg.Connection[Any], query: str) -> int | None:
    """A counter this server may not have (a view of a later version, an extension not loaded)."""
    try:
        with conn.transaction():
            row = conn.execute(query).fetchone()
    except psycopg.Error:
        return None
    return None if row is None or row[0] is None else int(row[0])


def backend_cpu(conn: psycopg.Connection[Any], exclude: list[int]) -> dict[int, float]:
    """CPU seconds so far of each backend of this database, except ``exclude``; {} off this machine."""
    pids = [
        int(r[0])
        for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL(%s)",
            [exclude],
        )
    ]
    found: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) / HZ
    return found


def per_job(
    before: Reading,
    after: Reading,
    cpu_before: dict[int, float],
    cpu_after: dict[int, float],
    jobs: int,
    *,
    checkpointed: bool,
) -> dict[str, Any]:
    """The run's cost per job; backends that started during the run count whole."""
    cpu = sum(seconds - cpu_before.get(pid, 0.0) for pid, seconds in cpu_after.items())
    dead = (after.updated - before.updated) + (after.deleted - before.deleted)

    def each(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None else (a - b) / jobs

    return {
        "wal_bytes": (after.wal_bytes - before.wal_bytes) / jobs,
        "wal_fpi": each(after.wal_fpi, before.wal_fpi),
        "xacts": (after.xacts - before.xacts) / jobs,
        "rows_written": (after.inserted - before.inserted + dead) / jobs,
        "dead_rows": dead / jobs,
        "statements": each(after.statements, before.statements),
        "pg_cpu_us": 1e6 * cpu / jobs if cpu_after else None,
        "checkpointed": checkpointed,
    }


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over repeated runs (a figure a run could not read stays None)."""
    merged: dict[str, Any] = {"checkpointed": all(r["checkpointed"] for r in runs)}
    for key in runs[0]:
        if key != "checkpointed":
            values = [r[key] for r in runs if r[key] is not None]
            merged[key] = statistics.median(values) if values else None
    return merged
