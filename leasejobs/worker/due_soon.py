"""When the claim loop should wake for jobs announced before they were due.

A job due within seconds of its INSERT is announced by its NOTIFY, marked
``later`` (``leasejobs.db.sql.fragments.keyed_payload``). Heard before it is
due, it is claimed at its ``run_at``, not at the next poll: the claim loop's
wait ends then (``wait_seconds``), and its queue's news is handed on then
(``take``), so a limited queue's claim looks at it too. Heard once it is due
(its transaction committed late), it is news now: the claimer treats it as a
due job's NOTIFY.

Times come from the NOTIFY (the database's clock) and are compared with this
machine's: a clock behind the database's wakes the loop late by the
difference, one ahead wakes it early, and the claim finds nothing yet. The
poll is never later than it was, so a skew costs at most a poll interval.

Each deadline is kept, the earliest ``KEPT`` of them: past that (a flood of
delayed jobs), the latest are forgotten and their jobs found by the poll.
"""

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from leasejobs.worker.claim_start import Place

#: Deadlines kept at most (the memory of a flood of delayed jobs is bounded).
KEPT = 1024


def seconds_until(places: Iterable[Place], now: datetime | None = None) -> float:
    """Seconds until the earliest of ``places`` is due, by this machine's clock (0 or
    less: due now)."""
    now = now or datetime.now(UTC)
    earliest = math.inf
    for _, key in places:
        run_at = key.run_at if isinstance(key.run_at, datetime) else datetime.fromisoformat(key.run_at)
        earliest = min(earliest, (run_at - now).total_seconds())
    return earliest


class DueSoon:
    """The earliest due time heard of per queue, and how long the claim loop may wait."""

    def __init__(self, wake: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        #: (when, queue), soonest first.
        self._at: list[tuple[float, str]] = []
        #: When the claim loop's wait under way ends (0: it is not waiting).
        self._waiting_until = 0.0

    def heard(self, queue: str, seconds: float) -> None:
        """A job of ``queue`` is due in ``seconds``: wake the loop then, or now if it waits
        past that."""
        at = self._clock() + seconds
        with self._lock:
            bisect.insort(self._at, (at, queue))
            del self._at[KEPT:]
            sooner = at < self._waiting_until
        if sooner:
            self._wake.set()  # the loop claims once and waits again, until ``at``

    def wait_seconds(self, longest: float) -> float:
        """How long the claim loop waits: ``longest``, or less when a job heard of is due
        sooner. The loop is waiting from now until ``waited`` is called."""
        now = self._clock()
        with self._lock:
            soonest = self._at[0][0] if self._at else math.inf
            seconds = max(0.0, min(longest, soonest - now))
            self._waiting_until = now + seconds
        return seconds

    def waited(self) -> None:
        with self._lock:
            self._waiting_until = 0.0

    def take(self) -> set[str]:
        """The queues whose jobs heard of are due now, forgotten here."""
        now = self._clock()
        with self._lock:
            count = next((i for i, (at, _) in enumerate(self._at) if at > now), len(self._at))
            due = {queue for _, queue in self._at[:count]}
            del self._at[:count]
        return due
