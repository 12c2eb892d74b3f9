"""When a schedule ticks: cron expressions evaluated by cronsim, in the schedule's zone.

cronsim (the parser of Healthchecks, a cron monitoring service) is used
rather than croniter because it follows Debian/Vixie cron's daylight-saving
rules on purpose and with tests (a daily 02:30 job runs once on the
spring-forward day, just after the jump, and once on the fall-back day, at
the first 02:30), works with ``zoneinfo``, iterates backwards (what "the
latest missed tick" needs without walking a long downtime forwards), and
accepts a sixth, leading seconds field; croniter was declared unmaintained
in December 2024 and has had DST bugs fixed only recently (see
docs/periodic.md).

Every function here takes "now" as an argument: the scheduler passes the
database's clock, never the machine's.
"""

import datetime as dt
import hashlib
import itertools
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

UTC = dt.UTC


class ScheduleError(ValueError):
    """A schedule that cannot run; the message is one sentence for the user."""


def zone(name: str) -> ZoneInfo:
    """The ``ZoneInfo`` called ``name``, or a ``ScheduleError``."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(f"unknown time zone {name!r}") from None


def check_expression(cron: object) -> str:
    """``cron`` if it is a 5-field (or 6-field, seconds first) expression, else ``ScheduleError``."""
    if not isinstance(cron, str):
        raise ScheduleError(f"the cron expression must be a string, not {cron!r}")
    try:
        next(CronSim(cron, dt.datetime(2000, 1, 1, tzinfo=UTC)))
    except CronSimError as exc:
        raise ScheduleError(f"bad cron expression {cron!r} ({exc})") from None
    except StopIteration:
        raise ScheduleError(f"the cron expression {cron!r} never matches a date") from None
    return cron


def next_tick(cron: str, tz: ZoneInfo, after: dt.datetime) -> dt.datetime | None:
    """The first tick strictly after ``after`` (UTC), or None if there is none for 50 years."""
    it = CronSim(cron, after.astimezone(tz))
    try:
        return next(it).astimezone(UTC)
    except StopIteration:
        return None


def latest_ticks(
    cron: str, tz: ZoneInfo, after: dt.datetime, until: dt.datetime, limit: int
) -> list[dt.datetime]:
    """The ``limit`` latest ticks in ``(after, until]``, oldest first, in UTC.

    Walks backwards from ``until``, so a long downtime costs ``limit`` steps,
    not one per missed tick.
    """
    if limit < 1:
        return []
    # cronsim's reverse iteration yields ticks strictly before its start,
    # unless the start has microseconds: then the start, truncated, counts.
    start = (until + dt.timedelta(microseconds=1)).astimezone(tz)
    found = []
    for tick in itertools.islice(CronSim(cron, start, reverse=True), limit):
        tick = tick.astimezone(UTC)
        if tick <= after:
            break
        if tick <= until:
            found.append(tick)
    found.reverse()
    return found


def candidate_ticks(
    cron: str, tz: ZoneInfo, after: dt.datetime, now: dt.datetime, lookahead: dt.timedelta, catch_up: int
) -> list[dt.datetime]:
    """The ticks a worker offers the database, oldest first: the ``catch_up`` latest in
    ``(after, now]``, then every tick in ``(now, now + lookahead]``.

    ``now`` is the worker's estimate of the database clock, a little behind
    it; the lookahead ticks let a tick the database has reached be enqueued
    without another wake-up, and are counted apart from ``catch_up``. Were
    they counted in it, the lookahead tick would take a catch-up slot:
    ``max_catch_up=N`` caught up N - 1 ticks, and with N = 1 the only tick
    offered was one not due yet, so nothing was enqueued and the worker
    looked again at once (issue 28). The database keeps the latest
    ``catch_up`` of the offered ticks it finds due (``keep`` in ``TICK``).
    """
    due = latest_ticks(cron, tz, after, now, catch_up)
    ahead = []
    tick = next_tick(cron, tz, max(after, now))
    while tick is not None and tick <= now + lookahead:
        ahead.append(tick)
        tick = next_tick(cron, tz, tick)
    return due + ahead


def jitter(name: str, tick: dt.datetime, seconds: float) -> dt.timedelta:
    """A delay in ``[0, seconds)`` that every worker computes alike for this (schedule, tick).

    Deterministic, so the job's ``run_at`` is the same whichever worker
    inserts it; the idempotency key still names the tick itself.
    """
    if seconds <= 0:
        return dt.timedelta(0)
    digest = hashlib.sha256(f"{name}\n{tick.isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return dt.timedelta(milliseconds=int(fraction * seconds * 1000))
