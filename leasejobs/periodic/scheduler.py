"""The worker's side of periodic jobs: one method, ``Scheduler.run_due()``, called in a loop.

Every worker runs one (unless ``runworker --no-periodic``); there is no
leader. For each schedule it declares, a worker sleeps until the schedule's
next tick by the *database* clock (estimated from the ``now()`` its last
statement returned plus the monotonic time since; the machine's wall clock
is never read), then runs one ``TICK`` statement, which decides in the
database whether the tick is due and whether another worker already
enqueued it. So a tick costs each worker one cheap statement, and a worker
whose clock is an hour off behaves like any other.

It uses the Django connection of the thread that calls it; call ``close()``
when that thread ends.
"""

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections
from psycopg.types.json import Jsonb

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.db.sql import periodic as sql
from leasejobs.periodic.schedules import Schedule, job_options, load
from leasejobs.periodic.ticks import candidate_ticks, jitter, next_tick

logger = logging.getLogger("leasejobs.periodic")

#: Ticks up to this far past the estimated database time are sent along:
#: the statement drops those not due yet, and an estimate a little behind
#: the database does not make a due tick wait for the next wake-up.
LOOKAHEAD = dt.timedelta(seconds=1)
#: Due ticks sent when only the latest due tick can be enqueued (one would
#: do: the others are sent so that they are counted as skipped).
LATEST_CANDIDATES = 3
#: catch_up="none": a tick later than half its period, and never later than this, is skipped.
ON_TIME_MAX_SECONDS = 60.0
#: Longest sleep ``run_due`` asks for, even when the next tick is further away.
MAX_SLEEP_SECONDS = 60.0
#: Sleep after a database error before trying again.
RETRY_SECONDS = 2.0


class ScheduleConfigError(Exception):
    """The declared schedules cannot run (the system check says why at start)."""


@dataclass
class _State:
    """What this worker knows of one schedule's row."""

    last_tick: dt.datetime
    next_due: dt.datetime | None
    mine: bool = True  # False once a newer deploy's definition owns the schedule


