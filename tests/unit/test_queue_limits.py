"""Queue-control rules on their own: rate and limit parsing, the limited claim's
size, and when the worker runs the limited claim (no database, no process)."""

import pytest

from leasejobs.db import sql
from leasejobs.queues import controls
from leasejobs.worker.limits import LimitGate


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100/m", (100, 60.0)),
        ("20/10s", (20, 10.0)),
        ("5/s", (5, 1.0)),
        ("1000/h", (1000, 3600.0)),
        ("7/2d", (7, 172800.0)),
        (" 3 / 1.5m ", (3, 90.0)),
    ],
)
def test_rates_read_as_claims_per_window_of_seconds(text, expected):
    assert controls.parse_rate(text) == expected


@pytest.mark.parametrize("text", ["lots", "0/m", "100/", "100/0s", "-1/m", "100/w", 100, None])
def test_a_bad_rate_is_one_sentence(text):
    with pytest.raises(ValueError, match=r"^rate .* is not of the form N/unit .*\.$"):
        controls.parse_rate(text)


@pytest.mark.parametrize("text", ["1/366d", "10000/366d", "1/8784h", "1/527040m", "1/31622400s"])
def test_a_window_of_up_to_366_days_is_a_rate(text):
    assert controls.parse_rate(text)[1] <= controls.MAX_RATE_WINDOW_SECONDS


@pytest.mark.parametrize(
    "text", ["1/99999999999d", "1/367d", "1/31622401s", "5/8785h", "1/" + "9" * 400 + "s"]
)
def test_a_window_over_366_days_is_refused_in_one_sentence_naming_the_largest(text):
    # PostgreSQL cannot add 99999999999 days to a timestamp: every worker's claim failed on it.
    with pytest.raises(
        ValueError, match=r"^rate .* has a window longer than 366 days, the largest allowed"
    ) as exc:
        controls.parse_rate(text)
    assert str(exc.value).count(". ") == 0 and str(exc.value).endswith(".")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_a_concurrency_is_a_whole_number_of_at_least_one(value):
    with pytest.raises(ValueError, match="must be a whole number of at least 1"):
        controls.parse_queue("pdf", {"concurrency": value})


@pytest.mark.parametrize(
    ("text", "shown"),
    [("7/2d", "7/2d"), ("2/366d", "2/366d"), ("5/90s", "5/90s"), ("3/1.5s", "3/1.5s"), ("1/120m", "1/2h")],
)
def test_a_rate_is_shown_in_its_largest_whole_unit_and_reads_back(text, shown):
    limits = controls.parse_queue("q", {"rate": text})
    assert limits.rate == shown
    assert controls.parse_rate(limits.rate) == controls.parse_rate(text)


def test_limits_show_their_rate_in_the_unit_they_were_written_in():
    assert controls.parse_queue("email", {"rate": "100/m"}).rate == "100/m"
    assert controls.parse_queue("email", {"rate": "20/10s"}).rate == "20/10s"
    assert controls.parse_queue("pdf", {"concurrency": 2}) == controls.ConcurrencyAndRate(concurrency=2)


class FakeStore:
    def __init__(self, limited, keys=False):
        self.answer = (limited, keys)
        self.asked = 0

    def limits_apply(self, queues):
        self.asked += 1
        return self.answer


def test_the_gate_runs_the_limited_claim_on_news_of_a_limited_queue_or_a_full_claim():
    gate = LimitGate(FakeStore(["pdf"]), None, poll_interval=60)
    assert gate.refresh() and gate.due()  # first look
    gate.claiming()
    gate.claimed(0, 4)
    assert not gate.due()
    gate.notified("email")  # news of a queue without limits
    assert not gate.due()
    gate.notified("pdf")  # a pdf job enqueued, or a pdf place freed
    assert gate.due()
    gate.claiming()
    gate.claimed(4, 4)  # filled the room: more may wait
    assert gate.due()


def test_news_that_arrives_while_a_limited_claim_runs_keeps_the_next_one_due():
    """The claim's snapshot may predate the place that NOTIFY announces freed."""
    gate = LimitGate(FakeStore(["pdf"]), None, poll_interval=60)
    assert gate.refresh() and gate.due()
    gate.claiming()
    gate.notified("pdf")  # from the listener thread, while the statement runs
    gate.claimed(0, 4)
    assert gate.due()


def test_with_concurrency_keys_any_news_may_free_a_place():
    gate = LimitGate(FakeStore([], keys=True), None, poll_interval=60)
    assert gate.refresh()
    gate.claiming()
    gate.claimed(0, 4)
    assert not gate.due()
    gate.notified("default")
    assert gate.due()


def test_without_limits_the_gate_stays_shut_and_reads_the_database_at_most_twice_a_second():
    store = FakeStore([])
    gate = LimitGate(store, None, poll_interval=1)
    assert not gate.refresh()
    assert not gate.refresh()
    assert store.asked == 1


def test_the_limited_claim_reads_a_longer_window_as_the_longest():
    assert f"LEAST(rate_seconds, {controls.MAX_RATE_WINDOW_SECONDS:.0f})" in sql.CLAIM_LIMITED
