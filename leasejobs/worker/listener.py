"""The listener: wakes the claim loop on NOTIFY from a dedicated connection.

The wake-up names the queue the NOTIFY carried, so the claim loop can tell a
limited queue's news (a job enqueued, a place freed) from any other's, and,
for a job enqueued or queued again, the job's place in claim order, so that
the claims find a job that committed after later ones were claimed
(``parse_payload``). A job due within seconds of its INSERT is announced as
``later`` (it wakes a claim only if it lies behind a key); a queue resumed asks
for a walk from the front.

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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from leasejobs.db.connection import WorkerConnection
from leasejobs.db.sql.fragments import FRONT, LATER, PAYLOAD_SEPARATOR
from leasejobs.db.store import CLAIM_SETTINGS, ClaimKey
from leasejobs.worker.claim_start import Place
from leasejobs.worker.events import Events


class Notice(NamedTuple):
    """What one NOTIFY payload says: its queue, and the place of the job it announces, if
    any. ``later``: the job was not due at its INSERT. ``front``: walk from the front."""

    queue: str
    place: Place | None = None
    later: bool = False
    front: bool = False


@dataclass
class Heard:
    """What one wake-up passes on of a queue's NOTIFYs: the places of due jobs, of jobs
    not due at their INSERT (``later``), whether one asked for a walk from the front,
    and whether one was other news of the queue (``news``: a place freed, a pause)."""

    places: list[Place] = field(default_factory=list)
    later: list[Place] = field(default_factory=list)
    front: bool = False
    news: bool = False

    def add(self, notice: Notice) -> None:
        if notice.place is not None:
            (self.later if notice.later else self.places).append(notice.place)
        elif notice.front:
            self.front = True
        else:
            self.news = True


#: The listener's wake-up: the queue a NOTIFY named (None: it reconnected), the
#: listen connection when claims may run on it, and what its NOTIFYs said.
Wake = Callable[[str | None, WorkerConnection | None, Heard], None]


def parse_payload(payload: str) -> Notice:
    """What a NOTIFY payload says (``Notice``).

    A payload is a queue name followed by an empty field (news of the queue),
    by ``FRONT``, or by a job's priority, ``run_at`` and id, and ``LATER`` if
    the job was not due at its INSERT (``leasejobs.db.sql.fragments``,
    ``PAYLOAD_SEPARATOR``). The fields are taken from the right, so a queue name
    may hold anything. A payload without a separator (another program's, or a
    leasejobs before 6 December) is a queue name whole, and so is one whose tail
    reads as none of these.
    """
    head, separator, tail = payload.rpartition(PAYLOAD_SEPARATOR)
    if not separator:
        return Notice(payload)
    if tail == "":
        return Notice(head)
    if tail == FRONT:
        return Notice(head, front=True)
    later = tail == LATER
    parts = (head if later else payload).rsplit(PAYLOAD_SEPARATOR, 3)
    if len(parts) == 4:
        queue, priority, run_at, job_id = parts
        try:
            when = datetime.fromisoformat(run_at)
            place = (int(priority), ClaimKey(when, int(job_id)))
        except ValueError:
            return Notice(payload)
        # Any session may NOTIFY on the channel: a place a claim could not bind (a
        # priority no smallint holds, a time without its zone) is no place. The time
        # is kept as Python read it, bound as a timestamp: text Python reads and
        # PostgreSQL would not (an ISO week date) never reaches a claim.
        if -(2**15) <= place[0] < 2**15 and 0 < place[1].id < 2**63 and when.tzinfo is not None:
            return Notice(queue, place, later)
    return Notice(payload)


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
            wake(None, None, Heard())  # anything enqueued while we were not listening
            while not done.is_set():
                # Out of ``notifies`` before any wake-up: it holds the connection, which
                # the wake-up may claim on. What arrives meanwhile waits in psycopg.
                # One commit's notifications come in one packet: one wake-up per queue.
                heard: dict[str, Heard] = {}
                for notify in conn.notifies(timeout=1.0, stop_after=1):
                    notice = parse_payload(notify.payload)
                    if queues is None or notice.queue in queues:
                        heard.setdefault(notice.queue, Heard()).add(notice)
                for queue, news in heard.items():
                    wake(queue, listener if claims and not listener.pooled else None, news)
        except LISTEN_ERRORS as exc:
            listener.close()
            if not done.is_set():
                events.listener_lost(exc)
                done.wait(1.0)
    listener.close()
