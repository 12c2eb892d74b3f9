"""What a job row accepts: lengths of names and keys, the priority range, and JSON.

These are the column sizes of ``leasejobs.models`` and the JSON rules of the
``args``, ``kwargs``, ``result`` and side-effect ``data`` columns. Enqueue,
the job context, the worker and ``runworker`` all check against them; they
live here, apart from any of those paths, so that a module that only needs a
limit imports nothing that enqueues.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from leasejobs import conf

#: ``Job.queue`` is a ``CharField(max_length=100)``.
QUEUE_MAX_LENGTH = 100
#: ``Job.idempotency_key``, ``Job.leased_by`` and ``SideEffect.key`` are ``CharField(max_length=255)``.
KEY_MAX_LENGTH = 255
#: The priorities a job may have (higher runs first); ``Job.priority`` is a smallint.
PRIORITY_RANGE = (-100, 100)
#: A worker id goes into ``leased_by`` and ``worker_ids``, and into every log line.
WORKER_ID_MAX_LENGTH = 200


#: One encoder for every value: ``json.dumps`` with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode_json(value: Any, what: str) -> str:
    """JSON-encode ``value`` or raise a ``TypeError`` that names ``what``.

    ``allow_nan=False``: PostgreSQL's jsonb has no NaN or Infinity, and a
    value that cannot be stored is refused where the caller can see it.
    """
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON (lists, dicts, str, int, float, bool, None): {exc}") from exc


def encode_payload(
    task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any], limit: int | None = None
) -> tuple[str, str]:
    """The JSON of one job's arguments, refused if not JSON or over ``MAX_PAYLOAD_BYTES``.

    ``limit``: that setting, when the caller read it once for many jobs.
    """
    try:  # most calls: no arguments, or plain ones; the error message only when needed
        args_json = _ENCODER.encode(args if type(args) is list else list(args)) if args else "[]"
        kwargs_json = _ENCODER.encode(kwargs if type(kwargs) is dict else dict(kwargs)) if kwargs else "{}"
    except (TypeError, ValueError):
        args_json = encode_json(list(args), f"the arguments of {task_name}")
        kwargs_json = encode_json(dict(kwargs), f"the keyword arguments of {task_name}")
    if limit is None:
        limit = conf.get("MAX_PAYLOAD_BYTES")
    size = len(args_json) + len(kwargs_json)  # json.dumps escapes to ASCII: chars are bytes
    if size > limit:
        raise ValueError(
            f"the arguments of {task_name} are {size} bytes of JSON, over the "
            f"LEASEJOBS['MAX_PAYLOAD_BYTES'] limit of {limit}; store large data "
            "elsewhere and pass its id."
        )
    return args_json, kwargs_json
