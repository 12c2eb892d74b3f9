"""The worker's own PostgreSQL connections.

Claim, heartbeat, finish and LISTEN each run on a dedicated psycopg
connection made from Django's database settings, so that no job body, no
Django transaction and no pooled connection can delay a heartbeat or swallow
a NOTIFY. Each connection survives a restarted server or a killed backend:
a failed statement closes it, and the next use reconnects (with backoff).
"""

import contextlib
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from json.scanner import make_scanner
from typing import Any

import psycopg
from django.db import connections
from psycopg.types.json import set_json_loads

from leasejobs.conf import db_alias

logger = logging.getLogger("leasejobs.worker")

#: Errors that mean "this connection is gone", not "this statement is wrong".
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)

#: A server that answers, but only reads: the old primary during a failover,
#: ``default_transaction_read_only`` during maintenance. Waited out like a
#: restart: the connection is closed (the next one may reach the new primary)
#: and the statement reported as a lost connection.
READ_ONLY_ERRORS = (psycopg.errors.ReadOnlySqlTransaction,)

#: What a server-side prepared statement meets through a transaction pooler:
#: another client's statement of the same name, or none on this backend.
PREPARED_STATEMENT_ERRORS = (
    psycopg.errors.DuplicatePreparedStatement,
    psycopg.errors.InvalidSqlStatementName,
)

#: A worker must notice a dead link (a network cut, a host gone) in seconds,
#: not after the kernel's 15 minutes of retransmissions: TCP keepalives probe
#: idle connections (the listener's), ``tcp_user_timeout`` (ms) drops a
#: connection whose sent data stays unacknowledged. The loops then reconnect
#: and carry on. DATABASES OPTIONS win over these.
LINK_CHECKS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}

#: A named placeholder of the statements in ``leasejobs.db.sql``, or an escaped percent sign.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@functools.lru_cache(maxsize=256)
def positional(query: str) -> tuple[str, tuple[str, ...]]:
    """``query`` with ``$1``, ``$2``... for its named placeholders, and the names in that order.

    psycopg parses a query's placeholders again at every execution once the
    query is longer than 4,096 bytes (it caches only shorter ones), and the
    claim is 7 KB: 40 µs a claim on a busy worker, and about 150 µs of an idle
    worker's path from a NOTIFY to the body (docs/performance.md, "Latency").
    Converted once here, statements run through psycopg's ``RawCursor``,
    which parses nothing.
    """
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return _PLACEHOLDER.sub(number, query), tuple(names)


def run(conn: psycopg.Connection[Any], query: str, params: dict[str, Any] | None) -> psycopg.RawCursor[Any]:
    """Execute ``query`` with its named ``params`` on ``conn`` (see ``positional``)."""
    text, names = positional(query)
    cursor = psycopg.RawCursor(conn)
    cursor.execute(text, None if params is None else [params[name] for name in names])
    return cursor


_JSON = json.JSONDecoder()
_SCAN = make_scanner(_JSON)  # what _JSON.decode calls, without its checks of blanks around the value


def _json_loads(data: bytes) -> Any:
    """``json.loads`` without its sniffing of each value's encoding (PostgreSQL sends UTF-8).

    Every claimed job brings two JSON values (its args and kwargs), most often
    ``[]`` and ``{}``. PostgreSQL prints jsonb without surrounding blanks, so
    the decoder's scanner reads the value straight from offset 0; anything
    else (never expected) takes ``decode``, which reads it or says why not.
    Reading them took about a seventh of the worker's Python per no-op job.
    """
    if data == b"[]":
        return []
    if data == b"{}":
        return {}
    text = data.decode()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return _JSON.decode(text)
    return value if end == len(text) else _JSON.decode(text)


