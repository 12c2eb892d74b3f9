"""The worker's scheduling rules, each on its own (no database, no process)."""

import math

import pytest

from leasejobs.worker import rules


def test_a_fresh_worker_gives_each_child_one_job_until_a_body_has_run():
    assert rules.child_depth(mean_duration=None, prefetch=1000, children=4, lease_seconds=30) == 1


@pytest.mark.parametrize(
    ("mean", "lease", "expected"),
    [
        (0.00001, 30, 251),  # 20 ms / 10 us = 2000 ahead: capped at the child's share of 1000
        (0.0001, 30, 201),  # 20 ms / 0.1 ms = 200 ahead
        (0.001, 30, 21),
        (0.05, 30, 1),  # slow jobs: none waits in a child
        (0.001, 0.1, 11),  # a short lease shrinks the wait to a tenth of it: 10 ms / 1 ms
    ],
)
def test_a_job_waits_in_a_child_at_most_20_ms_of_work_and_a_tenth_of_its_lease(mean, lease, expected):
    assert rules.child_depth(mean_duration=mean, prefetch=1000, children=4, lease_seconds=lease) == expected


def test_prefetch_zero_gives_each_child_only_the_job_it_runs():
    assert rules.child_depth(mean_duration=0.0001, prefetch=0, children=4, lease_seconds=30) == 1


def test_a_claim_waits_until_a_child_is_idle_or_down_to_half_then_fills_them_all():
    assert rules.claim_room([11, 11, 11, 11], 20, claimed=0, max_jobs=None) == 0
    assert rules.claim_room([10, 11, 12, 20], 20, claimed=0, max_jobs=None) == 27
    assert rules.claim_room([0, 20, 20, 20], 20, claimed=0, max_jobs=None) == 20
    assert rules.claim_room([1, 1, 1], 1, claimed=0, max_jobs=None) == 0
    assert rules.claim_room([0, 1, 0], 1, claimed=0, max_jobs=None) == 2


def test_no_child_to_give_jobs_to_claims_nothing():
    assert rules.claim_room([], 20, claimed=0, max_jobs=None) == 0


def test_a_claim_never_goes_past_max_jobs():
    assert rules.claim_room([0, 0, 0, 0], 5, claimed=8, max_jobs=10) == 2
    assert rules.claim_room([0, 0], 5, claimed=10, max_jobs=10) == 0


def test_the_zygote_kills_a_body_a_little_before_its_lease_ends():
    assert rules.watchdog_margin(30) == 0.25
    assert rules.watchdog_margin(1) == pytest.approx(0.1)


def test_a_stopped_body_is_told_why():
    assert "timeout" in rules.stop_reason(4)
    assert "lease was lost" in rules.stop_reason(1)
    assert "grace" in rules.stop_reason(8)


def test_heartbeat_defaults_to_a_third_of_the_shortest_lease():
    assert rules.heartbeat_interval(None, 30) == 10
    assert rules.heartbeat_interval(None, 2) == pytest.approx(2 / 3)


def test_an_explicit_heartbeat_is_capped_at_half_the_shortest_lease():
    assert rules.heartbeat_interval(5, 30) == 5
    assert rules.heartbeat_interval(5, 2) == 1  # a task's 2 s lease: clamped, never 5 s


def test_timeout_deadline():
    assert rules.timeout_deadline(100.0, 5) == 105.0
    assert rules.timeout_deadline(100.0, None) is None
    assert rules.timeout_deadline(100.0, math.inf) is None


def test_mean_duration_is_smoothed():
    assert rules.mean_duration(None, 1.0) == 1.0
    assert rules.mean_duration(1.0, 17.0) == 2.0


@pytest.mark.parametrize(
    ("dead", "live", "floor", "due"),
    [
        (50_000, 0, 0, False),  # up to the threshold: not yet (autovacuum's rule)
        (50_001, 0, 0, True),
        (150_000, 1_000_000, 0, False),  # the threshold plus a tenth of the live rows
        (150_001, 1_000_000, 0, True),
        (900_000, 0, 880_000, False),  # what the last VACUUM could not remove does not count
        (930_001, 0, 880_000, True),
    ],
)
def test_vacuum_is_due_past_the_threshold_plus_a_share_of_the_live_rows_above_the_floor(
    dead, live, floor, due
):
    assert rules.vacuum_due(dead=dead, live=live, floor=floor, threshold=50_000, scale_factor=0.1) is due


def test_a_threshold_of_zero_vacuums_at_each_new_dead_row_not_at_each_look():
    assert rules.vacuum_due(dead=7, live=0, floor=7, threshold=0, scale_factor=0.0) is False
    assert rules.vacuum_due(dead=8, live=0, floor=7, threshold=0, scale_factor=0.0) is True


@pytest.mark.parametrize(
    ("before", "after", "in_vain"), [(1000, 0, False), (1000, 500, False), (1000, 501, True)]
)
def test_a_vacuum_is_in_vain_when_it_left_more_than_half(before, after, in_vain):
    assert rules.vacuum_in_vain(before=before, after=after) is in_vain


def test_skipped_vacuums_try_again_in_5_s_then_10_up_to_a_minute():
    assert [rules.vacuum_retry_after_skip(n) for n in (1, 2, 3, 4, 5, 1000)] == [5, 10, 20, 40, 60, 60]


def test_vacuums_in_vain_wait_15_s_then_30_then_a_minute():
    assert [rules.vacuum_backoff(n) for n in (1, 2, 3, 4, 1000)] == [15, 30, 60, 60, 60]


@pytest.mark.parametrize(
    ("estimate", "running_for", "expected"),
    [
        (0.05, 0.0, (0.05, 0)),  # a 50 ms body just started: its whole estimate left
        (0.05, 0.035, (0.015, 1)),  # in its last 20 ms: its next job may come now
        (0.05, 0.06, (0.0, 1)),  # a little past its estimate: ending now
        (0.05, 0.075, (math.inf, 0)),  # 25 ms past it: it may run on for any time, no room behind it
        (0.002, 0.001, (0.001, 1)),
    ],
)
def test_a_running_bodys_time_counts_off_its_estimate_only_while_near_it(estimate, running_for, expected):
    left, ending = rules.work_left(estimate, running_for)
    assert (round(left, 6), ending) == expected
