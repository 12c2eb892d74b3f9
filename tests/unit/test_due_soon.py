"""When the claim loop wakes for jobs announced before they were due (``leasejobs.worker.due_soon``)."""

import threading
from datetime import UTC, datetime, timedelta

from leasejobs.db.store import ClaimKey
from leasejobs.worker.due_soon import KEPT, DueSoon, seconds_until

NOW = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_seconds_until_the_earliest_place_by_this_machines_clock() -> None:
    places = [(0, ClaimKey("2026-12-06 04:00:05+00", 7)), (3, ClaimKey(NOW + timedelta(seconds=2), 9))]
    assert seconds_until(places, NOW) == 2.0
    assert seconds_until([(0, ClaimKey("2026-12-06 03:59:59.5+00", 7))], NOW) == -0.5


def test_the_loop_waits_until_the_first_job_heard_of_is_due_and_hands_its_queue_on() -> None:
    clock, wake = Clock(), threading.Event()
    soon = DueSoon(wake, clock)
    soon.heard("pdf", 3.0)
    soon.heard("pdf", 5.0)  # a later job of the same queue: kept too (review 7b)
    soon.heard("mail", 0.5)
    assert not wake.is_set()  # the loop was not waiting: its next wait counts them
    assert soon.wait_seconds(30.0) == 0.5
    soon.waited()
    clock.now += 0.5
    assert soon.take() == {"mail"}
    assert soon.take() == set()
    assert soon.wait_seconds(30.0) == 2.5
    soon.waited()
    clock.now += 2.5
    assert soon.take() == {"pdf"}
    assert soon.wait_seconds(30.0) == 2.0
    clock.now += 2.0
    assert soon.take() == {"pdf"}
    assert soon.wait_seconds(30.0) == 30.0


def test_a_flood_of_delayed_jobs_keeps_the_earliest_deadlines_only() -> None:
    soon = DueSoon(threading.Event(), Clock())
    for n in range(KEPT + 500, 0, -1):
        soon.heard("q", float(n))
    assert soon.wait_seconds(1e9) == 1.0
    assert len(soon._at) == KEPT


def test_a_job_due_before_the_wait_under_way_ends_wakes_the_loop() -> None:
    clock, wake = Clock(), threading.Event()
    soon = DueSoon(wake, clock)
    assert soon.wait_seconds(30.0) == 30.0  # the loop waits 30 s
    soon.heard("pdf", 40.0)
    assert not wake.is_set()  # due after the wait ends: nothing to change
    soon.heard("pdf", 2.0)
    assert wake.is_set()  # the loop claims once, then waits 2 s
    soon.waited()
    wake.clear()
    soon.heard("mail", 1.0)
    assert not wake.is_set()  # not waiting: the next wait counts it
