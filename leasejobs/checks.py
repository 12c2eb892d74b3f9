"""System checks: mistakes in the LEASEJOBS setting, reported at start-up.

``runworker``, ``runserver``, ``migrate`` and ``check`` run them, so a typo
such as ``LEASE_SECOND`` stops the process with one clear line instead of
being silently ignored.
"""

import math
from typing import Any

import psycopg
from django.core import checks
from django.core.checks import Error, Tags, register
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from leasejobs import conf
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
    return [Error(found, id="leasejobs.E010") for found in pooling.problems()] if pooled else []


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
