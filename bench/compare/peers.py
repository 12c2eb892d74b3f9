"""The peers' side of the comparison: apps, tasks and worker factories.

Imported by ``compare.py`` (to enqueue) and by the peers' own worker
processes (``pgq run peers:pgqueuer_factory``, ``procrastinate --app
peers.procrastinate_app worker``). Runs in the comparison virtualenv, never
in leasejobs' own. Each peer gets its own database (``PEER_DSN``).

The jobs are each peer's native form, an ``async def``: a no-op that returns
at once, as in the project's research notes
(shared/research/peer-benchmark.md); ``sleep``, which awaits
``asyncio.sleep`` (a job waiting on I/O); and ``spin``, which spends CPU in
pure Python (it blocks the event loop, as CPU-bound work in an async worker
does).
"""

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import procrastinate

DSN = os.environ.get("PEER_DSN", "")

# -- PgQueuer (https://github.com/janbjorge/pgqueuer) ---------------------------


@contextlib.asynccontextmanager
async def pgqueuer_factory() -> AsyncIterator[Any]:
    """What ``pgq run`` enters: a PgQueuer on an asyncpg connection, one no-op entrypoint."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    @pgq.entrypoint("sleep")
    async def sleep(job: Any) -> None:
        await asyncio.sleep(float(job.payload))

    @pgq.entrypoint("spin")
    async def spin(job: Any) -> None:
        spin_for(float(job.payload))

    @pgq.entrypoint("stamp")
    async def stamp(job: Any) -> None:
        """Appends seconds from the enqueue call (the payload: its time.time()) to this body's start."""
        started = time.time()
        with open(os.environ["PEER_LATENCY_FILE"], "a") as out:
            out.write(f"{started - float(job.payload)}\n")

    try:
        yield pgq
    finally:
        await conn.close()


# -- procrastinate (https://github.com/procrastinate-org/procrastinate) ---------

procrastinate_app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=DSN))


@procrastinate_app.task(name="noop")
async def noop() -> None:
    return None


@procrastinate_app.task(name="sleep")
async def sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@procrastinate_app.task(name="spin")
async def spin(seconds: float) -> None:
    spin_for(seconds)


def spin_for(seconds: float) -> None:
    """``seconds`` of this thread's CPU in pure Python, as leasejobs' bench ``spin`` task does."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(50))


def procrastinate_sync_app(dsn: str) -> procrastinate.App:
    """An app for synchronous ``defer()`` by task name (procrastinate's sync connector)."""
    return procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=dsn))
