"""System checks: mistakes in the LEASEJOBS setting, reported at start-up.

``runworker``, ``runserver``, ``migrate`` and ``check`` run them, so a typo
such as ``LEASE_SECOND`` (E002), or a value such as ``"LEASE_SECONDS": "abc"``
(E006), stops the process with one clear line instead of being silently
ignored or failing deep in a worker.
"""

import math
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.core import checks
from django.core.checks import Error, Tags, register
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from leasejobs import conf
from leasejobs.db import rows
from leasejobs.observability import logformat
from leasejobs.operations import autovacuum
from leasejobs.queues import controls


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    unknown = conf.unknown_keys()
    if not unknown:
        return []
    return [
        Error(
            f"Unknown LEASEJOBS setting(s): {', '.join(unknown)}.",
            hint=f"Known settings: {', '.join(sorted(conf.DEFAULTS))}.",
            id="leasejobs.E002",
        )
    ]


#: PostgreSQL's longest identifier (NAMEDATALEN - 1), in bytes: ``pg_notify`` refuses a
#: longer channel ("channel name too long") while ``LISTEN`` cuts it short and hears nothing.
CHANNEL_MAX_BYTES = 63


def _whole(least: int) -> Callable[[Any, str], object]:
    """The rule of a count: a whole number (not a bool) of at least ``least``."""

    def rule(value: Any, what: str) -> object:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{what} must be a whole number of at least {least}, not {value!r}.")
        return value

    return rule


def _channel(value: Any, what: str) -> object:
    """``NOTIFY_CHANNEL``: a name ``pg_notify`` and ``LISTEN`` both take."""
    try:
        size = len(value.encode("utf-8")) if isinstance(value, str) and "\x00" not in value else 0
    except UnicodeEncodeError:
        size = 0
    if not 0 < size <= CHANNEL_MAX_BYTES:
        raise ValueError(
            f"{what} must be a channel name of 1 to {CHANNEL_MAX_BYTES} bytes, PostgreSQL's longest, "
            f"not {value!r}."
        )
    return value


def _task_modules(value: Any, what: str) -> object:
    """``TASK_MODULES``: the rule discovery applies too (``conf.task_modules``), so E011 agrees."""
    return conf.task_modules()


def _port(value: Any, what: str) -> object:
    """``METRICS_PORT``: None (off) or a TCP port."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536):
        raise ValueError(f"{what} must be None (no metrics) or a port number from 1 to 65535, not {value!r}.")
    return value


def _tracing(value: Any, what: str) -> object:
    """``OPENTELEMETRY``: only ``False`` turns spans off, so a string such as "no" would not."""
    if value is not None and value is not False:
        raise ValueError(
            f"{what} must be None (spans when a tracer provider is set) or False (none), not {value!r}."
        )
    return value


def _log_format(value: Any, what: str) -> object:
    if value not in logformat.FORMATS:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, logformat.FORMATS))}, not {value!r}.")
    return value


def _optional_text(value: Any, what: str) -> object:
    """``LISTEN_URL`` and ``LISTEN_DATABASE``: None or a string (runworker checks what it names)."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be None or a string, not {value!r}.")
    return value


def _read_as(
    kind: type[float] | type[int], rule: Callable[[Any, str], object]
) -> Callable[[Any, str], object]:
    """The rule of a value the worker reads through ``float()`` or ``int()``: what that
    reads (a string from the environment, a ``Decimal``, ``64e6`` bytes) is held to
    ``rule``; what it cannot read is refused by ``rule`` as it was given."""

    def rule_of_read(value: Any, what: str) -> object:
        try:
            read = float(value) if not isinstance(value, bool) else value
        except (TypeError, ValueError):
            return rule(value, what)
        if kind is int and isinstance(read, float) and read.is_integer():
            read = int(read)
        try:
            return rule(read, what)
        except ValueError:
            return rule(value, what)  # the sentence names the value as it was given

    return rule_of_read


def _grace(value: Any, what: str) -> object:
    return rows.validate_wait_seconds(value, what, zero=True)


#: The rule of each LEASEJOBS value ``leasejobs.E006`` checks, read off how the code uses it.
#: QUEUES (E003), VACUUM_* and FRONT_WALK_INLINE_MS (E004), DATABASE (E005) and PERIODIC
#: (E010) have checks of their own.
VALUE_RULES: dict[str, Callable[[Any, str], object]] = {
    "LEASE_SECONDS": _read_as(float, rows.validate_lease_seconds),
    "MAX_ATTEMPTS": rows.validate_max_attempts,
    "RETRY_BACKOFF_SECONDS": rows.validate_delay_seconds,
    "RETRY_BACKOFF_MAX_SECONDS": rows.validate_delay_seconds,
    "MAX_SNOOZES": _whole(0),  # 0: the first snooze fails the job
    "TASK_MODULES": _task_modules,
    "MAX_PAYLOAD_BYTES": _read_as(int, _whole(1)),
    "POLL_INTERVAL_SECONDS": _read_as(float, rows.validate_wait_seconds),
    "NOTIFY_CHANNEL": _channel,
    "PREFETCH": _whole(0),  # 0: no job held ahead
    "PREFETCH_BYTES": _read_as(int, _whole(0)),  # the first job of a claim is always taken
    "STOP_GRACE_SECONDS": _read_as(float, _grace),
    "METRICS_PORT": _port,
    "OPENTELEMETRY": _tracing,
    "SUMMARY_SECONDS": _read_as(float, rows.validate_wait_seconds),
    "LOG_FORMAT": _log_format,
    "LISTEN_DATABASE": _optional_text,
    "LISTEN_URL": _optional_text,
}


