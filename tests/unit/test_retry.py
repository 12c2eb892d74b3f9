"""The retry policy and the decision after a body raised: pure, no database."""

import pytest
from django.test import override_settings

from leasejobs import Discard, LeaseLost, RetryPolicy, Snooze, task
from leasejobs.jobs.retry import decide, policy_for


class PaymentDeclined(ValueError):
    pass


def top(policy: RetryPolicy, failures: int) -> float:
    """The delay before jitter (rand() == 0 takes nothing off)."""
    return policy.delay(failures, rand=lambda: 0.0)


def test_backoff_shapes_grow_as_named_and_stop_at_the_cap():
    exponential = RetryPolicy(backoff="exponential", base_seconds=2, max_seconds=30)
    linear = RetryPolicy(backoff="linear", base_seconds=2, max_seconds=7)
    fixed = RetryPolicy(backoff="fixed", base_seconds=5, max_seconds=60)
    assert [top(exponential, n) for n in (1, 2, 3, 4, 5, 6)] == [2, 4, 8, 16, 30, 30]
    assert [top(linear, n) for n in (1, 2, 3, 4, 5)] == [2, 4, 6, 7, 7]
    assert [top(fixed, n) for n in (1, 2, 9)] == [5, 5, 5]
    assert top(exponential, 5000) == 30  # no float overflow on a job retried for ever


def test_jitter_takes_at_most_its_share_off():
    policy = RetryPolicy(backoff="fixed", base_seconds=10, max_seconds=10, jitter=0.25)
    assert policy.delay(1, rand=lambda: 0.0) == 10
    assert policy.delay(1, rand=lambda: 1.0) == 7.5
    assert RetryPolicy(backoff="fixed", base_seconds=10, max_seconds=10, jitter=0).delay(1) == 10


@override_settings(LEASEJOBS={"RETRY_BACKOFF_SECONDS": 3, "RETRY_BACKOFF_MAX_SECONDS": 10})
def test_the_global_settings_are_the_defaults_read_when_a_job_fails():
    assert [top(RetryPolicy(), n) for n in (1, 2, 3)] == [3, 6, 10]


def test_fail_on_wins_and_retry_on_limits_what_is_retried():
    policy = RetryPolicy(retry_on=(ConnectionError, ValueError), fail_on=(PaymentDeclined,))
    assert decide(policy, ConnectionResetError(), 1, 5).action == "retry"  # a subclass matches
    assert decide(policy, ValueError(), 1, 5).action == "retry"
    assert decide(policy, PaymentDeclined(), 1, 5).action == "fail"
    assert decide(policy, KeyError(), 1, 5).action == "fail"  # not in retry_on


def test_the_default_policy_retries_everything_until_attempts_run_out():
    assert decide(None, RuntimeError(), 4, 5).action == "retry"
    assert decide(None, RuntimeError(), 5, 5).action == "fail"


def test_snooze_and_discard_are_not_failures():
    assert decide(None, Snooze(30), 5, 5) == decide(None, Snooze(30), 1, 5)  # attempts do not matter
    assert decide(None, Snooze(30), 5, 5).action == "snooze"
    assert decide(None, Snooze(30), 5, 5).delay == 30
    discard = decide(RetryPolicy(retry_on=(Discard.__mro__[1],)), Discard("order deleted"), 1, 5)
    assert (discard.action, discard.reason) == ("discard", "discarded: order deleted")


def test_snoozes_past_the_limit_fail_the_job():
    assert decide(None, Snooze(1), 1, 5, snoozes=2, max_snoozes=3).action == "snooze"
    over = decide(None, Snooze(1), 1, 5, snoozes=3, max_snoozes=3)
    assert over.action == "fail" and "snoozed 3 times" in over.reason
    with override_settings(LEASEJOBS={"MAX_SNOOZES": 1}):
        assert decide(None, Snooze(1), 1, 5, snoozes=1).action == "fail"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"backoff": "quadratic"}, "backoff must be one of exponential, linear, fixed"),
        ({"base_seconds": -1}, "base_seconds must be a finite number"),
        ({"base_seconds": float("nan")}, "base_seconds must be a finite number"),
        ({"max_seconds": True}, "max_seconds must be a finite number"),
        ({"base_seconds": 10, "max_seconds": 5}, "max_seconds (the cap) must be at least base_seconds"),
        ({"jitter": 1.5}, "jitter must be a share of the delay between 0 and 1"),
        ({"retry_on": ("ValueError",)}, None),  # names are what a stored policy holds: accepted
        ({"retry_on": (ValueError, 3)}, "retry_on must be an exception class or a tuple of them"),
        ({"fail_on": int}, "fail_on must be an exception class or a tuple of them"),
        (
            {"retry_on": (ValueError,), "fail_on": ValueError},
            "builtins.ValueError in both retry_on and fail_on",
        ),
        ({"fail_on": (Snooze,)}, "may not list Snooze"),
        ({"retry_on": (LeaseLost,)}, "may not list LeaseLost"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused_in_one_sentence(options, message):
    if message is None:
        RetryPolicy(**options)
        return
    with pytest.raises(ValueError) as refused:
        RetryPolicy(**options)
    assert message in str(refused.value)
    assert str(refused.value).count(". ") == 0 and str(refused.value).endswith(".")


def test_a_task_with_a_bad_policy_is_refused_when_it_is_defined():
    with pytest.raises(ValueError, match=r"retry of task .* must be a leasejobs\.RetryPolicy"):

        @task(name="tests.bad_policy", retry={"backoff": "fixed"})
        def bad_policy():
            pass


def test_snooze_refuses_nonsense_durations():
    for bad in (-1, float("inf"), float("nan"), "10", True):
        with pytest.raises(ValueError):
            Snooze(bad)


def test_a_stored_policy_matches_by_name_without_importing_and_bad_rows_fall_back():
    stored = RetryPolicy(fail_on=(PaymentDeclined,), backoff="linear").to_json()
    assert stored["fail_on"] == [f"{__name__}.PaymentDeclined"]
    policy = policy_for(None, stored)
    assert decide(policy, PaymentDeclined(), 1, 5).action == "fail"
    assert decide(policy, ValueError(), 1, 5).action == "retry"
    fallback = RetryPolicy(backoff="fixed")
    assert policy_for(fallback, {"backoff": "sideways"}) is fallback
    assert policy_for(fallback, None) is fallback
