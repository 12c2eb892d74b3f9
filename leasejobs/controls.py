"""Queue controls: pause and resume a queue, and its limits (concurrency, rate).

The state lives in ``leasejobs_queue`` (one row per controlled queue) and the
places under each limit in ``leasejobs_slot``; the claim statements read and
take them (see ``leasejobs.sql.CLAIM_LIMITED``). ``LEASEJOBS["QUEUES"]`` holds
the default limits: every worker writes them to the table when it starts,
except for queues whose limits were changed at run time (``set_limits``, the
admin), which keep those.

Everything here runs on Django's connection, in its own transaction, and
NOTIFYs the queue's workers on commit so a resumed queue or a raised limit is
claimed at once.
"""

import re
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction

from leasejobs import conf
from leasejobs.conf import db_alias

#: "100/m", "20/10s", "5/s", "1000/h", "10000/d": claims per window.
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|m|h|d)\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_QUEUE_OPTIONS = {"concurrency", "rate"}


@dataclass(frozen=True)
class Limits:
    """A queue's limits; None for no limit of that kind."""

    concurrency: int | None = None
    rate_count: int | None = None
    rate_seconds: float | None = None

    @property
    def rate(self) -> str | None:
        if self.rate_count is None or self.rate_seconds is None:
            return None
        units = {seconds: unit for unit, seconds in _UNIT_SECONDS.items()}
        window = units.get(self.rate_seconds, f"{self.rate_seconds:g}s")
        return f"{self.rate_count}/{window}"


def parse_rate(text: Any) -> tuple[int, float]:
    """``"100/m"`` -> ``(100, 60.0)``; ValueError with one sentence otherwise."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) < 1 or float(match.group(2) or 1) <= 0:
        raise ValueError(
            f"rate {text!r} is not of the form N/unit or N/<number>unit with N at least 1 "
            "and unit s, m, h or d (for example '100/m' or '20/10s')."
        )
    return int(match.group(1)), float(match.group(2) or 1) * _UNIT_SECONDS[match.group(3)]


def parse_concurrency(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"concurrency {value!r} must be a whole number of at least 1.")
    return value


def parse_queue(name: Any, options: Any) -> Limits:
    """One entry of LEASEJOBS["QUEUES"]; ValueError with one sentence if it is wrong."""
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ValueError(f"queue name {name!r} must be a non-empty string of at most 100 characters.")
    if not isinstance(options, dict):
        raise ValueError(f"the options of queue {name!r} must be a dict such as {{'concurrency': 2}}.")
    unknown = sorted(set(options) - _QUEUE_OPTIONS)
    if unknown:
        raise ValueError(
            f"queue {name!r} has unknown option(s) {', '.join(unknown)}; known: concurrency, rate."
        )
    try:
        concurrency = parse_concurrency(options["concurrency"]) if "concurrency" in options else None
        count, seconds = parse_rate(options["rate"]) if "rate" in options else (None, None)
    except ValueError as exc:
        raise ValueError(f"queue {name!r}: {exc}") from None
    return Limits(concurrency, count, seconds)


def configured() -> dict[str, Limits]:
    """LEASEJOBS["QUEUES"], parsed (ValueError on the first bad entry)."""
    queues = conf.get("QUEUES")
    if not isinstance(queues, dict):
        raise ValueError("LEASEJOBS['QUEUES'] must be a dict of queue name to options.")
    return {name: parse_queue(name, options) for name, options in queues.items()}


# -- writing the state ---------------------------------------------------------

_SYNC_ROW = """
INSERT INTO leasejobs_queue (name, paused, concurrency, rate_count, rate_seconds,
                             limits_from_settings, updated_at)
VALUES (%(name)s, false, %(concurrency)s, %(rate_count)s, %(rate_seconds)s, true, now())
ON CONFLICT (name) DO UPDATE SET
    concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds, updated_at = now()
WHERE leasejobs_queue.limits_from_settings
  AND (leasejobs_queue.concurrency, leasejobs_queue.rate_count, leasejobs_queue.rate_seconds)
      IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate_count, EXCLUDED.rate_seconds)
"""

_DROP_UNSET = """
UPDATE leasejobs_queue SET concurrency = NULL, rate_count = NULL, rate_seconds = NULL, updated_at = now()
WHERE limits_from_settings AND NOT (name = ANY(%(names)s::text[]))
  AND (concurrency IS NOT NULL OR rate_count IS NOT NULL)
"""

#: The places 1..limit of a queue's limits; free places above a lowered
#: limit are removed (held ones stay until freed, and are never taken again:
#: the claim takes places numbered up to the limit only).
_QUEUE_SLOTS = """
WITH q AS (SELECT name, concurrency, rate_count FROM leasejobs_queue WHERE name = %(name)s),
made AS (
    INSERT INTO leasejobs_slot (kind, name, n)
    SELECT k.kind, q.name, n
    FROM q, LATERAL (VALUES ('concurrency', q.concurrency), ('rate', q.rate_count)) AS k(kind, lim),
         generate_series(1, k.lim) AS n
    ON CONFLICT (kind, name, n) DO NOTHING
)
DELETE FROM leasejobs_slot AS s
USING q
WHERE s.name = q.name
  AND ((s.kind = 'concurrency' AND s.n > COALESCE(q.concurrency, 0))
       OR (s.kind = 'rate' AND s.n > COALESCE(q.rate_count, 0)))
  AND (s.held_until IS NULL OR s.held_until < now())
