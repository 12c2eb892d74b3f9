"""The ticks a scheduling worker offers the database (no database, no process).

Issue 28, item 6: the one-second lookahead used to be counted in
``max_catch_up``, so ``max_catch_up=N`` caught up N - 1 ticks and
``max_catch_up=1`` offered only a tick not yet due.
"""

import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest

from leasejobs.periodic.scheduler import LOOKAHEAD
from leasejobs.periodic.ticks import candidate_ticks

UTC = ZoneInfo("UTC")
EVERY_SECOND = "* * * * * *"
NOW = dt.datetime(2026, 6, 1, 5, 0, 10, 400_000, tzinfo=dt.UTC)  # the worker's estimate
SECOND = dt.timedelta(seconds=1)


def at(second: int) -> dt.datetime:
    return dt.datetime(2026, 6, 1, 5, 0, second, tzinfo=dt.UTC)


@pytest.mark.parametrize("catch_up", [1, 2, 3, 100])
def test_the_lookahead_tick_is_offered_beside_max_catch_up_due_ticks(catch_up):
    down_since = NOW - dt.timedelta(minutes=10)
    ticks = candidate_ticks(EVERY_SECOND, UTC, down_since, NOW, LOOKAHEAD, catch_up)
    due = [t for t in ticks if t <= NOW]
    assert len(due) == catch_up
    assert due[-1] == at(10), "the latest due tick is always offered"
    assert [t for t in ticks if t > NOW] == [at(11)], "and the one the lookahead reaches"
    assert ticks == sorted(ticks) and all(b - a == SECOND for a, b in itertools.pairwise(ticks))


def test_a_worker_on_time_offers_its_tick_and_the_next():
    assert candidate_ticks(EVERY_SECOND, UTC, at(9), NOW, LOOKAHEAD, 1) == [at(10), at(11)]


def test_nothing_due_offers_only_the_lookahead():
    assert candidate_ticks(EVERY_SECOND, UTC, at(10), NOW, LOOKAHEAD, 5) == [at(11)]


def test_a_slow_schedule_has_no_tick_in_the_lookahead():
    ticks = candidate_ticks("*/20 * * * * *", UTC, at(0) - dt.timedelta(minutes=1), NOW, LOOKAHEAD, 2)
    assert ticks == [at(0) - dt.timedelta(seconds=20), at(0)]


def test_ticks_already_decided_are_never_offered_again():
    # last_tick ahead of the estimate (another worker was first): only later ticks.
    assert candidate_ticks(EVERY_SECOND, UTC, at(11), NOW, LOOKAHEAD, 3) == []
    assert candidate_ticks(EVERY_SECOND, UTC, at(12), NOW, LOOKAHEAD, 3) == []
