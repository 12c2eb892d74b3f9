"""The parallel phase's budget of connections (tests/connection_budget.py): who fits, who waits."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.connection_budget import BUDGET, LARGE, LARGE_GROUP, ORDINARY, fits, hold, many_connections


def test_a_test_fits_beside_the_others_counted_at_their_need_or_at_ordinary():
    # Four processes: alone, the other three count ORDINARY each.
    assert fits({}, BUDGET - 3 * ORDINARY, 4)
    assert not fits({}, BUDGET - 3 * ORDINARY + 1, 4)
    # One holder of 30: two processes left at ORDINARY.
    assert fits({1: 30}, BUDGET - 30 - 2 * ORDINARY, 4)
    assert not fits({1: 30}, BUDGET - 30 - 2 * ORDINARY + 1, 4)


def test_the_largest_need_of_the_suite_fits_beside_three_ordinary_processes():
    assert fits({}, 50, 4)


def test_a_need_waits_for_the_holder_to_leave_and_a_dead_holders_place_is_dropped(tmp_path):
    path = tmp_path / "budget.json"
    big = BUDGET - 3 * ORDINARY
    with hold(path, big, 4):
        assert json.loads(path.read_text()) == {str(os.getpid()): big}
    assert json.loads(path.read_text()) == {}
    # A holder whose process is gone (a crashed pytest process) holds nothing.
    argv = [sys.executable, "-c", "import os; print(os.getpid())"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    path.write_text(json.dumps({done.stdout.strip(): big}))
    started = time.monotonic()
    with hold(path, big, 4, wait=5):
        assert time.monotonic() - started < 2


def test_a_need_that_finds_no_room_in_time_fails_and_says_who_holds_it(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(json.dumps({os.getppid(): 40}))  # a live process: pytest's parent
    no_room = r"no room for 40 connections within 1 s; held .*: 40"
    with pytest.raises(pytest.fail.Exception, match=no_room), hold(path, 40, 4, wait=1):
        pass


def test_a_need_over_the_whole_budget_fails_at_once(tmp_path):
    path = tmp_path / "budget.json"
    with pytest.raises(pytest.fail.Exception, match="more than the budget"), hold(path, BUDGET, 4):
        pass


def test_the_mark_carries_the_need_and_the_needs_no_two_can_share_join_one_group():
    def marks(need: int) -> dict[str, tuple[object, ...]]:
        def a_test() -> None: ...

        return {m.name: m.args for m in many_connections(need)(a_test).pytestmark}

    assert marks(20) == {"many_connections": (20,)}
    assert marks(LARGE) == {"many_connections": (LARGE,)}
    assert marks(LARGE + 1) == {"many_connections": (LARGE + 1,), "xdist_group": (LARGE_GROUP,)}
    # Two needs past LARGE never fit at once beside two ordinary processes; LARGE and LARGE do.
    assert not fits({1: LARGE + 1}, LARGE + 1, 4)
    assert fits({1: LARGE}, LARGE, 4)
