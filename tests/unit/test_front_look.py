"""The front look's thread (``leasejobs.worker.front_look``) against a look that never
ends until cancelled: a stop cancels it wherever it lands, and the thread ends."""

import threading
from typing import Any

import psycopg
import pytest

from leasejobs.db.store import ClaimedRow, ClaimKey
from leasejobs.worker import front_look as module
from leasejobs.worker.claim_start import COSTLY_IN_A_ROW, ClaimStart
from leasejobs.worker.front_look import FrontLook

KEYS = {0: ClaimKey("2026-12-04 00:00:00+00", 10)}


class Events:
    def __init__(self) -> None:
        self.failed: list[BaseException] = []

    def front_look_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)


def _look(monkeypatch: pytest.MonkeyPatch, statement: Any) -> tuple[FrontLook, threading.Event, Events]:
    events = Events()
    look = FrontLook("w", ClaimStart(), None, events, lambda: None)  # type: ignore[arg-type]
    cancelled = threading.Event()
    monkeypatch.setattr(look._conn, "cancel", cancelled.set)
    monkeypatch.setattr(module, "front_look", statement)
    return look, cancelled, events


@pytest.mark.parametrize("stop_at", ["before the statement", "during the statement"])
def test_a_stop_cancels_the_look_under_way_and_ends_the_thread(monkeypatch, stop_at: str) -> None:
    """A look hangs until cancelled (a pinned horizon's walk, a hung backend). Wherever
    the stop lands, the look is cancelled and the thread ends; nothing is reported."""
    started = threading.Event()
    entered = threading.Event()

    def statement(conn: Any, keys: Any, queues: Any) -> list[tuple[int, ClaimKey]]:
        entered.set()
        if stop_at == "before the statement":
            started.wait(5)  # the stop lands while the statement is about to be sent
        if not cancelled.wait(5):
            raise AssertionError("the look was never cancelled")
        raise psycopg.errors.QueryCanceled("canceling statement due to user request")

    look, cancelled, events = _look(monkeypatch, statement)
    thread = threading.Thread(target=look.run)
    thread.start()
    look.ask(KEYS)
    assert entered.wait(5)
    stopper = threading.Thread(target=look.stop)
    stopper.start()
    started.set()
    stopper.join(5)
    thread.join(5)
    assert not thread.is_alive() and not stopper.is_alive()
    assert cancelled.is_set()
    assert events.failed == []


def test_a_stop_with_no_look_under_way_ends_the_thread_without_a_cancel(monkeypatch) -> None:
    look, cancelled, _ = _look(monkeypatch, lambda *a: [])
    thread = threading.Thread(target=look.run)
    thread.start()
    look.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert not cancelled.is_set()


def test_a_failed_look_is_said_and_the_next_walk_is_the_claimers(monkeypatch) -> None:
    def statement(conn: Any, keys: Any, queues: Any) -> list[tuple[int, ClaimKey]]:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    look, _, events = _look(monkeypatch, statement)
    start = look._start
    job = ClaimedRow(
        10, "t", "[]", "{}", 1, 1, 3, "default", None, "", True, False, 0.0, None, 0, None,
        priority=0, run_at="2026-12-04 00:00:00+00",
    )  # fmt: skip
    for _ in range(COSTLY_IN_A_ROW):  # costly walks in a row: the next is a look
        start.claimed(None, -10.0, 0.5, [job], given_back=())
    keys = start.look_due()
    assert keys is not None
    thread = threading.Thread(target=look.run)
    thread.start()
    look.ask(keys)
    for _ in range(100):
        if events.failed:
            break
        threading.Event().wait(0.05)
    look.stop()
    thread.join(5)
    assert len(events.failed) == 1
    # The failed look ended in no time, so the next walk is due and the claimer's own.
    assert start.look_due() is None
    assert start.after() is None
