"""The worker's scheduling rules, each on its own (no database, no process)."""

import math

import pytest

from leasejobs.worker import rules


def test_a_fresh_worker_prefetches_nothing_until_a_body_has_run():
    assert rules.prefetch_size(prefetch=1000, concurrency=4, mean_duration=None, lease_seconds=30) == 0


@pytest.mark.parametrize(
    ("mean", "lease", "expected"),
    [
        (0.0004, 30, 1000),  # 4 runners x 0.1 s / 0.4 ms = 1000: the cap
        (0.001, 30, 400),  # 4 x 0.1 / 0.001
        (0.05, 30, 8),
        (1.0, 30, 0),  # slow jobs: nothing waits in the buffer
        (0.001, 0.5, 200),  # a short lease shrinks the wait to a tenth of it: 4 x 0.05 / 0.001
    ],
)
def test_prefetch_keeps_a_buffered_job_within_a_tenth_of_a_second_and_of_the_lease(mean, lease, expected):
    assert (
        rules.prefetch_size(prefetch=1000, concurrency=4, mean_duration=mean, lease_seconds=lease) == expected
    )


def test_prefetch_zero_turns_prefetching_off():
    assert rules.prefetch_size(prefetch=0, concurrency=4, mean_duration=0.0001, lease_seconds=30) == 0


def test_claim_counts_only_the_rows_that_go_to_idle_runners():
    # 4 runners, 1 busy, 2 buffered: one runner is idle, so one claimed row counts now.
    room, worth, counted = rules.claim_size(
        concurrency=4, prefetch=100, running=1, buffered=2, claimed=0, max_jobs=None
    )
    assert (room, worth, counted) == (101, 52, 1)


def test_claim_without_prefetch_claims_free_slots_and_counts_them_all():
    assert rules.claim_size(concurrency=4, prefetch=0, running=1, buffered=0, claimed=0, max_jobs=None) == (
        3,
        1,
        3,
    )


def test_claim_never_goes_past_max_jobs():
    room, worth, counted = rules.claim_size(
        concurrency=4, prefetch=100, running=0, buffered=0, claimed=8, max_jobs=10
    )
    assert (room, worth, counted) == (2, 2, 2)


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