class Scheduler:
    """Enqueues each declared schedule's jobs, once per tick across all workers."""

    def __init__(self, worker_id: str, schedules: list[Schedule] | None = None) -> None:
        if schedules is None:
            schedules, errors = load()
            if errors:
                raise ScheduleConfigError(" ".join(errors))
        self.worker_id = worker_id
        self.schedules = {s.name: s for s in schedules}
        self._options = {s.name: job_options(s) for s in schedules}
        self._state: dict[str, _State] = {}
        self._started_at: dt.datetime | None = None
        # The database clock: its now() at the monotonic time beside it.
        self._clock: tuple[dt.datetime, float] | None = None
        self.statements = 0  # statements run, logged at close (docs/periodic.md: the cost)
        self.enqueued = 0

    def db_now(self) -> dt.datetime:
        """The database's time, estimated from its last answer and the monotonic clock."""
        assert self._clock is not None
        at, mono = self._clock
        return at + dt.timedelta(seconds=time.monotonic() - mono)

    def run_due(self) -> float:
        """Enqueue every tick due now; return the seconds until a schedule next needs a look."""
        if not self.schedules:
            return MAX_SLEEP_SECONDS
        try:
            if self._clock is None:
                self._register()
            for schedule in self.schedules.values():
                state = self._state.get(schedule.name)
                if state is None or not state.mine or state.next_due is None:
                    continue
                if state.next_due <= self.db_now():
                    self._tick(schedule, state)
        except DatabaseError as exc:
            logger.warning(
                "periodic scheduling failed worker=%s: %s: %s; retrying",
                self.worker_id,
                type(exc).__name__,
                (str(exc).strip().splitlines() or [""])[0],
            )
            connections[db_alias()].close()
            self._clock = None  # look again at every row once the database answers
            return RETRY_SECONDS
        return self._sleep()

    def close(self) -> None:
        """Close this thread's Django connection (call it from the same thread)."""
        connections[db_alias()].close()
        logger.info(
            "periodic scheduler stopped worker=%s statements=%d enqueued=%d",
            self.worker_id,
            self.statements,
            self.enqueued,
        )

    def _sleep(self) -> float:
        dues = [s.next_due for s in self._state.values() if s.mine and s.next_due is not None]
        if not dues:
            return MAX_SLEEP_SECONDS
        seconds = (min(dues) - self.db_now()).total_seconds()
        return min(MAX_SLEEP_SECONDS, max(0.005, seconds))

    def _execute(self, statement: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        rows = facade.periodic(statement, params)
        self.statements += 1
        if rows:
            # The database read now() during the round trip, before this
            # moment: pairing it with the moment the answer arrived puts the
            # estimate behind the database clock by at most a round trip, so
            # a worker wakes a little late for a tick, never early (an early
            # look would cost a second statement).
            self._clock = (rows[0][0], time.monotonic())
        return rows

    def _register(self, names: list[str] | None = None) -> None:
        """Create or take over the rows of ``names`` (default all); learn their state."""
        todo = [self.schedules[n] for n in (names or list(self.schedules))]
        rows = self._execute(
            sql.REGISTER,
            {
                "names": [s.name for s in todo],
                "task_names": [s.task_name for s in todo],
                "crons": [s.cron for s in todo],
                "timezones": [s.timezone for s in todo],
                "signatures": [s.signature for s in todo],
                "started_at": self._started_at,
            },
        )
        for _now, started_at, name, signature, last_tick, written in rows:
            self._started_at = started_at
            schedule = self.schedules[name]
            mine = signature == schedule.signature
            known = self._state.get(name)
            if not mine and (known is None or known.mine):
                logger.warning(
                    "periodic schedule %s is declared differently by a worker started later; "
                    "this worker leaves it to that one worker=%s",
                    name,
                    self.worker_id,
                )
            elif written:
                logger.info(
                    "periodic schedule %s (%s %s) starts from now worker=%s",
                    name,
                    schedule.cron,
                    schedule.timezone,
                    self.worker_id,
                )
            self._state[name] = _State(last_tick, next_tick(schedule.cron, schedule.tz, last_tick), mine)

    def _tick(self, schedule: Schedule, state: _State) -> None:
        now = self.db_now()
        every_tick = schedule.catch_up == "all" and schedule.overlap
        limit = schedule.max_catch_up if every_tick else LATEST_CANDIDATES
        ticks = candidate_ticks(schedule.cron, schedule.tz, state.last_tick, now, LOOKAHEAD, limit)
        late_seconds = None
        if schedule.catch_up == "none" and ticks:
            following = next_tick(schedule.cron, schedule.tz, ticks[-1])
            period = (following - ticks[-1]).total_seconds() if following else ON_TIME_MAX_SECONDS
            late_seconds = min(ON_TIME_MAX_SECONDS, period / 2)
        options = self._options[schedule.name]
        rows = self._execute(
            sql.TICK,
            {
                "name": schedule.name,
                "signature": schedule.signature,
                "ticks": ticks,
                "run_ats": [t + jitter(schedule.name, t, schedule.jitter_seconds) for t in ticks],
                "keys": [schedule.key(t) for t in ticks],
                "keep": schedule.max_catch_up if every_tick else 1,
                "late_seconds": late_seconds,
                "overlap": schedule.overlap,
                "task_name": schedule.task_name,
                "queue": options["queue"],
                "priority": options["priority"],
                "max_attempts": options["max_attempts"],
                "args": Jsonb(schedule.args),
                "kwargs": Jsonb(schedule.kwargs),
                "channel": conf.get("NOTIFY_CHANNEL"),
            },
        )
        _now, current_tick, due_tick, moved_tick, job_ids, keys, skipped, busy, _notified = rows[0]
        if current_tick is None:
            # The row is gone or holds another definition now: look again.
            self._register([schedule.name])
            return
        if moved_tick is not None:
            state.last_tick = moved_tick
        else:
            # Nothing was due, or another worker decided the due ticks first
            # (its last_tick is past them, though this statement's snapshot
            # may not show it yet).
            state.last_tick = max(current_tick, due_tick or current_tick)
        state.next_due = next_tick(schedule.cron, schedule.tz, state.last_tick)
        self.enqueued += len(job_ids)
        for job_id, key in zip(job_ids, keys, strict=True):
            logger.info(
                "periodic job enqueued job=%s schedule=%s tick=%s worker=%s",
                job_id,
                schedule.name,
                key[-20:],
                self.worker_id,
            )
        if skipped:
            why = "the previous job is still queued or running" if busy else f"catch_up={schedule.catch_up}"
            logger.info(
                "periodic tick(s) skipped schedule=%s count=%d up to tick=%s worker=%s: %s",
                schedule.name,
                skipped,
                state.last_tick.strftime("%Y-%m-%dT%H:%M:%SZ"),
                self.worker_id,
                why,
            )