def bad_value(key: str) -> str | None:
    """What ``leasejobs.E006`` says of ``LEASEJOBS[key]``, or None when it is good or unset."""
    user = getattr(settings, "LEASEJOBS", None) or {}
    if key not in user or key not in VALUE_RULES:
        return None
    try:
        VALUE_RULES[key](user[key], f"LEASEJOBS[{key!r}]")
    except ValueError as exc:
        return str(exc)
    return None


@register()
def check_values(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """A LEASEJOBS value of the wrong type or range, one sentence each, before a worker starts.

    Without it ``"LEASE_SECONDS": "abc"`` was a traceback deep in ``runworker``,
    ``"PREFETCH": -1`` a ``--burst`` worker that never exited, ``"NOTIFY_CHANNEL": ""``
    a ``DataError`` at every enqueue, ``"TASK_MODULES": "myapp.tasks"`` an import of
    the module ``m``. Only the keys the project sets are read: the defaults pass.
    """
    return [Error(found, id="leasejobs.E006") for key in VALUE_RULES if (found := bad_value(key))]


@register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The queue's database must be PostgreSQL: said by plain ``manage.py check``, before ``migrate``.

    A new project's default SQLite otherwise gets as far as ``migrate``,
    which fails on leasejobs' first PostgreSQL statement (``near "SET":
    syntax error``). Reads the configured backend; connects to nothing.
    """
    alias = conf.db_alias()
    try:
        connection = connections[alias]
    except ConnectionDoesNotExist:
        return [
            Error(
                f"LEASEJOBS['DATABASE'] is {alias!r}, which is not in DATABASES: add that alias to "
                "DATABASES or set LEASEJOBS['DATABASE'] to one that is there.",
                id="leasejobs.E005",
            )
        ]
    if connection.vendor == "postgresql":
        return []
    engine = connection.settings_dict.get("ENGINE") or "no ENGINE"
    return [
        Error(
            f"leasejobs needs PostgreSQL, but DATABASES[{alias!r}] uses {engine}: set its ENGINE to "
            "'django.db.backends.postgresql' and point it at a PostgreSQL database.",
            hint="For example: DATABASES = {'default': {'ENGINE': 'django.db.backends.postgresql', "
            "'NAME': 'mysite', 'USER': 'postgres', 'HOST': 'localhost', 'PORT': 5432}}.",
            id="leasejobs.E005",
        )
    ]


def _on_postgresql() -> bool:
    """Whether the queue's alias is a PostgreSQL database (``check_database`` says so when not)."""
    alias = conf.db_alias()
    return alias in connections.settings and connections[alias].vendor == "postgresql"


@register()
def check_queues(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Bad limits in LEASEJOBS["QUEUES"] stop the worker at start, in one sentence."""
    try:
        controls.configured()
    except ValueError as exc:
        return [Error(f"LEASEJOBS['QUEUES']: {exc}", id="leasejobs.E003")]
    return []


@register()
def check_vacuum(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The worker's VACUUM thresholds (a whole number or None, and a share of at least 0),
    and the longest walk from the claim index's front the claimer makes itself."""
    threshold, scale = conf.get("VACUUM_THRESHOLD"), conf.get("VACUUM_SCALE_FACTOR")
    found = []
    if threshold is not None and (type(threshold) is not int or threshold < 0):
        found.append(
            "LEASEJOBS['VACUUM_THRESHOLD'] must be a whole number of rows, 0 or more, "
            f"or None, not {threshold!r}."
        )
    if type(scale) not in (int, float) or not 0 <= scale < math.inf:
        found.append(f"LEASEJOBS['VACUUM_SCALE_FACTOR'] must be a number, 0 or more, not {scale!r}.")
    inline = conf.get("FRONT_WALK_INLINE_MS")
    if type(inline) not in (int, float) or not 0 <= inline < math.inf:
        found.append(f"LEASEJOBS['FRONT_WALK_INLINE_MS'] must be a number of ms, 0 or more, not {inline!r}.")
    return [Error(message, id="leasejobs.E004") for message in found]


@register(Tags.database)
def check_pooler(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Error]:
    """Through a transaction pooler, settings that would break Django's or the worker's queries.

    A database check (``migrate``, ``check --database ALIAS``): it connects
    to find out whether the queue's database is pooled. ``runworker``
    refuses to start on the same findings.
    """
    from leasejobs.conf import db_alias
    from leasejobs.db import pooling
    from leasejobs.db.connection import connection_params

    if databases is None or db_alias() not in databases or not _on_postgresql():
        return []
    try:
        pooled = pooling.detect(connection_params())
    except psycopg.Error:
        return []  # unreachable: runworker and migrate say so themselves
    return [Error(found, id="leasejobs.E012") for found in pooling.problems()] if pooled else []


@register(Tags.database)
def check_autovacuum(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.Warning]:
    """Autovacuum off for the job table: nothing fails, claims slow down and the table bloats.

    A database check (``migrate``, ``check --database ALIAS``); ``runworker``
    logs the same sentence at start.
    """
    from leasejobs.conf import db_alias
    from leasejobs.db.connection import connection_params

    if databases is None or db_alias() not in databases or not _on_postgresql():
        return []
    try:
        with psycopg.connect(**connection_params()) as conn:
            found = autovacuum.status_problem(conn)
    except psycopg.Error:
        return []  # unreachable: runworker and migrate say so themselves
    return [checks.Warning(found, id="leasejobs.W001")] if found else []
