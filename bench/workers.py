"""``runworker`` processes on the bench queue, started and watched by the bench."""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings

from bench.tasks import QUEUE
from localworkers import missing_connections


def _project_path() -> str:
    """The directory from which the settings module is importable."""
    root = settings.SETTINGS_MODULE.split(".")[0]
    spec = find_spec(root)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent
    return str(path.parent if spec.submodule_search_locations else path)


def _rss_mb(pid: int) -> float | None:
    """Resident set size of a process in MB (Linux /proc), or None elsewhere."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class WorkerGroup:
    """``runworker`` processes on ``queue`` (None: every queue), logging to files in ``log_dir``."""

    count: int
    args: list[str]
    log_dir: Path
    verbosity: int
    name: str
    queue: str | None = QUEUE
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def start(self) -> None:
        env = dict(os.environ)
        env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_project_path(), env.get("PYTHONPATH")]))
        code = (
            "import sys, django; django.setup(); "
            "from bench.tasks import worker_main; worker_main(sys.argv[1:])"
        )
        for i in range(self.count):
            worker_id = f"bench-{self.name}-{i}"
            queue = ["--queue", self.queue] if self.queue else []
            argv = [*queue, "--worker-id", worker_id, "-v", str(self.verbosity), *self.args]
            log = open(self.log_dir / f"{worker_id}.log", "wb")  # noqa: SIM115 (closed below)
            with log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, *argv],
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.ids.append(worker_id)

    def wait_ready(self, conn: psycopg.Connection[Any], since: datetime, timeout: float = 60) -> None:
        """Until every worker listens and has its claim connection open (opened after ``since``)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            with conn.cursor() as cursor:
                missing = missing_connections(cursor, self.ids, since)
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"bench workers not ready after {timeout:.0f} s (not yet connected: "
                    f"{', '.join(missing)}): {self.log_tail()}"
                )
            time.sleep(0.05)

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a bench worker exited with {proc.returncode}: {self.log_tail()}")

    def rss_mb(self) -> list[float]:
        return [mb for p in self.procs if (mb := _rss_mb(p.pid)) is not None]

    def stop(self) -> None:
        """SIGTERM, then wait; a worker that does not exit in time is killed."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        failed = []
        for proc in self.procs:
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                failed.append(code)
        if failed:
            raise RuntimeError(f"bench workers exited with {failed}: {self.log_tail()}")

    def log_tail(self) -> str:
        tails = []
        for worker_id in self.ids:
            path = self.log_dir / f"{worker_id}.log"
            if path.exists():
                tails.append(f"[{worker_id}] " + path.read_text(errors="replace")[-1500:])
        return "\n".join(tails)
