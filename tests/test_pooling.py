"""Pooler detection and per-transaction settings, against a real PgBouncer in transaction mode."""

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from leasejobs import pooling
from leasejobs.connection import WorkerConnection, connection_params, database_url
from leasejobs.store import CLAIM_SETTINGS
from tests.helpers import ROOT, worker_env
from tests.pgbouncer import PgBouncer

SHOW = "SELECT current_setting('lock_timeout'), current_setting('enable_seqscan')"


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    # One server connection: every client shares it, so a leaked setting would show.
    found = PgBouncer("127.0.0.1", int(connection.settings_dict["PORT"] or 5432), pool_size=1)
    yield found
    found.remove()


def pooled_params(bouncer: PgBouncer) -> dict[str, object]:
    return psycopg.conninfo.conninfo_to_dict(bouncer.url(connection.settings_dict["NAME"]))


def test_a_direct_connection_is_not_taken_for_a_pooler(db):
    assert pooling.detect(connection_params()) is False


def test_pgbouncer_in_transaction_mode_is_detected(db, bouncer):
    assert pooling.detect(pooled_params(bouncer)) is True


def test_statement_settings_hold_for_their_transaction_only_and_leak_to_no_other_client(db, bouncer):
    params = pooled_params(bouncer)
    claim = WorkerConnection("claim", "t", settings=CLAIM_SETTINGS, pooled=True, params=params)
    other = WorkerConnection("other", "t", pooled=True, params=params)
    try:
        assert claim.execute(SHOW) == [("5s", "off")]
        assert other.execute(SHOW) == [("0", "on")]  # the same server connection, nothing left on it
        assert claim.execute(SHOW) == [("5s", "off")]
    finally:
        claim.close()
        other.close()


def test_through_a_pooler_without_the_settings_django_needs_the_check_fails(db, bouncer):
    env = worker_env(
        DATABASE_URL=bouncer.url(connection.settings_dict["NAME"]), DJANGO_DISABLE_SERVER_SIDE_CURSORS="0"
    )
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "leasejobs.E010" in done.stderr and "DISABLE_SERVER_SIDE_CURSORS" in done.stderr
    env["DJANGO_DISABLE_SERVER_SIDE_CURSORS"] = "1"
    assert (
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
        ).returncode
        == 0
    )
    env["DATABASE_URL"] = database_url()
    env["DJANGO_DISABLE_SERVER_SIDE_CURSORS"] = "0"
    direct = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--database", "default"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert direct.returncode == 0  # direct: server-side cursors are fine


def test_a_pooler_the_probe_missed_costs_the_worker_nothing(db, bouncer):
    """Not told it is pooled, a connection's startup options are refused; it goes on pooled."""
    params = pooled_params(bouncer)
    first = WorkerConnection("claim", "a", settings=CLAIM_SETTINGS, params=params)  # not told: pooled=False
    second = WorkerConnection("claim", "b", settings=CLAIM_SETTINGS, params=params)
    try:
        assert first.execute(SHOW) == [("5s", "off")]  # its settings hold, per transaction
        assert first.pooled is True
        assert second.execute(SHOW) == [("5s", "off")]  # no prepared statement to collide with
        assert second.pooled is True
    finally:
        first.close()
        second.close()
