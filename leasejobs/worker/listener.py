"""The listener: wakes the claim loop on NOTIFY from a dedicated connection.

The wake-up names the queue the NOTIFY carried, so the claim loop can tell a
limited queue's news (a job enqueued, a place freed) from any other's.

That connection must reach PostgreSQL directly, never through a transaction
pooler (see ``leasejobs.db.pooling``): it is the queue's database when that is
direct, else ``LEASEJOBS["LISTEN_URL"]`` or ``["LISTEN_DATABASE"]``.

When it is the queue's database (``claims``), the wake-up hands the
connection over, set up as the claim's (its settings, prepared statements),
and the claim loop may claim on it in this thread: its server process has
just woken for the NOTIFY, while the claim connection's has slept since the
last claim, and on an idle machine waking a sleeping process cost more than
the claim itself (docs/performance.md, "Latency").
"""

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from leasejobs.db.connection import WorkerConnection
from leasejobs.db.store import CLAIM_SETTINGS
from leasejobs.worker.events import Events

#: The listener's wake-up: the queue a NOTIFY named (None: it reconnected), and the
#: listen connection when claims may run on it.
Wake = Callable[[str | None, WorkerConnection | None], None]

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
    wake: Wake,
    done: threading.Event,
    events: Events,
    *,
    claims: bool = False,
) -> None:
    """LISTEN until ``done``; reconnect and re-LISTEN after failures (polling covers the gap).

    ``claims``: the connection reaches the queue's database directly, and is set
    up for claims and handed to ``wake`` (see the module docstring).
    """
    listener = WorkerConnection(
        "listen",
        worker_id,
        params=params,
        settings=CLAIM_SETTINGS if claims else None,
        prepare=claims,
    )
    statement = psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
    while not done.is_set():
        try:
            conn = listener.connect()
            # Never prepared: through a pooler the start-up probe missed, a statement
            # prepared on one server connection may be run on another.
            conn.execute(statement, prepare=False)
            wake(None, None)  # anything enqueued while we were not listening
            while not done.is_set():
                # Out of ``notifies`` before any wake-up: it holds the connection, which
                # the wake-up may claim on. What arrives meanwhile waits in psycopg.
                heard = [n.payload for n in conn.notifies(timeout=1.0, stop_after=1)]
                for queue in dict.fromkeys(heard):
                    if queues is None or queue in queues:
                        wake(queue, listener if claims and not listener.pooled else None)
        except LISTEN_ERRORS as exc:
            listener.close()
            if not done.is_set():
                events.listener_lost(exc)
                done.wait(1.0)
    listener.close()
