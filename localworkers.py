"""``runworker`` processes that the demo, the bench and the tests start from a Django process.

Two things they all need and the library does not: the URL of the database
this process uses, to hand to the workers they start (``database_url``), and
when those workers can be counted on to take a job (``missing_connections``).
Enqueueing before then brings back a race: a worker still starting misses
the job's NOTIFY, and another worker takes a job meant to show a takeover.

It lives at the top of the repository beside ``localdb``, apart from the
library (not in the wheel) and from the demo, the bench and the tests,
because all three use it.
"""

from datetime import datetime
from typing import Any
from urllib.parse import quote

from django.db import connections

from leasejobs.conf import db_alias
from leasejobs.db.connection import application_name

#: Which of the named connections are open and ready: a claim connection in
#: this database as soon as it is open, a listen connection (which LISTEN_URL
#: may put in another database) once it has sent its LISTEN; each opened at
#: or after the given time, so that one left by an earlier worker of the same
#: id does not count.
_READY_SQL = (
    "SELECT DISTINCT application_name FROM pg_stat_activity"
    " WHERE application_name = ANY(%s) AND backend_start >= %s"
    " AND (application_name LIKE 'leasejobs claim %%' AND datname = current_database()"
    " OR application_name LIKE 'leasejobs listen %%' AND query LIKE 'LISTEN%%')"
)


def missing_connections(cursor: Any, worker_ids: list[str], since: datetime) -> list[str]:
    """The workers' connections not yet ready (none once every worker could take a job).

    A worker opens its claim connection when its claim loop starts, after
    its other threads; from then on it finds a job at its next poll, and
    once it listens an enqueue's NOTIFY wakes it at once. ``since`` is a
    time on the database's clock taken before the workers started;
    ``cursor`` is a psycopg or a Django cursor.
    """
    names = [application_name(purpose, w) for w in worker_ids for purpose in ("listen", "claim")]
    cursor.execute(_READY_SQL, [names, since])
    ready = {row[0] for row in cursor.fetchall()}
    return [name for name in names if name not in ready]


def database_url() -> str:
    """A ``postgres://`` URL of the queue's database, as it is now.

    For starting ``runworker`` processes on the same database as this one
    (with ``DATABASE_URL``): in a test run that is the test database, whose
    name only the settings in memory know.
    """
    s = connections[db_alias()].settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    host = s["HOST"] or "localhost"
    return f"postgres://{auth}@{host}:{s['PORT'] or 5432}/{s['NAME']}"
