"""What a job's values must be before PostgreSQL is asked to store them.

PostgreSQL refuses a NUL character in ``text`` and ``jsonb`` (and a lone
surrogate in ``jsonb``): one such value in a batch of outcomes fails the
whole statement. So the worker checks every value a body hands it (a return
value, side-effect data, an exception's text) here, where the job it belongs
to is known, and turns a bad one into that job's error instead.
"""

import json
from typing import Any

from leasejobs import conf
from leasejobs.limits import encode_json

#: How an error text over the size limit ends.
TRUNCATED = "\n[... truncated to LEASEJOBS['MAX_PAYLOAD_BYTES']]"


def stored_json(value: Any, what: str) -> str:
    """The JSON text of ``value``, or a one-sentence ``TypeError``/``ValueError``.

    Refused: anything that is not JSON, JSON over ``MAX_PAYLOAD_BYTES`` (the
    limit arguments have at enqueue), and strings PostgreSQL cannot store.
    """
    text = encode_json(value, what)  # ASCII: \\u escapes, so characters are bytes
    limit = int(conf.get("MAX_PAYLOAD_BYTES"))
    if len(text) > limit:
        raise ValueError(
            f"{what} is {len(text)} bytes of JSON, over the LEASEJOBS['MAX_PAYLOAD_BYTES'] limit of "
            f"{limit}; store large data elsewhere and return its id."
        )
    if "\\u0000" in text:
        raise ValueError(f"{what} contains a NUL character (\\u0000), which PostgreSQL cannot store.")
    if "\\ud" in text and _has_lone_surrogate(value):
        raise ValueError(f"{what} contains a lone surrogate character, which PostgreSQL cannot store.")
    return text


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` has a surrogate UTF-8 cannot encode (jsonb refuses it)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def stored_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NULs and surrogates escaped, within the size limit."""
    clean = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    limit = int(conf.get("MAX_PAYLOAD_BYTES"))
    if len(clean) > limit:
        clean = clean[: max(0, limit - len(TRUNCATED))] + TRUNCATED
    return clean


def one_line(text: str) -> str:
    """``text`` on one log line: line breaks and other control characters escaped.

    A message is the user's (or an attacker's) text; a newline in it must not
    start what looks like another log line.
    """
    if text.isprintable():  # the common case, checked in C
        return text
    return "".join(ch if ch.isprintable() or ch in " \t" else repr(ch)[1:-1] for ch in text)
