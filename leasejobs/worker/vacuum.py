"""The vacuum thread: the worker VACUUMs the job table when dead row versions pile up.

Every claim and every finish leaves a dead version of the job's row, in the
table and at the front of the claim index, and each claim walks past the
dead entries until a VACUUM removes them. Autovacuum visits a table at most
once a minute (``autovacuum_naptime``) and, for ``leasejobs_job``, with a
cost delay: a backlog drained at tens of thousands of jobs a second piles up
millions of dead versions between its visits, and the drain slows by a
quarter (docs/performance-history.md). So the worker looks at the table's statistics
every second and, past ``LEASEJOBS["VACUUM_THRESHOLD"]`` plus
``VACUUM_SCALE_FACTOR`` times the live rows, runs ``VACUUM (SKIP_LOCKED,
TRUNCATE false)``: one worker at a time (a worker that sees another's VACUUM
running waits for the next look, and one that starts anyway finds the lock
taken and returns at once), unthrottled, on a connection of its own so that
no claim, heartbeat or finish waits for it.

What it must not do is VACUUM in vain again and again. It counts from what
the last VACUUM (anybody's: the table's VACUUM count tells) left, and after
a VACUUM of its own that removed less than half of what it found (an old
snapshot still sees the rest) or that failed (a cancel, a lost connection),
it waits 15 s, then 30 s, then a minute, before the next: longer than the
10 s a backend that went idle may take to report the rows it made dead,
which would otherwise look like new ones. When another backend of this
database held the oldest xid or snapshot for a second at least at the
VACUUM (what kept the rows, most likely), the wait ends a second or two
after that transaction does, if sooner (``Vacuumer._pin_released``). A stopping worker cancels its
VACUUM: a deploy's ``migrate`` must not wait for it.

On a direct connection the VACUUM runs with ``vacuum_cost_delay`` and
``statement_timeout`` at 0, whatever the role or ``DATABASES`` say; through
a transaction pooler a session setting cannot be made for one statement
that may not run in a transaction, so there the role's settings apply.

The first time a VACUUM is due, the thread asks whether its role may run
one (``sql.MAY_VACUUM``): a role that may not (only the table's or the
database's owner may, and from PostgreSQL 17 a role granted MAINTAIN) would
get a notice and no work. It says so in one line and stops looking; so it
does when ``track_counts`` is off (PostgreSQL then counts no dead rows).

The same thread, on the same connection, stores the overview charts' closed
buckets as they close (``leasejobs.worker.charts``), whether or not this
worker may vacuum: a cheap step a minute that spares the admin from reading
a day of jobs when it finds nothing stored.
"""

import threading
import time
from typing import NamedTuple

import psycopg
from psycopg.errors import Diagnostic

from leasejobs.db import maintenance
from leasejobs.db.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.worker import rules
from leasejobs.worker.charts import ChartKeeper
from leasejobs.worker.events import Events, describe

#: How often the thread reads the table's dead rows: one cheap statement.
CHECK_SECONDS = 1.0

#: How long ``stop`` goes on cancelling a VACUUM that is starting or running.
STOP_SECONDS = 3.0

#: SQLSTATE of the notice a VACUUM (SKIP_LOCKED) gives when another holds the
#: table's vacuum lock (another VACUUM, or an ANALYZE).
LOCK_NOT_AVAILABLE = "55P03"

#: Unthrottled and never timed out, whatever the role or DATABASES say.
VACUUM_SETTINGS = {"vacuum_cost_delay": "0", "statement_timeout": "0"}


class Look(NamedTuple):
    """One reading of ``sql.VACUUM_LOOK``."""

    dead: int
    live: int
    counting: bool
    vacuums: int
    vacuuming: bool
    #: The oldest xid another backend of this database holds or sees (None: none).
    oldest_xid: int | None = None


class Notice(NamedTuple):
    severity: str | None
    sqlstate: str | None
    message: str


