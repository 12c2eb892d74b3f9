"""Autovacuum switched off for the job table is said at start, not discovered as bloat weeks later.

Nothing fails without autovacuum: claims slow down as dead row versions pile
up (docs/performance.md). So ``runworker`` logs one warning line at start
and the database system check ``leasejobs.W001`` reports it. The server a
test runs on may have autovacuum on or off (this machine's PostgreSQL 15 has
it off, the embedded PostgreSQL 18 on): the tests turn the table's switch
and expect the sentence ``problem`` gives for the server they are on, so on
one server the table's sentence is checked and on the other the server's.
"""

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from leasejobs.db.connection import connection_params
from leasejobs.db.sql.vacuum import AUTOVACUUM_STATUS as STATUS
from leasejobs.operations.autovacuum import problem
from tests.chaos.helpers import SETTINGS
from tests.helpers import ROOT, worker_env
from tests.integration import test_least_privilege

worker_role = test_least_privilege.worker_role


def _changed(change: str, undo: str) -> Iterator[None]:
    """``change`` committed (subprocesses see it) for the test, ``undo`` after it, whatever happened."""
    with connection.cursor() as cursor:
        cursor.execute(change)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(undo)


@pytest.fixture
def table_autovacuum_off(transactional_db: None) -> Iterator[None]:
    """``leasejobs_job`` with ``autovacuum_enabled = false``."""
    yield from _changed(
        "ALTER TABLE leasejobs_job SET (autovacuum_enabled = false)",
        "ALTER TABLE leasejobs_job RESET (autovacuum_enabled)",
    )


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


def _server_vacuums() -> bool:
    return _status()[0]


def test_the_database_check_warns_and_does_not_fail(table_autovacuum_off):
    expected = problem(server=_server_vacuums(), table=False)
    assert expected is not None
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"(leasejobs.W001) {expected}" in done.stderr


def test_runworker_logs_one_warning_at_start_and_runs(start_worker, table_autovacuum_off):
    expected = problem(server=_server_vacuums(), table=False)
    assert expected is not None
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0
    assert worker.log().count(f"WARNING leasejobs.worker {expected}") == 1, worker.log()


def test_with_the_tables_switch_on_the_warning_follows_the_server(start_worker, transactional_db):
    expected = problem(server=_server_vacuums(), table=True)
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0
    warnings = worker.count(r"WARNING leasejobs\.worker autovacuum")
    assert warnings == (0 if expected is None else 1), worker.log()
    if expected is not None:
        assert expected in worker.log()


@pytest.fixture
def catalog_hidden(transactional_db: None) -> Iterator[None]:
    """``pg_class`` not readable by PUBLIC in the test database."""
    yield from _changed(
        "REVOKE SELECT ON pg_catalog.pg_class FROM PUBLIC", "GRANT SELECT ON pg_catalog.pg_class TO PUBLIC"
    )


def test_a_role_that_may_not_read_the_catalog_still_starts_its_worker(
    start_worker, worker_role, catalog_hidden
):
    """The check cannot be made: no warning, and above all no refusal to start."""
    worker = start_worker("--burst", env={"DATABASE_URL": worker_role, "DJANGO_SETTINGS_MODULE": SETTINGS})
    assert worker.wait(timeout=60) == 0, worker.log()[-3000:]
    assert "Cannot reach" not in worker.log()
    assert "autovacuum" not in worker.log()
