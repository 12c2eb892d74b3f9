"""The peers' side of the comparison: apps, tasks and worker factories.

Imported by ``compare.py`` (to enqueue) and by the peers' own worker
processes (``pgq run peers:pgqueuer_factory``, ``procrastinate --app
peers.procrastinate_app worker``). Runs in the comparison virtualenv, never
in leasejobs' own. Each peer gets its own database (``PEER_DSN``).

The job is each peer's native no-op: an ``async def`` that returns at once,
as in the project's research notes (shared/research/peer-benchmark.md).
"""

import contextlib
import os

import procrastinate

DSN = os.environ.get("PEER_DSN", "")

# -- PgQueuer (https://github.com/janbjorge/pgqueuer) ---------------------------


@contextlib.asynccontextmanager
async def pgqueuer_factory():
    """What ``pgq run`` enters: a PgQueuer on an asyncpg connection, one no-op entrypoint."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job) -> None:
        return None

    try:
        yield pgq
    finally:
        await conn.close()


# -- procrastinate (https://github.com/procrastinate-org/procrastinate) ---------

procrastinate_app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@procrastinate_app.task(name="noop")
async def noop() -> None:
    return None


def procrastinate_sync_app(dsn: str) -> procrastinate.App:
    """An app for synchronous ``defer()`` by task name (procrastinate's sync connector)."""
    return procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
