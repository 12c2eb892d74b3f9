"""What a job row accepts, each rule once: sizes, JSON, stored values, options, error entries.

Enqueue, the job context, the worker, the Django Tasks backend, queue
controls and ``runworker`` all check against these rules; they live here,
apart from any of those paths, so that a module that only needs a rule
imports nothing that enqueues. The sections:

- sizes and JSON: the lengths of names and keys, the priority range, JSON;
- values PostgreSQL will store: no NUL, no lone surrogate, at most the payload size;
- the options of a job: one validator each, and the lease a job runs under;
- error entries: one entry of ``Job.errors``, and the class path it names;
- periodic keys: the idempotency key of a periodic job names its schedule and tick.
"""

import datetime as dt
import json
import math
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, TypeGuard

from leasejobs import conf

# -- sizes and JSON ----------------------------------------------------------
#
# What a job row accepts: lengths of names and keys, the priority range, and JSON.
#
# These are the column sizes of ``leasejobs.models`` and the JSON rules of the
# ``args``, ``kwargs``, ``result`` and side-effect ``data`` columns. Enqueue,
# the job context, the worker and ``runworker`` all check against them; they
# live here, apart from any of those paths, so that a module that only needs a
# limit imports nothing that enqueues.

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
_DECODER = json.JSONDecoder()


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
    # Only nested lists and dicts can hold a tuple or a non-string key (a scan in C first).
    if args_json.find("[", 1) != -1 or "{" in args_json:
        refuse_changed(task_name, "args", args, args_json)
    if kwargs_json.find("{", 1) != -1 or "[" in kwargs_json:
        refuse_changed(task_name, "kwargs", kwargs, kwargs_json)
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


def refuse_changed(task_name: str, where: str, value: Any, text: str) -> None:
    """Refuse arguments that JSON would store as something else: a tuple, a non-string dict key.

    ``json`` turns a tuple into a list and the key ``1`` into ``"1"``
    without a word, so the worker would get other values than the ``Job``
    that ``enqueue`` returned shows. Equal after a round trip: nothing changed.
    """
    if _DECODER.decode(text) == (list(value) if where == "args" else dict(value)):
        return
    found = _first_change(list(value) if where == "args" else dict(value), where)
    if found is None:  # unequal for a reason of the value's own (its __eq__): let it through
        return
    path, what, becomes, fix = found
    raise TypeError(
        f"The arguments of {task_name} hold {what} at {path}, which JSON stores as {becomes}: {fix}."
    )


def _first_change(value: Any, path: str) -> tuple[str, str, str, str] | None:
    """Where in ``value`` JSON changes something: (path, what, what it becomes, what to do)."""
    if isinstance(value, tuple):
        return path, "a tuple", "a list", "pass a list"
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _first_change(item, f"{path}[{i}]")) is not None:
                return found
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                stored = _ENCODER.encode({key: None})[1:-6]
                return (
                    path,
                    f"the dict key {key!r} ({type(key).__name__})",
                    f"the string {stored}",
                    "use string keys",
                )
            if (found := _first_change(item, f"{path}[{key!r}]")) is not None:
                return found
    return None


# -- values PostgreSQL will store --------------------------------------------
#
# What a job's values must be before PostgreSQL is asked to store them.
#
# PostgreSQL refuses a NUL character in ``text`` and ``jsonb`` (and a lone
# surrogate in ``jsonb``): one such value in a batch of outcomes fails the
# whole statement. So the worker checks every value a body hands it (a return
# value, side-effect data, an exception's text) here, where the job it belongs
# to is known, and turns a bad one into that job's error instead.

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


# -- the options of a job ----------------------------------------------------
#
# The rules of a job's options, one function each, and the lease a job runs under.
#
# ``@task``, ``enqueue``, the Django Tasks backend and ``runworker`` all check
# queue names, priorities, attempts, leases and timeouts; each rule is written
# once here. A validator returns the value it accepted or raises a ``ValueError`` of one sentence that starts
# with ``what``, the name the caller knows the option by (``"queue"``,
# ``"--queue"``, ``"lease_seconds of task app.tasks.send"``), so every caller
# can re-raise it as its own error type without rewording it.


