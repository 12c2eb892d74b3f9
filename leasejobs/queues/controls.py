"""Queue controls: pause and resume a queue, and its limits (concurrency, rate).

The state lives in ``leasejobs_queue`` (one row per controlled queue) and the
places under each limit in ``leasejobs_slot``; the claim statements read and
take them (see ``leasejobs.db.sql.CLAIM_LIMITED``). ``LEASEJOBS["QUEUES"]`` holds
the default limits: every worker writes them to the table when it starts,
except for queues whose limits were changed at run time (``set_limits``, the
admin), which keep those.

Everything here runs on Django's connection, in its own transaction, and
NOTIFYs the queue's workers on commit so a resumed queue or a raised limit is
claimed at once.
"""

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from leasejobs import conf
from leasejobs.db import facade
from leasejobs.db.rows import QUEUE_MAX_LENGTH, is_count

#: "100/m", "20/10s", "5/s", "1000/h", "10000/d": claims per window.
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(s|m|h|d)\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_QUEUE_OPTIONS = {"concurrency", "rate"}
#: The longest rate window: 366 days, a yearly quota in a leap year. A rate
#: place is held until its claim's time plus the window, computed by
#: PostgreSQL; ``1/99999999999d`` overflowed that timestamp and failed every
#: claim of every worker. A claim's time plus 366 days stays within
#: PostgreSQL's range (its timestamps end in the year 294276, and its
#: intervals hold 290,000 years) until the year 294275.
#: ``CLAIM_LIMITED`` reads a longer window found in the table as this one.
MAX_RATE_WINDOW_DAYS = 366
MAX_RATE_WINDOW_SECONDS = MAX_RATE_WINDOW_DAYS * 86400.0


@dataclass(frozen=True)
class ConcurrencyAndRate:
    """A queue's limits, a concurrency and a rate (claims per window); None for no limit of that kind.

    Named for what it holds: "limits" alone also names the row sizes
    (``db.rows``) and the worker's gate (``worker.limits``).
    """

    concurrency: int | None = None
    rate_count: int | None = None
    rate_seconds: float | None = None

    @property
    def rate(self) -> str | None:
        if self.rate_count is None or self.rate_seconds is None:
            return None
        # In the largest unit the window is a whole number of, so that it reads
        # back (the admin form shows it): "20/10s", "100/m", "7/2d", "2/366d".
        for unit, size in sorted(_UNIT_SECONDS.items(), key=lambda item: -item[1]):
            count = Decimal(repr(self.rate_seconds)) / Decimal(repr(size))
            if count == count.to_integral_value() or unit == "s":
                break
        number = "" if count == 1 else format(count.normalize(), "f")
        return f"{self.rate_count}/{number}{unit}"


def parse_rate(text: Any) -> tuple[int, float]:
    """``"100/m"`` -> ``(100, 60.0)``; ValueError with one sentence otherwise.

    A window longer than ``MAX_RATE_WINDOW_DAYS`` is refused here, which is
    where every way of setting a rate passes: ``set_limits``, the admin
    form, ``leasejobs_queue limit`` and ``LEASEJOBS["QUEUES"]`` (checked at
    start, ``leasejobs.E003``).
    """
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or int(match.group(1)) < 1 or float(match.group(2) or 1) <= 0:
        raise ValueError(
            f"rate {text!r} is not of the form N/unit or N/<number>unit with N at least 1 "
            "and unit s, m, h or d (for example '100/m' or '20/10s')."
        )
    seconds = float(match.group(2) or 1) * _UNIT_SECONDS[match.group(3)]
    if seconds > MAX_RATE_WINDOW_SECONDS:
        raise ValueError(
            f"rate {text!r} has a window longer than {MAX_RATE_WINDOW_DAYS} days, the largest allowed "
            f"({MAX_RATE_WINDOW_SECONDS:.0f} s); write it over {MAX_RATE_WINDOW_DAYS} days or less, "
            f"such as '10000/d' or '100000/{MAX_RATE_WINDOW_DAYS}d'."
        )
    return int(match.group(1)), seconds


def parse_concurrency(value: Any) -> int:
    if not is_count(value):
        raise ValueError(f"concurrency {value!r} must be a whole number of at least 1.")
    return value


def parse_queue(name: Any, options: Any) -> ConcurrencyAndRate:
    """One entry of LEASEJOBS["QUEUES"]; ValueError with one sentence if it is wrong."""
    if not isinstance(name, str) or not name or len(name) > QUEUE_MAX_LENGTH:
        raise ValueError(
            f"queue name {name!r} must be a non-empty string of at most {QUEUE_MAX_LENGTH} characters."
        )
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
    return ConcurrencyAndRate(concurrency, count, seconds)


def configured() -> dict[str, ConcurrencyAndRate]:
    """LEASEJOBS["QUEUES"], parsed (ValueError on the first bad entry)."""
    queues = conf.get("QUEUES")
    if not isinstance(queues, dict):
        raise ValueError("LEASEJOBS['QUEUES'] must be a dict of queue name to options.")
    return {name: parse_queue(name, options) for name, options in queues.items()}


# -- writing the state ---------------------------------------------------------


def settings_differ(queues: dict[str, ConcurrencyAndRate]) -> bool:
    """Whether the table must change to match the settings (read only: workers with
    the least privileges only need SELECT on the queue table while nothing changes)."""
    found, missing = facade.queue_limits()
    rows = {name: (ConcurrencyAndRate(conc, count, secs), ours) for name, conc, count, secs, ours in found}
    if missing:
        return True
    for name, limits in queues.items():
        if name not in rows or (rows[name][1] and rows[name][0] != limits):
            return True
    return any(
        ours and limits != ConcurrencyAndRate() and name not in queues
        for name, (limits, ours) in rows.items()
    )


def sync_settings() -> None:
    """Write LEASEJOBS["QUEUES"] to the queue table (a worker does this at start)."""
    queues = configured()
    if not settings_differ(queues):
        return
    facade.sync_queues({name: _columns(limits) for name, limits in queues.items()})


def pause_queue(name: str) -> None:
    """Stop claiming the queue's jobs from the next claim on; running jobs go on."""
    _set_paused(name, True)


def resume_queue(name: str) -> None:
    """Claim the queue's jobs again; its workers are woken at once."""
    _set_paused(name, False)


def _set_paused(name: str, paused: bool) -> None:
    parse_queue(name, {})
    facade.set_paused(name, paused, conf.get("NOTIFY_CHANNEL"))


def set_limits(name: str, *, concurrency: int | None = None, rate: str | None = None) -> ConcurrencyAndRate:
    """Change a queue's limits at run time (None: no limit); they win over the settings from now on."""
    options = {k: v for k, v in (("concurrency", concurrency), ("rate", rate)) if v is not None}
    limits = parse_queue(name, options)
    facade.set_limits(name, _columns(limits), conf.get("NOTIFY_CHANNEL"))
    return limits


def make_places(name: str) -> None:
    """Bring a queue's places in line with its row (after an edit in the admin)."""
    facade.make_places(name, conf.get("NOTIFY_CHANNEL"))


def _columns(limits: ConcurrencyAndRate) -> dict[str, Any]:
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
    limits: ConcurrencyAndRate
    limits_from_settings: bool
    running: int  # concurrency places held now
    rate_used: int  # claims in the current rate window
    queued: int


def states() -> list[QueueState]:
    """Every controlled queue, with its places in use and its rate used right now."""
    return [
        QueueState(name, paused, ConcurrencyAndRate(conc, count, secs), from_settings, running, used, queued)
        for name, paused, conc, count, secs, from_settings, running, used, queued in facade.queue_states()
    ]