class Vacuumer:
    def __init__(
        self,
        worker_id: str,
        events: Events,
        *,
        threshold: int,
        scale_factor: float,
        pooled: bool,
    ) -> None:
        self.events = events
        self.threshold = threshold
        self.scale_factor = scale_factor
        #: The notices of the last VACUUM.
        self._notices: list[Notice] = []
        self._conn = WorkerConnection(
            "vacuum",
            worker_id,
            settings=VACUUM_SETTINGS,
            pooled=pooled,
            on_notice=self._notice,
            settings_in_transaction=False,
        )
        #: Stores the charts' closed buckets on this thread's connection.
        self._charts = ChartKeeper(self._conn, events, quiet=self._stopping)
        self._stop = threading.Event()
        #: Set while a VACUUM is about to run or runs: what ``stop`` cancels.
        self._busy = threading.Event()
        #: Dead rows no VACUUM could remove (see ``rules.vacuum_due``): 0 at
        #: first, so that a worker started on a bloated table vacuums it.
        self._floor = 0
        #: The table's VACUUM count at the last look (None: no look yet).
        self._vacuums: int | None = None
        #: Whether this role may vacuum the table; None until a VACUUM is due.
        self._allowed: bool | None = None
        #: VACUUMs in vain or failed in a row, and when the next may start.
        self._in_vain = 0
        self._not_before = 0.0
        #: VACUUMs skipped in a row (the lock was taken), and when to try again.
        self._skipped = 0
        self._skipped_until = 0.0
        #: The look failed last time (said once per run of failures).
        self._look_failing = False
        #: The oldest held xid of the last look, and of the last look but one
        #: that saw the same: a transaction that has held it a second at least.
        self._oldest_xid: int | None = None
        self._held_xid: int | None = None
        #: The held xid that kept the last VACUUM in vain, and whether the last
        #: VACUUM came early because such an xid ended (see ``_pin_released``).
        self._pinned_by: int | None = None
        self._brought_forward = False

    def run(self) -> None:
        """Look every ``CHECK_SECONDS`` until stopped: VACUUM when due, until it turns out this
        worker may not, and store the charts' closed buckets as they close, until it turns
        out this worker may not; it ends when it may do neither."""
        vacuuming = keeping = True
        try:
            while not self._stop.wait(CHECK_SECONDS):
                if vacuuming:
                    vacuuming = self.check()
                if keeping:
                    keeping = self._keep_charts()
                if not vacuuming and not keeping:
                    return
        finally:
            self.close()

    def _keep_charts(self) -> bool:
        """One step of the chart keeper (False: it is off); ``stop`` cancels it as it cancels a VACUUM."""
        self._busy.set()
        try:
            return self._stop.is_set() or self._charts.tick()
        finally:
            self._busy.clear()

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """Close its connection; call it from the thread that runs ``check``."""
        self._conn.close()

    def stop(self) -> None:
        """No VACUUM from now on; one starting or running is cancelled (for up to ``STOP_SECONDS``)."""
        self._stop.set()
        deadline = time.monotonic() + STOP_SECONDS
        while self._busy.is_set() and time.monotonic() < deadline:
            self._conn.cancel()
            time.sleep(0.1)  # the VACUUM may not have reached the server yet: cancel again

    def check(self) -> bool:
        """VACUUM if it is due; False once it turns out this worker may not."""
        look = self._read()
        if look is None:
            return not self._stop.is_set() and self._allowed is not False
        if not look.counting:
            self.events.vacuum_off(
                "track_counts is off, so PostgreSQL counts no dead row versions and autovacuum does not "
                "run either; run VACUUM leasejobs_job often"
            )
            return False
        if self._vacuums is not None and look.vacuums != self._vacuums:
            self._floor = look.dead  # a VACUUM ended since: what it left is the new floor
            self._skipped, self._skipped_until = 0, 0.0
        self._vacuums = look.vacuums
        self._floor = min(self._floor, look.dead)
        self._pin_released(look)
        if look.vacuuming or time.monotonic() < max(self._not_before, self._skipped_until):
            return True
        if not rules.vacuum_due(
            dead=look.dead,
            live=look.live,
            floor=self._floor,
            threshold=self.threshold,
            scale_factor=self.scale_factor,
        ):
            return True
        return self._vacuum(look)

    def _pin_released(self, look: Look) -> None:
        """Cut the back-off short once the transaction that kept the last VACUUM in vain ends.

        A transaction that holds an xid or a snapshot (idle in a
        transaction, a long batch, a REPEATABLE READ report) keeps every row
        version that died after it began; once it ends, all
        it kept may go, the floor with it, and a VACUUM is due at the next
        look but one, not after the back-off's 15 s to a minute (not at this
        look: statements that took their snapshot before it ended may still
        run, and a VACUUM's horizon would be theirs; seen: one in vain, 1.2
        million rows kept, 5 ms after the end). The oldest held xid at
        the VACUUM may not be what kept its rows (a replication slot or a
        prepared transaction, which the look does not read, may have): so this
        never lengthens the back-off, and a VACUUM it brought forward that is
        in vain too brings none forward again until one is not.
        """
        self._held_xid = look.oldest_xid if look.oldest_xid == self._oldest_xid else None
        self._oldest_xid = look.oldest_xid
        if self._pinned_by is None or look.oldest_xid == self._pinned_by:
            return
        self._pinned_by = None
        self._brought_forward = True
        self._floor = 0
        self._not_before = min(self._not_before, time.monotonic() + CHECK_SECONDS / 2)

    def _vacuum(self, look: Look) -> bool:
        self._busy.set()
        try:
            if self._stop.is_set():
                return False
            if self._allowed is None and not self._may_vacuum():
                return False
            self._notices.clear()
            began = time.perf_counter()
            maintenance.vacuum_jobs(self._conn)
            seconds = time.perf_counter() - began
        except psycopg.Error as exc:  # a lost connection, a cancel: later, not at once
            if self._stop.is_set():
                return False
            self._back_off()
            self.events.vacuum_failed(exc, self._not_before - time.monotonic())
            return True
        finally:
            self._busy.clear()
        after = None if self._stop.is_set() else self._read()
        self._done(look, after, seconds)
        return True

    def _done(self, look: Look, after: "Look | None", seconds: float) -> None:
        if any(n.sqlstate == LOCK_NOT_AVAILABLE for n in self._notices):
            # Another VACUUM (autovacuum's, another role's: not in the
            # progress view) or an ANALYZE holds the lock. Try again in 5 s,
            # 10 s, ... a minute (each try is a WARNING in the server's log),
            # or once a VACUUM's end moves the floor.
            self._skipped += 1
            self._skipped_until = time.monotonic() + rules.vacuum_retry_after_skip(self._skipped)
            self.events.vacuum_skipped()
            return
        warned = [n for n in self._notices if n.severity == "WARNING"]
        if warned:
            # Its role may no longer vacuum the table (PostgreSQL then skips
            # it), or PostgreSQL warns of something an operator must see.
            self._allowed = None  # ask again before the next one
            self._back_off()
            self.events.vacuum_warned(warned[0].message)
            return
        if after is None:
            # Done, but what it left is unknown (the look after it failed, or
            # the worker is stopping): the next look's VACUUM count tells.
            self.events.vacuumed(seconds, look.dead, None)
            return
        left, self._floor, self._vacuums = after.dead, after.dead, after.vacuums
        self.events.vacuumed(seconds, look.dead, left)
        if rules.vacuum_in_vain(before=look.dead, after=left):
            self._back_off()
            self._pinned_by = None if self._brought_forward else self._held_xid
        else:
            self._brought_forward = False
            self._in_vain = 0
            self._not_before = 0.0

    def _back_off(self) -> None:
        self._in_vain += 1
        self._not_before = time.monotonic() + rules.vacuum_backoff(self._in_vain)

    def _notice(self, notice: Diagnostic) -> None:
        # Read it now: a notice's fields are gone once the handler returns.
        self._notices.append(
            Notice(notice.severity_nonlocalized, notice.sqlstate, notice.message_primary or "")
        )

    def _may_vacuum(self) -> bool:
        """Ask PostgreSQL; a role that may not read the catalog is taken as not allowed."""
        try:
            rows = maintenance.may_vacuum(self._conn)
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            return self._not_allowed(f"its role may not read the catalog ({describe(exc)})")
        self._allowed = bool(rows and rows[0][0])
        if not self._allowed:
            return self._not_allowed(
                "its role may not (only a superuser, the table's or the database's owner, "
                "or from PostgreSQL 17 a role granted MAINTAIN may)"
            )
        return True

    def _not_allowed(self, why: str) -> bool:
        self._allowed = False
        self.events.vacuum_off(
            f"{why}; autovacuum, or the table's owner, must keep its dead row versions down"
        )
        return False

    def _read(self) -> Look | None:
        """The look, or None: no table yet, or a failure (said once; a role that may not read it: off)."""
        try:
            rows = maintenance.look(self._conn)
        except psycopg.errors.InsufficientPrivilege as exc:
            self._not_allowed(f"its role may not read the table's statistics ({describe(exc)})")
            return None
        except psycopg.Error as exc:
            if not self._look_failing and not self._stop.is_set():
                self.events.vacuum_look_failed(exc)
            self._look_failing = True
            return None
        self._look_failing = False
        if not rows:
            return None
        dead, live, counting, vacuums, vacuuming, oldest_xid = rows[0]
        return Look(
            int(dead or 0), int(live or 0), bool(counting), int(vacuums or 0), bool(vacuuming), oldest_xid
        )
