"""Test utilities: bounded waits and real worker processes.

Every wait has a timeout; every process started is stopped by its pid.
"""

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localworkers import database_url

ROOT = Path(__file__).resolve().parent.parent


def wait_until(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class WorkerProcess:
    """A ``manage.py runworker`` started by a test, logging to a file.

    ``prefix`` runs it through another command that then execs it, such as
    ``ip netns exec <ns>`` (so ``pid`` is still the worker's).
    """

    def __init__(
        self, args: list[str], log_path: Path, env: dict[str, str], prefix: Sequence[str] = ()
    ) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(ROOT / "manage.py"), "runworker", *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log()))

    def wait_for_log(self, pattern: str, timeout: float = 20.0) -> None:
        wait_until(lambda: re.search(pattern, self.log()), timeout, what=f"{pattern!r} in worker log")

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """Kill the process by its pid if it still runs (resuming it if paused)."""
        if self.proc.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    break
            self.proc.wait(timeout=10)
        self._log.close()


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env
