"""Pooler detection and per-transaction settings, against a real PgBouncer in transaction mode."""

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from leasejobs import enqueue, pooling
from leasejobs.connection import WorkerConnection, connection_params, database_url
from leasejobs.models import Job
from leasejobs.store import CLAIM_SETTINGS
from tests.helpers import ROOT, worker_env
from tests.pgbouncer import PgBouncer, django_through
from tests.testapp.tasks import add

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


@pytest.mark.django_db(transaction=True)
def test_enqueue_through_a_pooler_it_was_not_told_of_recovers_and_stops_preparing(
    bouncer, monkeypatch, caplog
):
    """A project behind a pooler without DISABLE_SERVER_SIDE_CURSORS: a prepared enqueue fails.

    Another client of the pooler's one backend deallocates every prepared
    statement (as a backend lent to someone else would lack them): alone, the
    enqueue runs again unprepared; inside a transaction, which is broken by
    then, it is refused in one sentence. Either way the process stops preparing.
    """
    monkeypatch.setattr(enqueue, "_prepare", True)
    with django_through(bouncer, disable_server_side_cursors=False):
        first = add.enqueue(1, 1)  # prepared on the pooler's one backend
        with psycopg.connect(bouncer.url(connection.settings_dict["NAME"]), autocommit=True) as other:
            other.execute("DEALLOCATE ALL")
        second = add.enqueue(2, 2)
        assert "set DISABLE_SERVER_SIDE_CURSORS to True there" in caplog.text
        assert enqueue._prepare is False
        assert sorted(Job.objects.values_list("id", flat=True)) == [first.id, second.id]

        monkeypatch.setattr(enqueue, "_prepare", True)
        connection.close()  # a new process: its own connection, nothing prepared yet
        add.enqueue(3, 3)
        with psycopg.connect(bouncer.url(connection.settings_dict["NAME"]), autocommit=True) as other:
            other.execute("DEALLOCATE ALL")
        with pytest.raises(DatabaseError, match="goes through a transaction pooler"), transaction.atomic():
            add.enqueue(4, 4)
        assert enqueue._prepare is False
        add.enqueue(5, 5)
        assert sorted(Job.objects.values_list("args", flat=True)) == [[1, 1], [2, 2], [3, 3], [5, 5]]
