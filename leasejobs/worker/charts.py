"""The overview's charts kept warm: a worker stores each closed bucket as it closes.

The overview's charts over a day computed cold (nothing stored: after a
deploy, or when nobody looked for two days) read the day's finished jobs,
four times: about a second at 10M jobs a month (docs/scaling.md, issue 32),
over the admin's 300 ms. So the worker's vacuum thread, which looks at the
database every second anyway, stores every chart's closed buckets a few
seconds after each minute ends (``db.chartpoints.keep``): each time it reads
the minute that closed, and at a quarter hour the quarter hour, so a page
finds every closed bucket stored and reads only the current one.

What it costs: one short transaction a minute per worker; the worker that
takes the advisory lock first runs the eight charts' queries over the
closed bucket (and the current one, and the active jobs), about 30 ms a
minute at 330,000 jobs a day, and the others find nothing missing and read
the stored points only (docs/scaling.md has the figures).
"""

import datetime as dt
import time
from collections.abc import Callable

import psycopg

from leasejobs.db import maintenance
from leasejobs.db.connection import WorkerConnection
from leasejobs.worker.events import Events

#: How long a bucket has been closed before a worker stores it: a job
#: finished (or claimed) by a transaction that began before the bucket's end
#: and commits after it belongs to the closed bucket, and would be missed for
#: good if the bucket were stored before the commit.
SETTLED = dt.timedelta(seconds=5)

#: The shortest step of the charts (``chartpoints.WINDOWS``): a bucket closes each minute.
STEP_SECONDS = 60.0

#: After a failure (a lost connection, a read-only database), the next try.
RETRY_SECONDS = 60.0


class ChartKeeper:
    """Stores the charts' closed buckets once a minute, on a connection it is lent."""

    def __init__(
        self, conn: WorkerConnection, events: Events, quiet: Callable[[], bool] | None = None
    ) -> None:
        """``quiet()`` true: a failure is not worth a warning (the worker is stopping and
        cancelled the step)."""
        self._conn = conn
        self.events = events
        self._quiet = quiet
        #: When the next look is due (``time.monotonic``): at once, to fill any gap.
        self._due = 0.0
        #: The last look failed (said once per run of failures).
        self._failing = False

    def tick(self) -> bool:
        """Store what is missing if a look is due; never raises a database error.

        False once this worker's role turns out not to be allowed to (it says
        so once): the overview then computes what it finds missing, as before.
        """
        if time.monotonic() < self._due:
            return True
        began = time.perf_counter()
        try:
            computed, clock = maintenance.keep_chart_points(self._conn, SETTLED)
        except psycopg.errors.InsufficientPrivilege:
            self.events.charts_off(
                "its role may not read and write leasejobs_chartpoint "
                "(GRANT SELECT, INSERT, DELETE ON leasejobs_chartpoint lets it)"
            )
            return False
        except psycopg.Error as exc:
            self._due = time.monotonic() + RETRY_SECONDS
            if not self._failing and not (self._quiet is not None and self._quiet()):
                self.events.charts_not_stored(exc, RETRY_SECONDS)
            self._failing = True
            return True
        self._failing = False
        self._due = time.monotonic() + next_look(clock)
        if computed:
            self.events.charts_stored(computed, time.perf_counter() - began)
        return True


def next_look(clock: dt.datetime) -> float:
    """Seconds from ``clock`` (the database's) until the next minute's bucket has settled
    (half a second late: the thread looks once a second anyway)."""
    settled = clock - SETTLED
    return STEP_SECONDS - (settled.second + settled.microsecond / 1e6) + 0.5
