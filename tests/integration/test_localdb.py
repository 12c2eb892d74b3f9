"""Tests of localdb, the "which PostgreSQL" of make demo and make test.

Real servers, no mocks: the localhost:5432 server if one answers (skipped
otherwise), and an embedded PostgreSQL in a temporary directory that these
tests start, kill and stop. Plain tests: none of them asks pytest-django for
a database, and nothing here reads Django settings. Every wait has a timeout,
and the module leaves no server running.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import localdb

ROOT = Path(__file__).resolve().parents[2]


def query(url: str, sql: str) -> tuple:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return row


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_database_url_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgres://someone:secret@db.example.invalid:5433/elsewhere"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("LEASEJOBS_EMBEDDED", "1")
    assert localdb.database_url() == url


def test_localhost_server_is_used_and_missing_database_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = localdb.LOCALHOST_URL.format(name="postgres")
    if not localdb._localhost_answers(default):
        pytest.skip("no PostgreSQL answers on localhost:5432 as postgres/postgres")
    name = f"leasejobs_localdb_test_{os.getpid()}"
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("LEASEJOBS_EMBEDDED", raising=False)
    monkeypatch.setenv("LEASEJOBS_DB_NAME", name)
    try:
        url = localdb.database_url()
        assert url == f"postgres://postgres:postgres@localhost:5432/{name}"
        assert query(url, "SELECT current_database()") == (name,)
        assert localdb.database_url() == url  # it exists now: no second CREATE
    finally:
        with psycopg.connect(default, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the embedded server -----------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """A state directory of its own, so the repo's .leasejobs/ is left alone."""
    path = Path(tempfile.mkdtemp(prefix="leasejobs-localdb-"))
    try:
        yield path
    finally:
        localdb.Embedded(path).stop()
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def embedded_env(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> dict[str, str]:
    """Environment (ours and for child processes) that forces the embedded server."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("LEASEJOBS_DB_NAME", raising=False)
    monkeypatch.setenv("LEASEJOBS_EMBEDDED", "1")
    monkeypatch.setenv("LEASEJOBS_DATA_DIR", str(data_dir))
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # Captured through pipes on purpose: a postmaster that inherited them
    # would make this hang until the timeout.
    return subprocess.run(
        [sys.executable, "-m", "localdb", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def postmaster_pid(data_dir: Path) -> int:
    found = localdb.Embedded(data_dir).postmaster()
    assert found is not None, "no live postmaster"
    return found.pid


def test_embedded_starts_answers_and_is_reused(embedded_env: dict, data_dir: Path) -> None:
    started = cli(embedded_env, "url")
    assert started.returncode == 0, started.stderr
    assert "starting an embedded PostgreSQL 18 in" in started.stderr
    url = started.stdout.strip()
    assert url.startswith("postgres://postgres@127.0.0.1:") and url.endswith("/leasejobs")
    database, version = query(url, "SELECT current_database(), current_setting('server_version')")
    assert (database, version.split(".")[0]) == ("leasejobs", "18")
    pid = postmaster_pid(data_dir)

    assert localdb.database_url() == url  # in-process, quietly reused
    again = cli(embedded_env, "url")
    assert (again.stdout.strip(), again.returncode) == (url, 0)
    assert "reusing the embedded PostgreSQL" in again.stderr
    assert postmaster_pid(data_dir) == pid


def test_sigkilled_owner_does_not_matter(embedded_env: dict, data_dir: Path) -> None:
    localdb.Embedded(data_dir).stop()
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; import localdb; print(localdb.database_url(), flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        env=embedded_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready, "the owner did not print a URL within 60 s"
        url = owner.stdout.readline().strip()
        pid = postmaster_pid(data_dir)
    finally:
        owner.kill()  # SIGKILL: no atexit, no cleanup of any kind
        owner.wait(timeout=10)
        owner.stdout.close()

    assert localdb.database_url() == url
    assert postmaster_pid(data_dir) == pid
    assert query(url, "SELECT 1") == (1,)


def test_killed_postmaster_is_restarted(embedded_env: dict, data_dir: Path) -> None:
    url = localdb.database_url()
    pid = postmaster_pid(data_dir)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: gone(pid))

    # Its postmaster.pid is left behind: found stale, removed, server restarted.
    assert (data_dir / "pgdata" / "postmaster.pid").exists()
    assert localdb.database_url() == url  # same port when it is still free
    assert postmaster_pid(data_dir) != pid
    assert query(url, "SELECT 1") == (1,)


def test_status_and_stop(embedded_env: dict, data_dir: Path) -> None:
    localdb.database_url()
    pid = postmaster_pid(data_dir)
    assert cli(embedded_env, "status").returncode == 0

    stopped = cli(embedded_env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped the embedded PostgreSQL in {data_dir / 'pgdata'} (pid {pid})" in stopped.stderr
    assert wait_until(lambda: gone(pid))
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()  # a clean shutdown

    status = cli(embedded_env, "status")
    assert status.returncode == 3 and "not running" in status.stdout
    again = cli(embedded_env, "stop")
    assert again.returncode == 0 and "no embedded PostgreSQL running" in again.stderr
