"""The front look's thread: what claims from the keys cannot see, found beside them.

The claimer asks for a look when ``ClaimStart.look_due`` says one is due;
this thread runs it (``sql.FRONT_LOOK``) and hands what it found to
``ClaimStart``, waking the claimer when there is something to take. A look
walks every index entry a pinned xmin horizon keeps, which can take
seconds; on its own thread that delays the jobs only it finds, never a
claim.

It runs on the vacuum thread's connection (``leasejobs.worker.vacuum``), one
statement at a time with it: both are rare and neither is in a hurry, and
a worker of many on one server holds no connection more for it (a VACUUM
under way delays a look by its own duration). A worker that does not vacuum
(``runworker --no-vacuum``) gives the look a connection of its own instead.
"""

import queue
import time
from collections.abc import Callable

from leasejobs.db.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.db.store import ClaimKey, front_look
from leasejobs.worker.claim_start import FRONT_GAP, FRONT_GAP_MAX_SECONDS, ClaimStart
from leasejobs.worker.events import Events

#: A failed look counts as one this long: the next is due ``FRONT_GAP_MAX_SECONDS``
#: after it, as a stalled one's would be, and the claims go on from their keys meanwhile.
FAILED_LOOK_SECONDS = FRONT_GAP_MAX_SECONDS / FRONT_GAP


class FrontLook:
    """Runs the looks the claimer asks for, one at a time, until ``stop``."""

    def __init__(
        self,
        conn: WorkerConnection,
        start: ClaimStart,
        queues: list[str] | None,
        events: Events,
        wake: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._start = start
        self._queues = queues
        self._events = events
        self._wake = wake
        self._asked: queue.SimpleQueue[dict[int, ClaimKey] | None] = queue.SimpleQueue()
        self._stopped = False
        self._looking = False

    def ask(self, keys: dict[int, ClaimKey]) -> None:
        """Look before these keys (``ClaimStart.look_due``'s); returns at once."""
        self._asked.put(keys)

    def stop(self) -> None:
        """End the thread; a look under way is cancelled (a walk under a pinned horizon
        may take seconds, and a stopping worker waits for no look)."""
        if self._stopped:
            return
        self._stopped = True
        self._asked.put(None)
        if self._looking:
            self._conn.cancel()

    def close(self) -> None:
        """Close its connection (the vacuum thread's too, which leaves it to the look)."""
        self._conn.close()

    def run(self) -> None:
        while (keys := self._asked.get()) is not None and not self._stopped:
            began = time.perf_counter()
            self._looking = True
            try:
                found = front_look(self._conn, keys, self._queues)
            except CONNECTION_ERRORS as exc:
                if self._stopped:
                    return  # cancelled by ``stop``
                self._events.front_look_failed(exc)
                self._start.looked(FAILED_LOOK_SECONDS, ())
                continue
            finally:
                self._looking = False
            if self._start.looked(time.perf_counter() - began, found):
                self._wake()
