"""The rules of a job's options, checked without a database or a worker."""

import math

import pytest

from leasejobs.db import rows
from leasejobs.db.rows import exception_entry, qualified_name
from leasejobs.jobs.registry import task


@pytest.mark.parametrize("value", [0, -1, 0.001, 0.999, 86400.5, 1e12, math.inf, math.nan, True, "3", None])
def test_a_lease_is_seconds_from_one_to_a_day(value):
    """The zygote looks at its bodies every 50 ms and heartbeats come at a third of the lease:
    a lease under a second would run out between looks. A third of the lease bounds the
    worker's statements: ``--lease 1e12`` started a worker whose every connection
    PostgreSQL refused (``statement_timeout`` "333333333333333")."""
    with pytest.raises(
        ValueError, match=r"^lease_seconds must be a number of seconds, at least 1 and a day at most, not "
    ):
        rows.validate_lease_seconds(value)


@pytest.mark.parametrize("value", [1, 1.0, 30.5, 86400])
def test_good_leases_and_timeouts_pass_as_they_are(value):
    assert rows.validate_lease_seconds(value) == value
    assert rows.validate_timeout_seconds(value) == value


def test_a_timeout_may_still_be_under_a_second():
    assert rows.validate_timeout_seconds(0.001) == 0.001


def test_the_lease_rule_names_the_value_and_why_in_one_sentence():
    with pytest.raises(ValueError) as refused:
        rows.validate_lease_seconds(0.5, "--lease")
    assert str(refused.value) == (
        "--lease must be a number of seconds, at least 1 and a day at most, not 0.5: a shorter lease runs "
        "out between the worker's looks at its jobs."
    )


@pytest.mark.parametrize("option", ["lease_seconds", "timeout_seconds"])
@pytest.mark.parametrize("value", [math.inf, math.nan, 0])
def test_task_refuses_an_endless_or_empty_lease_or_timeout_where_it_is_defined(option, value):
    with pytest.raises(
        ValueError, match=f"^{option} of task .*never_registered must be a (positive )?number"
    ):

        @task(**{option: value})
        def never_registered() -> None: ...


@pytest.mark.parametrize(
    ("validate", "value", "message"),
    [
        (rows.validate_queue, "", "queue must be a name of 1 to 100 characters, not ''"),
        (rows.validate_queue, "q" * 101, "queue must be a name of 1 to 100 characters"),
        (rows.validate_queue, None, "queue must be a name"),
        (rows.validate_priority, 101, "priority must be a whole number between -100 and 100"),
        (rows.validate_priority, True, "priority must be a whole number"),
        (rows.validate_max_attempts, 0, "max_attempts must be a whole number of at least 1"),
        (rows.validate_max_attempts, 2.0, "max_attempts must be a whole number of at least 1"),
        (rows.validate_key, "k" * 256, "idempotency_key must be a non-empty string of at most 255"),
        (rows.validate_worker_id, "  ", "worker_id must be 1 to 200 characters, not blank"),
    ],
)
def test_each_rule_refuses_in_one_sentence_naming_the_option(validate, value, message):
    with pytest.raises(ValueError, match="^" + message):
        validate(value)


@pytest.mark.parametrize("validate", [rows.validate_key, rows.validate_worker_id, rows.validate_queue])
@pytest.mark.parametrize("value", ["a\x00b", "\x00", "a\ud800b", "\udfff"])
def test_a_key_worker_id_or_queue_postgresql_cannot_store_is_refused_where_it_is_given(validate, value):
    """A text column holds no NUL and no lone surrogate: refused here, not by the INSERT after
    a step's function already ran."""
    with pytest.raises(ValueError) as refused:
        validate(value, "the name of a step")
    assert str(refused.value) == (
        "the name of a step must not contain a NUL character or a lone surrogate, which PostgreSQL "
        f"cannot store, not {value!r}."
    )


@pytest.mark.parametrize("value", ["plain", "r\u00e9sum\u00e9", "\U0001f600 ok", "tab\there"])
def test_keys_with_any_storable_character_pass(value):
    assert rows.validate_key(value) == value
    assert rows.validate_worker_id(value) == value
    assert rows.validate_queue(value) == value


def test_the_caller_names_the_option_its_own_way():
    with pytest.raises(ValueError, match=r"^--queue must be a name of 1 to 100 characters, not ''\.$"):
        rows.validate_queue("", "--queue")


def test_the_task_lease_wins_over_the_worker_lease():
    assert rows.effective_lease(60, 30.0) == 60.0
    assert rows.effective_lease(None, 30) == 30.0
    assert isinstance(rows.effective_lease(None, 30), float)


def test_an_error_entry_names_attempt_worker_class_and_traceback():
    try:
        raise KeyError("gone")
    except KeyError as exc:
        entry = exception_entry(3, "w1", exc)
    assert (entry["attempt"], entry["worker_id"], entry["exception_class"]) == (3, "w1", "builtins.KeyError")
    assert entry["traceback"].startswith("Traceback (most recent call last):")
    assert entry["traceback"].rstrip().endswith("KeyError: 'gone'")
    assert qualified_name(ValueError) == "builtins.ValueError"


@pytest.mark.parametrize("seconds", [10**12, 3e11])
def test_a_sleep_or_wait_ending_past_the_never_date_is_refused_where_it_is_asked(seconds):
    """Review 52d: a job due after 9999-01-01 could not be read back by Python's datetime."""
    from leasejobs.jobs.steps import _seconds

    with pytest.raises(ValueError, match=r"^ctx.sleep\('parked', seconds\) would end after 9999-01-01"):
        _seconds(seconds, "ctx.sleep('parked', seconds)")
    assert _seconds(86400 * 365 * 100, "a century") == 86400 * 365 * 100
