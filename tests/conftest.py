"""Fixtures shared by the suite: real worker processes against the test database."""

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.helpers import WorkerProcess, worker_env


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runworker`` processes (with the given CLI args); all are killed at teardown.

    Depends on ``transactional_db`` so the jobs a test enqueues are committed
    where the worker processes can see them, and the workers are gone before
    the tables are flushed.
    """
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started) + 1}.log"
        worker = WorkerProcess(list(args), log, worker_env(**(env or {})), prefix)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