def validate_queue(value: Any, what: str = "queue") -> str:
    """A queue name: 1 to ``QUEUE_MAX_LENGTH`` storable characters."""
    if not isinstance(value, str) or not value or len(value) > QUEUE_MAX_LENGTH:
        raise ValueError(f"{what} must be a name of 1 to {QUEUE_MAX_LENGTH} characters, not {value!r}.")
    _refuse_unstorable(value, what)
    return value


def validate_priority(value: Any, what: str = "priority") -> int:
    """A whole number within ``PRIORITY_RANGE`` (higher runs first)."""
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be a whole number between {low} and {high}.")
    return value


def validate_max_attempts(value: Any, what: str = "max_attempts") -> int:
    """How many claims a job may have: a whole number of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, not {value!r}.")
    return value


def is_count(value: Any) -> TypeGuard[int]:
    """A whole number of at least 1 (not a bool): the concurrency rule of keys and queues."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def validate_concurrency_limit(value: Any, what: str = "concurrency_limit") -> int:
    """Most jobs of one concurrency key running at once: a whole number of at least 1."""
    if not is_count(value):
        raise ValueError(f"{what} must be a whole number of at least 1.")
    return value


def validate_positive_seconds(value: Any, what: str) -> float:
    """A duration that must pass: finite seconds greater than 0 (a poll interval, a timeout)."""
    # nan fails every comparison and inf never runs out: neither is a duration.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a positive number of seconds (finite), not {value!r}.")
    return value


def validate_delay_seconds(value: Any, what: str) -> float:
    """A delay or a grace that may be none: finite seconds, 0 or more (a retry's backoff, a sleep)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a finite number of seconds, 0 or more, not {value!r}.")
    return value


#: The longest the worker waits on one thing it is told (a poll, a grace, a
#: heartbeat, a summary): Python's waits refuse more than ``threading.TIMEOUT_MAX``
#: (about 292 years), and more than a day is a typo, not a setting.
MAX_WAIT_SECONDS = 86_400.0


def validate_wait_seconds(value: Any, what: str, *, zero: bool = False) -> float:
    """A wait of the worker's: finite seconds above 0 (0 too with ``zero``), a day at most."""
    least = "0 or more" if zero else "more than 0"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= 0 if zero else value > 0)
        or not value <= MAX_WAIT_SECONDS
    ):
        raise ValueError(f"{what} must be a number of seconds, {least} and a day at most, not {value!r}.")
    return value


#: The shortest lease: the worker looks at its bodies every 50 ms
#: (``leasejobs.worker.zygote.WATCH_SECONDS``) and heartbeats at a third of the
#: lease, so a lease under a second runs out between looks and its jobs thrash.
MIN_LEASE_SECONDS = 1.0
#: The longest lease, a day: it is how long a killed worker's jobs wait to be
#: taken over, and a third of it bounds the worker's statements
#: (``statement_timeout``, which PostgreSQL caps at 24.8 days) and its waits.
MAX_LEASE_SECONDS = MAX_WAIT_SECONDS


def validate_lease_seconds(value: Any, what: str = "lease_seconds") -> float:
    """A lease: seconds from ``MIN_LEASE_SECONDS`` to ``MAX_LEASE_SECONDS``."""
    least = f"at least {MIN_LEASE_SECONDS:g} and a day at most"
    rule = f"{what} must be a number of seconds, {least}, not {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not value <= MAX_LEASE_SECONDS:
        raise ValueError(f"{rule}.")
    if value < MIN_LEASE_SECONDS:
        raise ValueError(f"{rule}: a shorter lease runs out between the worker's looks at its jobs.")
    return value


def validate_timeout_seconds(value: Any, what: str = "timeout_seconds") -> float:
    """A timeout of one attempt: finite seconds greater than 0."""
    return validate_positive_seconds(value, what)


def _refuse_unstorable(value: str, what: str) -> None:
    """Refuse a NUL or a lone surrogate, which a ``text`` column cannot hold.

    Checked where the key or id is given: a step named so would otherwise run
    its function (its side effect happens) and only then fail to be recorded.
    """
    try:
        value.encode("utf-8")  # a lone surrogate has no UTF-8
    except UnicodeEncodeError:
        pass
    else:
        if "\x00" not in value:
            return
    raise ValueError(
        f"{what} must not contain a NUL character or a lone surrogate, which PostgreSQL cannot store, "
        f"not {value!r}."
    )


