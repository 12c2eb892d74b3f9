"""The connections of make test's parallel phase: a budget shared by its processes.

PostgreSQL refuses connections past ``max_connections`` (100 by default:
"sorry, too many clients already"). The parallel phase runs ``TEST_WORKERS``
pytest processes (pytest-xdist); a test opens at most ``ORDINARY``
connections at once, counted over its process, its workers and their
children (measured with pg_stat_activity every 0.05 s during make test),
but the tests marked ``many_connections(n)`` (several worker processes of
several threads), which open up to ``n``: their measured peak and a margin
of about three.

Such a test waits, before any of its fixtures starts anything, until it
fits: the needs of the marked tests running in the other processes, plus
``ORDINARY`` for each process running another test, plus its own ``n``,
stay within ``BUDGET``, ten below the server's 100 (room for a psql or
another client beside). So marked tests run side by side when their
needs allow, in any process, and one at a time when they do not. The
holders are kept in a file shared by the processes of one run, under an
exclusive lock; a holder whose process died is dropped. Outside
pytest-xdist (one process, one test at a time) nothing is counted.
"""

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

#: The most connections a test not marked opens at once, over its processes (13 measured in
#: December 2026, by several tests of workers taking over each other's leases).
ORDINARY = 13
#: What the tests running at once may open together; PostgreSQL allows 100.
BUDGET = 90
#: The longest a marked test waits for room (the marked tests' whole time is some minutes).
WAIT = 1200.0


#: A test that needs more than this can never run beside another such test while the
#: two other processes (make test's default four) run ordinary ones: 2 x 33 + 2 x 13 > 90.
LARGE = (BUDGET - 2 * ORDINARY) // 2
#: The pytest-xdist group of those tests (``--dist loadgroup``): one process runs them one
#: after another. Left to any process, each waited in its setup until the one running
#: elsewhere was done, its process idle meanwhile (124 s of setups in one December run).
LARGE_GROUP = "many_connections"


def many_connections(need: int) -> Callable[[T], T]:
    """Mark a test that opens up to ``need`` connections at once (its measured peak plus a margin).

    Past ``LARGE`` it also joins ``LARGE_GROUP``.
    """

    def mark(test: T) -> T:
        marked: T = pytest.mark.many_connections(need)(test)
        return pytest.mark.xdist_group(LARGE_GROUP)(marked) if need > LARGE else marked

    return mark


def need_of(item: pytest.Item) -> int | None:
    marker = item.get_closest_marker("many_connections")
    return None if marker is None else int(marker.args[0])


def fits(holders: dict[int, int], need: int, processes: int) -> bool:
    """Whether ``need`` fits beside ``holders`` (pid: need), the other processes at ``ORDINARY``."""
    others = processes - 1 - len(holders)
    return sum(holders.values()) + ORDINARY * max(others, 0) + need <= BUDGET


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _locked(path: Path) -> Iterator[dict[int, int]]:
    """The holders in ``path``, under its lock; written back as left when the block ends."""
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            text = path.read_text() if path.exists() else ""
            holders = {int(pid): need for pid, need in json.loads(text or "{}").items()}
            holders = {pid: need for pid, need in holders.items() if alive(pid)}
            yield holders
            path.write_text(json.dumps(holders))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def hold(path: Path, need: int, processes: int, wait: float = WAIT) -> Iterator[None]:
    """Hold ``need`` connections of the budget in ``path`` while the block runs; fail past ``wait``."""
    if not fits({}, need, processes):
        pytest.fail(
            f"this test opens up to {need} connections: with {processes} test processes that is more "
            f"than the budget of {BUDGET} (tests/connection_budget.py); run with fewer TEST_WORKERS"
        )
    pid = os.getpid()
    deadline = time.monotonic() + wait
    while True:
        with _locked(path) as holders:
            if fits(holders, need, processes):
                holders[pid] = need
                break
            seen = dict(holders)
        if time.monotonic() > deadline:
            pytest.fail(f"no room for {need} connections within {wait:.0f} s; held (pid: need): {seen}")
        time.sleep(0.2)
    try:
        yield
    finally:
        with _locked(path) as holders:
            holders.pop(pid, None)
