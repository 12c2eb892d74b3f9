"""Transaction poolers (PgBouncer, Supavisor, Neon): detected, and what they change.

Behind a transaction pooler a client connection is lent a server connection
for one transaction at a time. Then LISTEN hears nothing (the server
connection that LISTENed is lent to someone else), session settings leak or
vanish, and server-side prepared statements fail. The worker needs to know:
``detect`` finds out at start, without any setting, and ``plan`` decides
how the worker connects. ``problems`` names the settings that break through
a pooler, for ``runworker`` and the system check ``leasejobs.E012``.
"""

from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from leasejobs import conf
from leasejobs.conf import db_alias
from leasejobs.db import maintenance
from leasejobs.db.connection import connection_params, with_link_checks


class PoolingError(Exception):
    """A setting that cannot work with the database the queue is reached through."""


#: Probes of ``detect``: one can miss a pooler whose other clients take the
#: backend in between; a direct connection never fails one.
PROBES = 5


def detect(params: dict[str, Any]) -> bool:
    """True if connections made with ``params`` go through a transaction pooler.

    On a direct connection (or a session pooler) each client connection has
    a backend of its own for its whole life. Through a transaction pooler
    it does not: a second client connection is usually lent the very backend
    the first one just gave back (``pg_backend_pid()`` shows the same pid),
    and the first one's next transaction may run on another backend. Other
    clients of a busy pooler can hide that in one probe, so it is repeated;
    on a direct connection no probe can ever see it. No probe holds a
    transaction open while another waits, so a pool of one cannot deadlock it.
    """
    params = {**params, "autocommit": True, "prepare_threshold": None}
    with psycopg.connect(**params) as first, psycopg.connect(**params) as second:
        for _ in range(PROBES):
            before = maintenance.backend_pid(first)
            other = maintenance.backend_pid(second)
            if other == before or maintenance.backend_pid(first) != before:
                return True
    return False


@dataclass(frozen=True)
class ConnectionPlan:
    """How a worker connects: through a pooler or not, and where it LISTENs (None: it polls)."""

    pooled: bool
    listen: dict[str, Any] | None
    description: str
    #: LISTEN reaches the queue's database itself, directly: claims may run on it too.
    listen_claims: bool = False


def plan() -> ConnectionPlan:
    """Detect a transaction pooler in front of the queue database and choose where to LISTEN.

    Raises ``PoolingError`` (one sentence) for a LISTEN setting that cannot
    work: an unknown alias, or a LISTEN connection that is pooled itself.
    """
    pooled = detect(connection_params())
    listen = _listen_params()
    if listen is not None:
        if detect(listen):
            raise PoolingError(
                f"{_listen_setting()} goes through a transaction pooler too, where LISTEN hears "
                "nothing: point it at PostgreSQL directly."
            )
        return ConnectionPlan(pooled, listen, f"pooler={_mode(pooled)} wakeups=LISTEN on {_listen_setting()}")
    if pooled:
        every = float(conf.get("POLL_INTERVAL_SECONDS"))
        return ConnectionPlan(
            True,
            None,
            f"pooler=transaction wakeups=polling every {every:g}s "
            "(set LEASEJOBS['LISTEN_URL'] or ['LISTEN_DATABASE'] to a direct connection for LISTEN)",
        )
    return direct()


def direct() -> ConnectionPlan:
    """No pooler: every connection, LISTEN's too, goes to the queue's database."""
    return ConnectionPlan(False, connection_params(), "pooler=none wakeups=LISTEN", listen_claims=True)


def _mode(pooled: bool) -> str:
    return "transaction" if pooled else "none"


def _listen_setting() -> str:
    if conf.get("LISTEN_URL"):
        return "LEASEJOBS['LISTEN_URL']"
    return f"LEASEJOBS['LISTEN_DATABASE'] ({conf.get('LISTEN_DATABASE')!r})"


def _listen_params() -> dict[str, Any] | None:
    """Connect arguments of the configured direct LISTEN connection, if any."""
    url = conf.get("LISTEN_URL")
    alias = conf.get("LISTEN_DATABASE")
    if url and alias:
        raise PoolingError("Set LEASEJOBS['LISTEN_URL'] or LEASEJOBS['LISTEN_DATABASE'], not both.")
    if url:
        try:
            return with_link_checks(psycopg.conninfo.conninfo_to_dict(str(url)))
        except psycopg.ProgrammingError as exc:
            raise PoolingError(f"LEASEJOBS['LISTEN_URL'] is not a valid PostgreSQL URL ({exc}).") from None
    if alias:
        if alias not in connections.settings:
            raise PoolingError(f"LEASEJOBS['LISTEN_DATABASE'] names {alias!r}, which is not in DATABASES.")
        return connection_params(alias)
    return None


def problems(alias: str | None = None) -> list[str]:
    """What in DATABASES breaks once ``alias`` (default: the queue's) is transaction-pooled.

    Django's own connections must not use server-side prepared statements
    (psycopg's default ``prepare_threshold`` of 5 applies when
    ``server_side_binding`` is on) nor server-side cursors (``.iterator()``
    holds a cursor across transactions).
    """
    alias = alias or db_alias()
    settings = connections.settings[alias]
    options = settings.get("OPTIONS", {})
    found = []
    if options.get("server_side_binding") and options.get("prepare_threshold", 5) is not None:
        found.append(
            f"DATABASES[{alias!r}] binds server-side through a transaction pooler: "
            "set OPTIONS['prepare_threshold'] to None there."
        )
    if not settings.get("DISABLE_SERVER_SIDE_CURSORS"):
        found.append(
            f"DATABASES[{alias!r}] goes through a transaction pooler: set DISABLE_SERVER_SIDE_CURSORS "
            "to True there, or .iterator() breaks."
        )
    return found
