"""Control of the PostgreSQL server that DATABASE_URL points at, for the chaos scenarios.

Two kinds of local server can be restarted: a Debian/Ubuntu cluster (found
with ``pg_lsclusters`` by its data directory, restarted with
``pg_ctlcluster``) and the embedded server of ``localdb`` (its own
``pg_ctl``). The server is identified by ``SHOW data_directory``, so a server
on another host, or in a container that merely publishes the port, is never
mistaken for a local one.

A restart cuts every session on the server. It is refused (the caller skips,
saying why) while sessions of *other* databases are connected: on a shared
development server those are other people's test runs. In CI the server
serves this run only.
"""

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.db import connection

import localdb
from tests.chaos.helpers import database_call
from tests.helpers import wait_until

RESTART_TIMEOUT = 60.0


class Unavailable(Exception):
    """This server cannot be restarted or reconfigured from here (the reason is the message)."""


@dataclass(frozen=True)
class Server:
    data_directory: Path
    command: list[str]  # restarts it, waiting until it accepts connections
    run_as_embedded_user: bool = False

    def restart(self) -> None:
        """Restart the server (fast shutdown: sessions are cut) and wait until it answers."""
        refuse_if_shared()
        user = localdb._system_user() if self.run_as_embedded_user else None
        localdb._run(self.command, user, timeout=RESTART_TIMEOUT)
        connection.close()
        wait_until(
            lambda: database_call(_ping, False),
            timeout=RESTART_TIMEOUT,
            interval=0.2,
            what="PostgreSQL answers again after its restart",
        )


def _ping() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return True


def local_server() -> Server:
    """The local server DATABASE_URL points at, or ``Unavailable`` saying why not."""
    data_directory = Path(_show("data_directory")).resolve()
    if shutil.which("pg_lsclusters"):
        listing = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True)
        for line in listing.stdout.splitlines():
            version, name, _port, _status, _owner, pgdata, *_ = line.split()
            if Path(pgdata).resolve() == data_directory:
                return Server(
                    data_directory,
                    ["pg_ctlcluster", "--skip-systemctl-redirect", "-m", "fast", version, name, "restart"],
                )
    embedded = localdb.Embedded()
    if embedded.pgdata.resolve() == data_directory and embedded.postmaster() is not None:
        pg_ctl = localdb._bin_dir() / "pg_ctl"
        return Server(
            data_directory,
            # pg_ctl restart reuses the options of the last start (its port).
            [str(pg_ctl), "restart", "-D", str(data_directory), "-l", str(embedded.log), "-m", "fast", "-w"],
            run_as_embedded_user=True,
        )
    raise Unavailable(
        f"the PostgreSQL at DATABASE_URL (data directory {data_directory}) is neither a cluster "
        "pg_lsclusters lists nor the embedded server of localdb: it cannot be restarted from here"
    )


def refuse_if_shared() -> None:
    """``Unavailable`` while sessions of other databases use this server."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT datname, count(*) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND datname IS DISTINCT FROM current_database() GROUP BY datname ORDER BY datname"
        )
        others = cursor.fetchall()
    if others:
        shown = ", ".join(f"{n} on {name}" for name, n in others)
        raise Unavailable(
            f"other sessions use this PostgreSQL ({shown}); restarting it would cut them. "
            "Run the chaos suite on a server of its own (CI does; or point DATABASE_URL at your own cluster)."
        )


@contextmanager
def accepting(address: str, clients: str) -> Iterator[None]:
    """Let the test's user reach its database on ``address`` from ``clients``, while it lasts.

    A pg_hba.conf line for exactly this database, user and client subnet
    (trust), put first so that no earlier line shadows it, and a reload;
    removed again at the end, so no trust rule outlives the test.
    ``listen_addresses = '*'`` through ALTER SYSTEM and a restart, only if the
    server does not listen on ``address`` yet. That one stays (undoing it
    would take another restart); without a pg_hba line it admits no one.
    """
    server = local_server()
    settings = connection.settings_dict
    rule = f'host "{settings["NAME"]}" "{settings["USER"]}" {clients} trust'
    added = f"# leasejobs chaos test, removed when it ends (tests/chaos/pgserver.py)\n{rule}\n"
    hba = Path(_show("hba_file"))
    try:
        hba.write_text(added + hba.read_text())
    except OSError as exc:
        raise Unavailable(f"cannot add {rule!r} to {hba}: {exc}") from exc
    try:
        _reload()
        listening = {a.strip() for a in _show("listen_addresses").split(",")}
        if not listening & {"*", "0.0.0.0", address}:
            refuse_if_shared()
            with connection.cursor() as cursor:
                cursor.execute("ALTER SYSTEM SET listen_addresses = '*'")
            server.restart()
        yield
    finally:
        hba.write_text(hba.read_text().replace(added, "", 1))
        _reload()


def _show(setting: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [setting])
        return cursor.fetchone()[0]


def _reload() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_reload_conf()")


def terminate(pids: list[int]) -> int:
    """pg_terminate_backend each pid; how many were terminated."""
    if not pids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest(%s) AS pid", [pids]
        )
        return cursor.fetchone()[0]


def backends_of(worker_ids: set[str]) -> list[tuple[int, str, str]]:
    """(pid, purpose, state) of every backend of these workers, and of no one else.

    Worker connections are named ``leasejobs <purpose> <worker id>`` (job
    bodies of chaos workers ``leasejobs body <worker id>``).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state FROM pg_stat_activity"
            " WHERE application_name LIKE 'leasejobs %%' AND pid <> pg_backend_pid()"
        )
        rows = cursor.fetchall()
    found = []
    for pid, name, state in rows:
        _leasejobs, purpose, worker_id = [*name.split(" ", 2), "", ""][:3]
        if worker_id in worker_ids:
            found.append((pid, purpose, state or ""))
    return found
