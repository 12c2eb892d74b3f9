"""Pooler detection and per-transaction settings, against a real PgBouncer in transaction mode."""

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from leasejobs.db import pooling
from leasejobs.db.connection import WorkerConnection, connection_params
from leasejobs.db.store import CLAIM_SETTINGS
from leasejobs.worker.events import Events
from leasejobs.worker.listener import listen
from tests.helpers import ROOT, database_url, wait_until, worker_env
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
    assert "leasejobs.E012" in done.stderr and "DISABLE_SERVER_SIDE_CURSORS" in done.stderr
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


#: The pooler the hostile review's start-up probe missed: two idle server
#: connections lent in turn, and the worker's startup options accepted (and ignored).
ROUND_ROBIN = "server_round_robin = 1\nignore_startup_parameters = options\n"


def test_the_listener_goes_on_through_a_pooler_the_probe_missed(db):
    """A LISTEN prepared on one server connection and run on the other fails; before, the
    listener thread died of it and took the worker down (exit 70, crash-looping). Now it
    sends no prepared statement, and any error only ends one LISTEN session."""
    bouncer = PgBouncer(
        "127.0.0.1", int(connection.settings_dict["PORT"] or 5432), pool_size=2, extra=ROUND_ROBIN
    )
    try:
        params = pooled_params(bouncer)
        done = threading.Event()
        died: list[BaseException] = []
        wakes: list[str | None] = []

        def run() -> None:
            try:
                wake = lambda q, via, places: wakes.append(q)  # noqa: E731
                listen(params, "leasejobs", "rr", None, wake, done, Events("rr"))
            except BaseException as exc:
                died.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(3)
        done.set()
        thread.join(timeout=10)
        assert not thread.is_alive() and died == [], died
        assert None in wakes, "it connected and LISTENed"
    finally:
        bouncer.remove()


def test_the_listener_outlives_a_prepared_statement_gone_and_listens_again(db, monkeypatch):
    """The error the hostile review's worker died of (SQLSTATE 26000), injected into the first
    LISTEN session: the listener logs it, reconnects, listens again, and never raises."""
    from leasejobs.worker import listener

    sessions = []

    class FirstSessionFails(listener.WorkerConnection):
        def connect(self) -> psycopg.Connection:
            conn = super().connect()
            assert conn.prepare_threshold is None, "the listener never prepares a statement"
            sessions.append(conn)
            if len(sessions) == 1:
                raise psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')
            return conn

    monkeypatch.setattr(listener, "WorkerConnection", FirstSessionFails)
    done = threading.Event()
    died: list[BaseException] = []
    wakes: list[str | None] = []

    def run() -> None:
        try:
            listen(
                connection_params(),
                "leasejobs",
                "ps",
                None,
                lambda q, via, places: wakes.append(q),
                done,
                Events("ps"),
            )
        except BaseException as exc:
            died.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: len(sessions) >= 2 and None in wakes, timeout=10, what="a second LISTEN session")
    done.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and died == [], died
