"""``localworkers.missing_connections``: when a started worker can be counted on to take a job.

The demo and the bench enqueue only once their workers are ready; a worker
counted ready too early (a connection left by an earlier worker of the same
id, or one of another database) brings back the race that made the demo's
takeover fail on CI.
"""

import pytest
from django.db import connection

from leasejobs.db.connection import WorkerConnection, connection_params
from localworkers import missing_connections

pytestmark = pytest.mark.django_db(transaction=True)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def missing(ids, since):
    with connection.cursor() as cursor:
        return missing_connections(cursor, ids, since)


def test_a_worker_is_ready_once_it_listens_and_its_claim_connection_is_open():
    since = db_now()
    claim = WorkerConnection("claim", "ready-w1")
    listen = WorkerConnection("listen", "ready-w1")
    try:
        assert missing(["ready-w1"], since) == ["leasejobs listen ready-w1", "leasejobs claim ready-w1"]
        claim.connect()
        conn = listen.connect()
        # Connected but not yet listening: an enqueue's NOTIFY would not reach it.
        assert missing(["ready-w1"], since) == ["leasejobs listen ready-w1"]
        conn.execute("LISTEN leasejobs")
        assert missing(["ready-w1"], since) == []
        assert missing(["ready-w1", "ready-w2"], since) == [
            "leasejobs listen ready-w2",
            "leasejobs claim ready-w2",
        ]
    finally:
        claim.close()
        listen.close()


def test_connections_opened_before_the_workers_started_do_not_count():
    claim = WorkerConnection("claim", "ready-old")
    listen = WorkerConnection("listen", "ready-old")
    try:
        claim.connect()
        listen.connect().execute("LISTEN leasejobs")
        # The same ids, as the demo's next scenario starts its workers.
        assert missing(["ready-old"], db_now()) == ["leasejobs listen ready-old", "leasejobs claim ready-old"]
    finally:
        claim.close()
        listen.close()


def test_a_claim_connection_in_another_database_does_not_count():
    since = db_now()
    params = {**connection_params(), "dbname": "postgres"}
    other = WorkerConnection("claim", "ready-elsewhere", params=params)
    try:
        other.connect()
        assert missing(["ready-elsewhere"], since) == [
            "leasejobs listen ready-elsewhere",
            "leasejobs claim ready-elsewhere",
        ]
    finally:
        other.close()
