"""Autovacuum switched off for the job table is said at start, not discovered as bloat weeks later.

Nothing fails without autovacuum: claims slow down as dead row versions pile
up (docs/performance.md). So ``runworker`` logs one warning line at start
and the database system check ``leasejobs.W001`` reports it. The machine's
own server may run with autovacuum on or off; the table's switch is what the
tests turn, and the statement must see both.
"""

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from leasejobs.autovacuum import STATUS
from leasejobs.connection import connection_params
from tests.helpers import ROOT, worker_env


@pytest.fixture
def table_autovacuum_off(transactional_db: None) -> Iterator[None]:
    """``leasejobs_job`` with ``autovacuum_enabled = false``, committed where subprocesses see it."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE leasejobs_job RESET (autovacuum_enabled)")


def _status() -> tuple[bool, bool]:
    with psycopg.connect(**connection_params()) as conn:
        row = conn.execute(STATUS).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def test_the_statement_reads_the_servers_switch_and_the_tables(table_autovacuum_off):
    server, table = _status()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::boolean")
        assert server is cursor.fetchone()[0]
    assert table is False
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job RESET (autovacuum_enabled)")
    assert _status() == (server, True)


def test_the_database_check_warns_and_does_not_fail(table_autovacuum_off):
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "leasejobs.W001" in done.stderr
    assert "dead row version that only VACUUM removes" in done.stderr


def test_runworker_logs_one_warning_at_start_and_runs(start_worker, table_autovacuum_off):
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0
    assert worker.count(r"WARNING.*autovacuum is off") == 1, worker.log()
