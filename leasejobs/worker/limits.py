"""When a worker runs the limited claim: only while limits apply, and only when it may find work.

``CLAIM_LIMITED`` walks the claim index past plain jobs to find jobs under
limits, so it is not run on every turn of the claim loop. It is due when a
NOTIFY names a limited queue (a job enqueued there, or a place freed by a
finish), when keys are in use and any NOTIFY arrives, when the previous
limited claim filled all the room it was given (more may be waiting), or
once per poll interval. Whether limits apply at all is read from the
database at most every ``REFRESH_SECONDS``; the claims themselves read the
queue table, so a pause or a new limit applies to the next claim whatever
this gate believes.
"""

import time

from leasejobs.db.store import WorkerStore

#: How often the worker asks which of its queues have limits.
REFRESH_SECONDS = 0.5


class LimitGate:
    def __init__(self, store: WorkerStore, queues: list[str] | None, poll_interval: float) -> None:
        self.store = store
        self.queues = queues
        self.poll_interval = poll_interval
        self.limited: frozenset[str] = frozenset()
        self.keys = False
        self._read_at: float | None = None
        self._last_claim: float | None = None
        self._due = True  # set from the listener thread; a plain bool is enough

    @property
    def active(self) -> bool:
        return bool(self.limited) or self.keys

    def stale(self) -> bool:
        """Whether ``refresh`` would read the limits again now."""
        return self._read_at is None or time.monotonic() - self._read_at >= REFRESH_SECONDS

    def refresh(self) -> bool:
        """Re-read the limits if they are older than ``REFRESH_SECONDS``; returns ``active``."""
        if self.stale():
            limited, keys = self.store.limits_apply(self.queues)
            if set(limited) - self.limited:
                self._due = True  # a queue just got a limit: its jobs wait for this claim
            self.limited, self.keys = frozenset(limited), keys
            self._read_at = time.monotonic()
        return self.active

    def notified(self, queue: str | None) -> None:
        """A NOTIFY arrived (None: the listener (re)connected)."""
        if queue is None or self.keys or queue in self.limited:
            self._due = True

    def due(self) -> bool:
        if self._due or self._last_claim is None:
            return True
        return time.monotonic() - self._last_claim >= self.poll_interval

    def claiming(self) -> None:
        """A limited claim is about to be sent: it sees every NOTIFY so far.

        Cleared before the statement, not after it: a NOTIFY that arrives
        while it runs (a place freed after its snapshot) keeps the next
        claim due.
        """
        self._due = False

    def claimed(self, got: int, room: int) -> None:
        """A limited claim got ``got`` of ``room`` rows: due again at once if it filled the room."""
        self._last_claim = time.monotonic()
        if got >= room > 0:
            self._due = True