def validate_key(value: Any, what: str = "idempotency_key") -> str:
    """An idempotency, side-effect, step or event key: 1 to ``KEY_MAX_LENGTH`` storable characters."""
    if not isinstance(value, str) or not value or len(value) > KEY_MAX_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of at most {KEY_MAX_LENGTH} characters.")
    _refuse_unstorable(value, what)
    return value


def validate_worker_id(value: Any, what: str = "worker_id") -> str:
    """A worker id: 1 to ``WORKER_ID_MAX_LENGTH`` storable characters, not blank."""
    if not isinstance(value, str) or not value.strip() or len(value) > WORKER_ID_MAX_LENGTH:
        raise ValueError(f"{what} must be 1 to {WORKER_ID_MAX_LENGTH} characters, not blank.")
    _refuse_unstorable(value, what)
    return value


#: The optional per-task options and the rule of each (None: not set).
TASK_OPTIONS = {
    "max_attempts": validate_max_attempts,
    "lease_seconds": validate_lease_seconds,
    "timeout_seconds": validate_timeout_seconds,
}


def validate_task_options(options: Mapping[str, Any], where: str) -> None:
    """Check the ``TASK_OPTIONS`` set in ``options``; ``where`` says whose they are ("of task x")."""
    for name, value in options.items():
        if value is not None:
            TASK_OPTIONS[name](value, f"{name} {where}")


def effective_lease(task_lease: float | None, worker_lease: float) -> float:
    """The lease a job runs under: its task's own ``lease_seconds``, else the worker's.

    The claim statement computes the same in SQL (``COALESCE`` of the task's
    lease and the worker's) to stamp ``lease_until``; this is the figure the
    worker heartbeats and times prefetch by.
    """
    return float(task_lease if task_lease else worker_lease)


# -- error entries -----------------------------------------------------------
#
# One entry of ``Job.errors``: what a failed attempt left behind.
#
# The worker appends one per failed attempt (in the same statement that
# finishes it, fenced by ``attempt``); the admin shows them and the Django
# Tasks backend turns them into ``TaskError``s. ``ErrorEntry`` names the keys
# all of them read and write.


class ErrorEntry(TypedDict):
    """A failed attempt: its fencing token, its worker, the exception's class path and traceback."""

    attempt: int
    worker_id: str
    exception_class: str
    traceback: str


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class or function: what ``exception_class`` stores, a retry
    policy matches, and a task is named by default."""
    return f"{obj.__module__}.{obj.__qualname__}"


def error_entry(attempt: int, worker_id: str, exception_class: str, trace: str) -> ErrorEntry:
    """One entry of the job's ``errors`` list, its traceback made storable (``stored_text``)."""
    return ErrorEntry(
        attempt=attempt,
        worker_id=worker_id,
        exception_class=exception_class,
        traceback=stored_text(trace),
    )


def exception_entry(attempt: int, worker_id: str, exc: BaseException) -> ErrorEntry:
    """The entry of an attempt that raised ``exc``."""
    return error_entry(
        attempt, worker_id, qualified_name(type(exc)), "".join(traceback.format_exception(exc))
    )


def read_entries(value: Any) -> list[ErrorEntry]:
    """``Job.errors`` (a JSON list, ``Any`` to Django) typed as the entries it holds."""
    return list(value or [])


# -- periodic keys -------------------------------------------------------------
#
# A periodic job's idempotency key is ``periodic:<schedule>:<tick>``: the
# scheduler makes it, the job context reads the tick back from it, the admin
# links a schedule to its jobs by its prefix.

KEY_PREFIX = "periodic:"
TICK_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
TICK_LENGTH = len("2000-01-01T00:00:00Z")


def periodic_key_prefix(schedule: str) -> str:
    """The idempotency-key prefix of a schedule's jobs."""
    return f"{KEY_PREFIX}{schedule}:"


def tick_of_key(key: str | None) -> dt.datetime | None:
    """The tick a periodic job's idempotency key names, or None for any other key."""
    if not key or not key.startswith(KEY_PREFIX) or len(key) < len(KEY_PREFIX) + TICK_LENGTH + 1:
        return None
    try:
        return dt.datetime.strptime(key[-TICK_LENGTH:], TICK_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        return None
