"""The vacuum thread: the worker VACUUMs the job table when dead row versions pile up.

Every claim and every finish leaves a dead version of the job's row, in the
table and at the front of the claim index, and each claim walks past the
dead entries until a VACUUM removes them. Autovacuum visits a table at most
once a minute (``autovacuum_naptime``) and, for ``leasejobs_job``, with a
cost delay: a backlog drained at tens of thousands of jobs a second piles up
millions of dead versions between its visits, and the drain slows by a
quarter (docs/performance.md). So the worker looks at the table's statistics
every second and, past ``LEASEJOBS["VACUUM_THRESHOLD"]`` plus
``VACUUM_SCALE_FACTOR`` times the live rows, runs ``VACUUM (SKIP_LOCKED)``:
one worker at a time (the others' VACUUM finds the table's vacuum lock taken
and returns at once), unthrottled, on a connection of its own so that no
claim, heartbeat or finish waits for it.

The first time a VACUUM is due, the thread asks whether its role may run
one (``sql.MAY_VACUUM``): a role that may not (only the table's or the
database's owner may, and from PostgreSQL 17 a role granted MAINTAIN) would
get a notice and no work. It says so in one line and stops looking.
"""

import threading
import time
from typing import Any

import psycopg
from psycopg.errors import Diagnostic

from leasejobs import sql
from leasejobs.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.worker import rules
from leasejobs.worker.events import Events, describe

#: How often the thread reads the table's dead rows: one cheap statement.
CHECK_SECONDS = 1.0

#: SQLSTATE of the notice a VACUUM (SKIP_LOCKED) gives when another holds the
#: table's vacuum lock: somebody is vacuuming it already.
LOCK_NOT_AVAILABLE = "55P03"


class Vacuumer:
    def __init__(
        self,
        worker_id: str,
        events: Events,
        *,
        threshold: int,
        scale_factor: float,
        pooled: bool,
        params: dict[str, Any] | None = None,
    ) -> None:
        self.events = events
        self.threshold = threshold
        self.scale_factor = scale_factor
        #: SQLSTATEs of the notices of the last VACUUM.
        self._notices: list[str | None] = []
        self._conn = WorkerConnection(
            "vacuum", worker_id, pooled=pooled, params=params, on_notice=self._notice
        )
        #: Dead rows no VACUUM of ours could remove (see ``rules.vacuum_due``):
        #: 0 at first, so that a worker started on a bloated table vacuums it.
        self._floor = 0
        #: Whether this role may vacuum the table; None until a VACUUM is first due.
        self._allowed: bool | None = None

    def run(self, stop: threading.Event) -> None:
        """Look every ``CHECK_SECONDS`` until ``stop`` is set or the role turns out not to be allowed."""
        try:
            while not stop.wait(CHECK_SECONDS):
                if not self.check():
                    return
        finally:
            self._conn.close()

    def check(self) -> bool:
        """VACUUM if it is due; False once it turns out this role may not."""
        try:
            dead = self._dead_rows()
            if dead is None:
                return True
            before, live = dead
            self._floor = min(self._floor, before)  # somebody vacuumed since
            if not rules.vacuum_due(
                dead=before,
                live=live,
                floor=self._floor,
                threshold=self.threshold,
                scale_factor=self.scale_factor,
            ):
                return True
            if self._allowed is None and not self._may_vacuum():
                return False
            self._notices.clear()
            began = time.perf_counter()
            self._conn.execute(sql.VACUUM)
            seconds = time.perf_counter() - began
            after = self._dead_rows()
        except psycopg.Error as exc:  # a lost connection, a cancelled statement: look again later
            self.events.vacuum_failed(exc)
            return True
        # Done or skipped, count from what is left: what a VACUUM could not
        # remove (an old snapshot still sees it), or what another worker's
        # VACUUM, still running, is removing now.
        self._floor = before if after is None else after[0]
        if LOCK_NOT_AVAILABLE not in self._notices:
            self.events.vacuumed(seconds, before, self._floor)
        return True

    def _notice(self, notice: Diagnostic) -> None:
        # Read it now: a notice's fields are gone once the handler returns.
        self._notices.append(notice.sqlstate)

    def _may_vacuum(self) -> bool:
        """Ask PostgreSQL once; a role that may not read the catalog is taken as not allowed."""
        try:
            rows = self._conn.execute(sql.MAY_VACUUM)
        except CONNECTION_ERRORS:
            raise
        except psycopg.Error as exc:
            self._allowed = False
            self.events.vacuum_not_allowed(describe(exc))
            return False
        self._allowed = bool(rows and rows[0][0])
        if not self._allowed:
            self.events.vacuum_not_allowed(
                "only the owner of the table or of the database may, or from PostgreSQL 17 "
                "a role granted MAINTAIN"
            )
        return self._allowed

    def _dead_rows(self) -> tuple[int, int] | None:
        """(dead, live) row versions of the job table, or None while it does not exist."""
        rows = self._conn.execute(sql.DEAD_ROWS)
        if not rows or rows[0][0] is None:
            return None
        return int(rows[0][0]), int(rows[0][1])
