"""argparse types shared by leasejobs' management commands.

Each parses one command-line word or raises ``ValueError``; argparse then
prints ``--option: invalid <type name> value: 'word'``, so each type's
``__name__`` says in plain words what was expected. None accepts nan or inf:
nan fails every comparison (``--heartbeat nan`` never heartbeated) and inf is
no duration.
"""

import math
import re

#: Seconds per unit of a duration such as ``7d``.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _number(kind: type[int] | type[float], text: str) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(text) from None
    if math.isnan(value) or math.isinf(value):
        raise ValueError(text)
    return value


def positive_int(text: str) -> int:
    """A whole number greater than zero."""
    value = int(_number(int, text))
    if value <= 0:
        raise ValueError(text)
    return value


def positive_float(text: str) -> float:
    """A finite number greater than zero."""
    value = _number(float, text)
    if value <= 0:
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    """A whole number, zero or more."""
    value = int(_number(int, text))
    if value < 0:
        raise ValueError(text)
    return value


def non_negative_float(text: str) -> float:
    """A finite number, zero or more."""
    value = _number(float, text)
    if value < 0:
        raise ValueError(text)
    return value


def port(text: str) -> int:
    """A TCP port number, 1 to 65535."""
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(text)
    return value


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers greater than zero: ``1,2,4``."""
    values = [positive_int(part) for part in text.split(",") if part.strip()]
    if not values:
        raise ValueError(text)
    return values


def duration(text: str) -> float:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or plain seconds, as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ValueError(text)
    return float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]


port.__name__ = "port number"
positive_int.__name__ = "positive int"
positive_float.__name__ = "positive float"
non_negative_int.__name__ = "non-negative int"
non_negative_float.__name__ = "non-negative number"
positive_ints.__name__ = "comma-separated list of positive int"
duration.__name__ = "duration such as 7d, 12h, 30m or 45s"
