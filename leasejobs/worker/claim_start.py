"""Where the worker's next claim starts: on from its last keys, or at the front.

A claim from the front of the claim index (``sql.CLAIM``) visits every entry
VACUUM has not removed yet. On a healthy database that is a handful; while
something pins the xmin horizon (a transaction left idle, a long report in
``REPEATABLE READ``) it is every job finished since, and each claim slows
with the pressure's age (388,631 buffers a look after two minutes at 5,000
jobs a second: docs/performance.md, "Steady under pressure"). So the worker
claims on from the last job it kept of each priority (``sql.CLAIM_AFTER``),
and walks from the front only when it has no key yet, when ``--burst`` asks
whether anything is left, and once the last front walk is ``FRONT_GAP``
times its own duration old (at most ``FRONT_GAP_MAX_SECONDS``): front walks
take about 1/``FRONT_GAP`` of the claimer's time unless one takes longer
than half a second.

A front walk finds what a walk from the keys cannot: a job due before a key
(an expired lease, a job another worker gave back, one enqueued with an
earlier ``run_at`` or committed long after its statement) and a priority the
worker has not claimed from. Such a job waits for it: 20 times a front
walk's duration, a few milliseconds on a healthy database, 10 s at most.

Each priority the worker has claimed from keeps its key, and costs each
claim from the keys one index probe (a few buffers) while it has no jobs.
"""

import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime

from leasejobs.db.store import ClaimedRow, ClaimKey

#: A front walk is due again this many times its own duration after it began,
FRONT_GAP = 20
#: and never later than this: its duration is the claim's wall time, which a
#: reconnect's back-off, a lock wait or a pause of the worker can stretch.
FRONT_GAP_MAX_SECONDS = 10.0


class ClaimStart:
    """The keys a claim starts after, per priority, and when a front walk is due."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._keys: dict[int, ClaimKey] = {}
        self._front_due = 0.0

    def after(self, *, front: bool = False) -> dict[int, ClaimKey] | None:
        """The keys the next claim starts after; None: from the front (``front`` asks for it)."""
        if front or not self._keys or self._clock() >= self._front_due:
            return None
        return dict(self._keys)

    def claimed(
        self,
        after: dict[int, ClaimKey] | None,
        began: float,
        seconds: float,
        rows: Iterable[ClaimedRow],
        given_back: Collection[int],
    ) -> None:
        """A claim that started after ``after`` (None: the front) at ``began`` (this
        object's clock) and took ``seconds`` returned ``rows``, in claim order; the jobs
        of ``given_back`` (ids) went back to the queue unrun.

        Each priority's key becomes its last row, or, if one of its rows went back,
        the place just before the first of those, so the next claim finds it again.
        """
        if after is None:
            self._front_due = began + min(FRONT_GAP * seconds, FRONT_GAP_MAX_SECONDS)
        # Each priority's last row is remembered and made a key once: a key per row
        # cost the worker 0.4 µs a job, on claims of hundreds of rows.
        last: dict[int, tuple[str | datetime, int]] = {}
        stopped: dict[int, ClaimKey] = {}
        for row in rows:
            if row.priority in stopped or row.run_at is None:
                continue
            if row.id in given_back:
                stopped[row.priority] = ClaimKey(row.run_at, row.id - 1)
            else:
                last[row.priority] = (row.run_at, row.id)
        self._keys.update({p: ClaimKey(*key) for p, key in last.items() if p not in stopped})
        self._keys.update(stopped)
