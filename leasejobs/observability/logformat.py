"""``runworker --log-format json``: one JSON object per log record.

The worker's lines follow one shape, ``<event> job=<id> attempt=<n>
worker=<id> [key=value ...][: message]`` (see ``leasejobs.worker``), so the
JSON carries the same fields as the text: ``event`` (the words before the
first field), ``job``, ``attempt``, ``worker``, ``task``, ``queue`` when the
line has them, ``message`` (the whole text line), plus ``time``, ``level``
and ``logger``, and ``exception`` with a traceback. Fields given with
``extra=`` win over the ones read from the text. Escaping is
``json.dumps``'s: a message with quotes, newlines or control characters is
still one line of valid JSON.
"""

import datetime as dt
import json
import logging
import re

#: The values of ``runworker --log-format`` and ``LEASEJOBS["LOG_FORMAT"]``.
FORMATS = ("text", "json")

#: The fields read from a worker line, and their JSON type.
FIELDS = {"job": int, "attempt": int, "worker": str, "task": str, "queue": str}

_FIELD = re.compile(r"(?<!\S)(job|attempt|worker|task|queue)=([^\s:,]+)")
#: The event is what comes before the first ``key=`` field or colon.
_EVENT_END = re.compile(r"\s+\w+=|:")


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        event = _EVENT_END.split(message, maxsplit=1)[0].strip()
        if event:
            entry["event"] = event
        for name, value in _FIELD.findall(message):
            if name not in entry:
                entry[name] = _typed(name, value)
        for name in (*FIELDS, "event"):
            if name in record.__dict__:
                entry[name] = record.__dict__[name]
        entry["message"] = message
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _typed(name: str, value: str) -> object:
    if FIELDS[name] is int:
        try:
            return int(value)
        except ValueError:
            return value
    return value
