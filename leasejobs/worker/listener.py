"""The listener: wakes the claim loop on NOTIFY from a dedicated connection.

The wake-up names the queue the NOTIFY carried, so the claim loop can tell a
limited queue's news (a job enqueued, a place freed) from any other's.

That connection must reach PostgreSQL directly, never through a transaction
pooler (see ``leasejobs.db.pooling``): it is the queue's database when that is
direct, else ``LEASEJOBS["LISTEN_URL"]`` or ``["LISTEN_DATABASE"]``.
"""

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from leasejobs.db.connection import WorkerConnection
from leasejobs.worker.events import Events

#: What ends one LISTEN session and starts the next: any error of the
#: connection or of the server, including a transaction pooler's that the
#: start-up probe did not see (a prepared statement gone, a read-only
#: server). The listener is only a shortcut: polling finds every job anyway,
#: so it never takes the worker down.
LISTEN_ERRORS = (psycopg.Error,)


def listen(
    params: dict[str, Any],
    channel: str,
    worker_id: str,
    queues: list[str] | None,
    wake: Callable[[str | None], None],
    done: threading.Event,
    events: Events,
) -> None:
    """LISTEN until ``done``; reconnect and re-LISTEN after failures (polling covers the gap)."""
    listener = WorkerConnection("listen", worker_id, params=params, prepare=False)
    statement = psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
    while not done.is_set():
        try:
            conn = listener.connect()
            conn.execute(statement)
            wake(None)  # anything enqueued while we were not listening
            while not done.is_set():
                for notify in conn.notifies(timeout=1.0):
                    if queues is None or notify.payload in queues:
                        wake(notify.payload)
        except LISTEN_ERRORS as exc:
            listener.close()
            if not done.is_set():
                events.listener_lost(exc)
                done.wait(1.0)
    listener.close()
