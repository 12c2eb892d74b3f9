"""A real PgBouncer in transaction mode, started by a test on a free port.

Debian's ``pgbouncer`` package (``apt-get install pgbouncer``; ``.ci/run``
installs it). PgBouncer refuses to run as root, so under root it runs as the
``postgres`` user; its config, auth file and log live in a directory that
user can read. It is stopped by its pid. The config is a typical one: pool
mode ``transaction``, no ``ignore_startup_parameters``, a small pool.
"""

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from django.db import connection

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One PgBouncer process in front of the PostgreSQL at ``server_host:server_port``."""

    def __init__(
        self,
        server_host: str,
        server_port: int,
        *,
        pool_size: int = 20,
        max_clients: int = 400,
        extra: str = "",
    ) -> None:
        """``extra``: more ``[pgbouncer]`` settings, one per line."""
        if not Path(PGBOUNCER).exists():
            raise RuntimeError("PgBouncer is not installed: apt-get install pgbouncer (.ci/run does).")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="leasejobs-pgbouncer-"))
        self.log_path = self.dir / "pgbouncer.log"
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server_host} port={server_port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'userlist.txt'}\n"
            "admin_users = postgres\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = {max_clients}\n"
            # Server connections a restarted PgBouncer or a killed backend left
            # behind are found quickly.
            "server_check_delay = 1\nserver_login_retry = 1\n" + extra
        )
        self.user = None
        if os.geteuid() == 0:
            self.user = "postgres"
            uid = pwd.getpwnam("postgres").pw_uid
            os.chown(self.dir, uid, -1)
            for child in self.dir.iterdir():
                os.chown(child, uid, -1)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        """Start (or start again after ``stop``) on the same port; wait until it accepts."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [PGBOUNCER, str(self.dir / "pgbouncer.ini")],
            user=self.user,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PgBouncer did not start: {self.log()}") from None
                time.sleep(0.05)

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGKILL) -> None:
        """Stop the process by its pid (SIGKILL: every client and server connection drops)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signum)
            self.proc.wait(timeout=20)
        self._log.close()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def django_through(bouncer: PgBouncer) -> Iterator[None]:
    """This process's own Django connection through ``bouncer``, then direct again.

    With ``DISABLE_SERVER_SIDE_CURSORS``, as Django and the check
    ``leasejobs.E012`` ask for behind a transaction pooler.
    """
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(
        HOST="127.0.0.1", PORT=str(bouncer.port), DISABLE_SERVER_SIDE_CURSORS=True
    )
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