def connection_params(alias: str | None = None) -> dict[str, Any]:
    """psycopg connect() arguments for a ``DATABASES`` alias (default: the queue's).

    Django's own cursor factory and adapters are left out: they return jsonb
    as text and bind client-side, and the worker wants neither.
    """
    params = dict(connections[alias or db_alias()].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return with_link_checks(params)


def with_link_checks(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with a connect timeout and the TCP checks of ``LINK_CHECKS`` (theirs win)."""
    params.setdefault("connect_timeout", 5)
    for name, value in LINK_CHECKS.items():
        params.setdefault(name, value)
    return params


def application_name(purpose: str, worker_id: str) -> str:
    """What a worker's connection is called in pg_stat_activity: its purpose and its worker."""
    return f"leasejobs {purpose} {worker_id}"[:63]


class WorkerConnection:
    """One lazily opened autocommit connection that reconnects after failures.

    ``execute`` runs one statement as its own transaction and returns its
    rows; on a lost connection it closes it and raises, and the next call
    opens a new one once the backoff has passed. Callers decide whether to
    retry: each of the worker's loops simply tries again on its next turn.

    ``settings`` (name -> value) hold for every statement. On a direct
    connection, which is this worker's alone, they are startup ``options``:
    one round trip per statement. Through a transaction pooler (``pooled``)
    startup ``options`` are refused and a session ``SET`` would land on
    whichever server connection the pooler lends next, so there each
    statement runs in a transaction of its own after ``set_config(...,
    true)``, which leaves no session state; without
    ``settings_in_transaction`` (for statements that cannot run in a
    transaction, such as VACUUM) they are left out there. ``pooled`` also
    turns off server-side prepared statements, which a transaction pooler
    cannot keep.
    """

    def __init__(
        self,
        purpose: str,
        worker_id: str,
        *,
        settings: dict[str, str] | None = None,
        pooled: bool = False,
        params: dict[str, Any] | None = None,
        on_notice: Callable[[psycopg.errors.Diagnostic], None] | None = None,
        settings_in_transaction: bool = True,
        prepare: bool = True,
    ) -> None:
        """``prepare`` False: never a server-side prepared statement (the listener's
        one LISTEN gains nothing from one, and through a pooler it may fail)."""
        self.purpose = purpose
        self.worker_id = worker_id
        self.pooled = pooled
        self._params = params
        self._on_notice = on_notice
        self._settings_in_transaction = settings_in_transaction
        self._prepare = prepare
        self._settings = settings or {}
        self._set_config = "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(self._settings))
        self._settings_args = [part for pair in self._settings.items() for part in pair]
        self._conn: psycopg.Connection[Any] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def connect(self) -> psycopg.Connection[Any]:
        """The open connection, opening one if needed (raises if it cannot)."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        wait = self._retry_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        params = dict(self._params) if self._params is not None else connection_params()
        # Ours replaces an application_name from DATABASES' OPTIONS: it names
        # the purpose and worker that operators look for in pg_stat_activity.
        params.pop("application_name", None)
        if not self.pooled and self._settings:
            ours = " ".join(f"-c {name}={value}" for name, value in self._settings.items())
            params["options"] = " ".join(filter(None, [params.get("options", ""), ours]))
        try:
            self._conn = psycopg.connect(
                **params,
                autocommit=True,
                prepare_threshold=self._prepare_threshold(),
                application_name=application_name(self.purpose, self.worker_id),
            )
        except CONNECTION_ERRORS as exc:
            if not self.pooled and "unsupported startup parameter" in str(exc):
                # A transaction pooler the start-up probe did not see refuses
                # startup options: go on with per-transaction settings.
                self._turn_pooled(exc)
                return self.connect()
            self._failed()
            raise
        set_json_loads(_json_loads, self._conn)
        if self._on_notice is not None:
            self._conn.add_notice_handler(self._on_notice)
        if self._failures:
            logger.info("reconnected %s connection worker=%s", self.purpose, self.worker_id)
        self._failures = 0
        return self._conn

    def open(self) -> None:
        """Open the connection now unless it is open, waiting out the reconnect backoff
        (raises if it cannot): for a caller that must hold nothing back while the database
        is away (``WorkerStore.finish`` keeps its rows out of the heartbeat only while it
        writes them)."""
        with self._lock:
            self.connect()

    def _prepare_threshold(self) -> int | None:
        """0 (prepare at first use) on a direct connection; None through a transaction pooler.

        The worker runs the same few statements many times a second: each is
        parsed and planned once per connection. A transaction pooler hands
        each transaction to any server connection, where the prepared
        statement does not exist (or exists twice). An explicit
        ``OPTIONS["prepare_threshold"]`` in DATABASES wins on a direct one.
        """
        if self.pooled or not self._prepare:
            return None
        threshold: int | None = (
            connections[db_alias()].settings_dict.get("OPTIONS", {}).get("prepare_threshold", 0)
        )
        return threshold

    def _failed(self) -> None:
        self._failures += 1
        # 0.1 s, 0.2 s, ... capped at 5 s: quick after a blip, gentle on an outage.
        self._retry_at = time.monotonic() + min(5.0, 0.1 * 2 ** (self._failures - 1))

    def execute(self, query: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement (its own transaction) and return its rows."""
        with self._lock:
            conn = self.connect()
            with self._guard(conn):
                if not self.pooled or not self._settings or not self._settings_in_transaction:
                    cursor = run(conn, query, params)
                    return cursor.fetchall() if cursor.description else []
                with conn.transaction():
                    conn.execute(self._set_config, self._settings_args)
                    cursor = run(conn, query, params)
                    return cursor.fetchall() if cursor.description else []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        """One transaction of several statements, and its cursor, for callers whose own
        logic runs between them (the charts' stored points); failures as ``execute``'s."""
        with self._lock:
            conn = self.connect()
            with self._guard(conn), conn.transaction(), conn.cursor() as cursor:
                if self.pooled and self._settings and self._settings_in_transaction:
                    cursor.execute(self._set_config, self._settings_args)
                yield cursor

    @contextlib.contextmanager
    def _guard(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """What a failed statement does to the connection: a pooler seen, read-only, or gone."""
        try:
            yield
        except PREPARED_STATEMENT_ERRORS as exc:
            # A transaction pooler the start-up probe did not see (see
            # leasejobs.db.pooling): go on without prepared statements.
            self._turn_pooled(exc)
            raise psycopg.OperationalError(f"prepared statements fail here: {exc}") from exc
        except READ_ONLY_ERRORS as exc:
            self.close()
            self._failed()
            logger.warning(
                "the database answers read-only on the %s connection worker=%s; waiting until it "
                "takes writes again",
                self.purpose,
                self.worker_id,
            )
            raise psycopg.OperationalError(f"the database is read-only: {exc}") from exc
        except CONNECTION_ERRORS:
            if conn.closed or conn.broken:
                self.close()
                self._failed()
                logger.warning("lost %s connection worker=%s; reconnecting", self.purpose, self.worker_id)
            raise

    def _turn_pooled(self, exc: BaseException) -> None:
        """Go on as through a transaction pooler: no startup options, no prepared statements."""
        self.pooled = True
        self.close()
        logger.warning(
            "the %s connection worker=%s goes through a transaction pooler (%s); reconnecting "
            "without startup options or prepared statements",
            self.purpose,
            self.worker_id,
            type(exc).__name__,
        )

    def cancel(self) -> None:
        """Cancel the statement running now, from another thread (nothing if none runs)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.cancel_safe(timeout=2.0)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
