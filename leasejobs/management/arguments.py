"""argparse types shared by leasejobs' management commands.

Each parses one command-line word or raises ``BadValue``, whose text argparse
prints as it is: ``argument --older-than: '1x' is not a duration: give a
number with a unit (s, m, h, d or w), such as 7d, 12h or 30m.`` A sentence
that names what was given and what to give, rather than argparse's own
``invalid duration value: '1x'``. None accepts nan or inf: nan fails every
comparison (``--heartbeat nan`` never heartbeated) and inf is no duration.
"""

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

from leasejobs.db.rows import MIN_LEASE_SECONDS, validate_lease_seconds, validate_wait_seconds

#: Seconds per unit of a duration such as ``7d``.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

T = TypeVar("T")


class BadValue(argparse.ArgumentTypeError, ValueError):
    """A word that is not what the option takes; its text is the sentence argparse prints.

    Also a ``ValueError``, for code that calls a type directly.
    """


def refusing(expected: str, example: str) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """Turn a parser's ``ValueError`` into ``BadValue``: ``'<word>' is not <expected>: give <example>.``

    For the types here and a command's own (``leasejobs_jobs --status``).
    """

    def decorate(parse: Callable[[str], T]) -> Callable[[str], T]:
        def checked(text: str) -> T:
            try:
                return parse(text)
            except ValueError:
                raise BadValue(f"{text!r} is not {expected}: give {example}.") from None

        checked.__name__ = expected
        checked.__doc__ = parse.__doc__
        return checked

    return decorate


def _number(kind: type[int] | type[float], text: str) -> float:
    value = kind(text)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(text)
    return value


@refusing("a whole number greater than 0", "one such as 1 or 8")
def positive_int(text: str) -> int:
    """A whole number greater than zero."""
    value = int(_number(int, text))
    if value <= 0:
        raise ValueError(text)
    return value


@refusing("a number greater than 0", "one such as 30 or 0.5")
def positive_float(text: str) -> float:
    """A finite number greater than zero."""
    value = _number(float, text)
    if value <= 0:
        raise ValueError(text)
    return value


@refusing(
    f"a lease of at least {MIN_LEASE_SECONDS:g} second and a day at most",
    "a number of seconds such as 30 or 1.5",
)
def lease_seconds(text: str) -> float:
    """A lease (``runworker --lease``): the rule of every lease, ``rows.validate_lease_seconds``."""
    return float(validate_lease_seconds(_number(float, text)))


@refusing("a number of seconds above 0 and a day at most", "one such as 10 or 0.5")
def wait_seconds(text: str) -> float:
    """How often the worker does something (``runworker --heartbeat``): ``rows.validate_wait_seconds``."""
    return float(validate_wait_seconds(_number(float, text), text))


@refusing("a number of seconds, 0 or more and a day at most", "one such as 0 or 2.5")
def grace_seconds(text: str) -> float:
    """A grace (``runworker --grace``): ``rows.validate_wait_seconds``, 0 allowed."""
    return float(validate_wait_seconds(_number(float, text), text, zero=True))


@refusing("a whole number, 0 or more", "one such as 0 or 100")
def non_negative_int(text: str) -> int:
    """A whole number, zero or more."""
    value = int(_number(int, text))
    if value < 0:
        raise ValueError(text)
    return value


@refusing("a number, 0 or more", "one such as 0 or 2.5")
def non_negative_float(text: str) -> float:
    """A finite number, zero or more."""
    value = _number(float, text)
    if value < 0:
        raise ValueError(text)
    return value


@refusing("a port number from 1 to 65535", "one such as 9100")
def port(text: str) -> int:
    """A TCP port number, 1 to 65535."""
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(text)
    return value


@refusing("a list of whole numbers greater than 0", "them separated by commas, such as 1,2,4")
def positive_ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers greater than zero: ``1,2,4``."""
    values = [positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise ValueError(text)
    return values


@refusing("a duration", "a number with a unit (s, m, h, d or w), such as 7d, 12h or 30m")
def duration(text: str) -> float:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or plain seconds, as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ValueError(text)
    return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]
