"""The front look's thread: what claims from the keys cannot see, found beside them.

When a walk from the claim index's front is due and too costly for the
claimer (``ClaimStart``), a claim asks this thread for a look
(``sql.FRONT_LOOK``), which hands what it found to ``ClaimStart`` and wakes
the claimer when there is something to take. A look walks every index entry
a pinned xmin horizon keeps, which can take seconds; on its own thread that
delays the jobs only it finds, never a claim.

Its connection is its own, opened at the first look: on a healthy database
there is none (the claimer's walks are cheap), and a worker holds one more
connection only while a horizon is pinned. Shared with the vacuum thread
instead, a look waited for each VACUUM and a stuck look stopped the vacuum
thread and slowed the worker's stop (a review, 4 December). Its statements
end after ``LOOK_TIMEOUT_MS`` whatever happens, and a stop cancels the look
under way: a look left running on the server would hold its lock on the
job table against a deploy's ``migrate``.
"""

import threading
import time
from collections.abc import Callable

from leasejobs.db.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.db.store import CLAIM_SETTINGS, ClaimKey, front_look
from leasejobs.worker.claim_start import ClaimStart
from leasejobs.worker.events import Events

#: No look runs longer than this (a minute: ten times the longest measured).
LOOK_TIMEOUT_MS = 60_000
#: How long ``stop`` goes on cancelling a look (the first cancel may reach the
#: server before the look does).
STOP_SECONDS = 1.0


class FrontLook:
    """Runs the looks the claimer asks for, one at a time, until ``stop``."""

    def __init__(
        self,
        worker_id: str,
        start: ClaimStart,
        queues: list[str] | None,
        events: Events,
        wake: Callable[[], None],
        *,
        pooled: bool = False,
    ) -> None:
        self._conn = WorkerConnection(
            "front",
            worker_id,
            settings={**CLAIM_SETTINGS, "statement_timeout": str(LOOK_TIMEOUT_MS)},
            pooled=pooled,
        )
        self._start = start
        self._queues = queues
        self._events = events
        self._wake = wake
        self._asked = threading.Condition()
        self._keys: dict[int, ClaimKey] | None = None
        self._stopped = False
        self._looking = False

    def ask(self, keys: dict[int, ClaimKey]) -> None:
        """Look before these keys (``ClaimStart.look_due``'s); returns at once."""
        with self._asked:
            self._keys = keys
            self._asked.notify()

    def stop(self) -> None:
        """End the thread; the look under way is cancelled (a walk under a pinned horizon
        may take seconds, and a stopping worker waits for no look)."""
        with self._asked:
            self._stopped = True
            self._asked.notify()
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline:
            with self._asked:
                if not self._looking:
                    return
            self._conn.cancel()
            time.sleep(0.05)

    def run(self) -> None:
        try:
            while True:
                with self._asked:
                    while self._keys is None and not self._stopped:
                        self._asked.wait()
                    if self._stopped or self._keys is None:
                        return
                    keys, self._keys = self._keys, None
                    self._looking = True  # under the lock: ``stop`` sees it or we see it
                began = time.perf_counter()
                try:
                    found = front_look(self._conn, keys, self._queues)
                except CONNECTION_ERRORS as exc:
                    if self._stopped:
                        return  # cancelled by ``stop``
                    self._events.front_look_failed(exc)
                    self._start.looked(time.perf_counter() - began, (), failed=True)
                    continue
                finally:
                    with self._asked:
                        self._looking = False
                if self._start.looked(time.perf_counter() - began, found):
                    self._wake()
        finally:
            self._conn.close()