"""

_SET_PAUSED = """
INSERT INTO leasejobs_queue (name, paused, limits_from_settings, updated_at)
VALUES (%(name)s, %(paused)s, true, now())
ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused, updated_at = now()
"""

_SET_LIMITS = """
INSERT INTO leasejobs_queue (name, paused, concurrency, rate_count, rate_seconds,
                             limits_from_settings, updated_at)
VALUES (%(name)s, false, %(concurrency)s, %(rate_count)s, %(rate_seconds)s, false, now())
ON CONFLICT (name) DO UPDATE SET
    concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count,
    rate_seconds = EXCLUDED.rate_seconds, limits_from_settings = false, updated_at = now()
"""


def _notify(cursor: Any, name: str) -> None:
    cursor.execute("SELECT pg_notify(%s, %s)", [conf.get("NOTIFY_CHANNEL"), name])


#: Queues whose places do not cover their limits (a limit raised by hand in the table).
_MISSING_SLOTS = """
SELECT EXISTS (
    SELECT 1 FROM leasejobs_queue AS q
    WHERE (q.concurrency IS NOT NULL AND q.concurrency > (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.kind = 'concurrency' AND s.name = q.name AND s.n <= q.concurrency))
       OR (q.rate_count IS NOT NULL AND q.rate_count > (
              SELECT count(*) FROM leasejobs_slot AS s
              WHERE s.kind = 'rate' AND s.name = q.name AND s.n <= q.rate_count))
)
"""


def settings_differ(queues: dict[str, Limits]) -> bool:
    """Whether the table must change to match the settings (read only: workers with
    the least privileges only need SELECT on the queue table while nothing changes)."""
    with connections[db_alias()].cursor() as cursor:
        cursor.execute(
            "SELECT name, concurrency, rate_count, rate_seconds, limits_from_settings FROM leasejobs_queue"
        )
        rows = {
            name: (Limits(conc, count, secs), ours) for name, conc, count, secs, ours in cursor.fetchall()
        }
        cursor.execute(_MISSING_SLOTS)
        (missing,) = cursor.fetchone()
    if missing:
        return True
    for name, limits in queues.items():
        if name not in rows or (rows[name][1] and rows[name][0] != limits):
            return True
    return any(ours and limits != Limits() and name not in queues for name, (limits, ours) in rows.items())


def sync_settings() -> None:
    """Write LEASEJOBS["QUEUES"] to the queue table (a worker does this at start)."""
    queues = configured()
    if not settings_differ(queues):
        return
    with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
        for name, limits in sorted(queues.items()):
            cursor.execute(_SYNC_ROW, {"name": name, **_columns(limits)})
        cursor.execute(_DROP_UNSET, {"names": sorted(queues)})
        cursor.execute("SELECT name FROM leasejobs_queue ORDER BY name")
        for (name,) in cursor.fetchall():
            cursor.execute(_QUEUE_SLOTS, {"name": name})


def pause_queue(name: str) -> None:
    """Stop claiming the queue's jobs from the next claim on; running jobs go on."""
    _set_paused(name, True)


def resume_queue(name: str) -> None:
    """Claim the queue's jobs again; its workers are woken at once."""
    _set_paused(name, False)


def _set_paused(name: str, paused: bool) -> None:
    parse_queue(name, {})
    with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
        cursor.execute(_SET_PAUSED, {"name": name, "paused": paused})
        _notify(cursor, name)


def set_limits(name: str, *, concurrency: int | None = None, rate: str | None = None) -> Limits:
    """Change a queue's limits at run time (None: no limit); they win over the settings from now on."""
    options = {k: v for k, v in (("concurrency", concurrency), ("rate", rate)) if v is not None}
    limits = parse_queue(name, options)
    with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
        cursor.execute(_SET_LIMITS, {"name": name, **_columns(limits)})
        cursor.execute(_QUEUE_SLOTS, {"name": name})
        _notify(cursor, name)
    return limits


def make_slots(name: str) -> None:
    """Bring a queue's places in line with its row (after an edit in the admin)."""
    with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
        cursor.execute(_QUEUE_SLOTS, {"name": name})
        _notify(cursor, name)


def _columns(limits: Limits) -> dict[str, Any]:
    return {
        "concurrency": limits.concurrency,
        "rate_count": limits.rate_count,
        "rate_seconds": limits.rate_seconds,
    }


# -- reading the state ---------------------------------------------------------


@dataclass(frozen=True)
class QueueState:
    """What the admin and ``leasejobs_queue list`` show of one queue."""

    name: str
    paused: bool
    limits: Limits
    limits_from_settings: bool
    running: int  # concurrency places held now
    rate_used: int  # claims in the current rate window
    queued: int


_STATES = """
SELECT q.name, q.paused, q.concurrency, q.rate_count, q.rate_seconds, q.limits_from_settings,
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'concurrency' AND s.name = q.name AND s.held_until >= now()),
       (SELECT count(*) FROM leasejobs_slot AS s
        WHERE s.kind = 'rate' AND s.name = q.name AND s.held_until >= now()),
       (SELECT count(*) FROM leasejobs_job AS j WHERE j.status = 'queued' AND j.queue = q.name)
FROM leasejobs_queue AS q
ORDER BY q.name
"""


def states() -> list[QueueState]:
    """Every controlled queue, with its places in use and its rate used right now."""
    with connections[db_alias()].cursor() as cursor:
        cursor.execute(_STATES)
        rows = cursor.fetchall()
    return [
        QueueState(name, paused, Limits(conc, count, secs), from_settings, running, used, queued)
        for name, paused, conc, count, secs, from_settings, running, used, queued in rows
    ]
