"""What the listener reads from a NOTIFY payload (``leasejobs.worker.listener.parse_payload``)."""

from datetime import UTC, datetime

import pytest

from leasejobs.db.sql.fragments import PAYLOAD_SEPARATOR, front_payload, queue_payload
from leasejobs.db.store import ClaimKey
from leasejobs.worker.listener import Heard, Notice, parse_payload

US = PAYLOAD_SEPARATOR


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_a_keyed_payload_names_its_queue_and_the_jobs_place() -> None:
    payload = f"emails{US}-3{US}2026-12-06 01:30:49.637102+00{US}100014"
    assert parse_payload(payload) == Notice(
        "emails", (-3, ClaimKey(at("2026-12-06 01:30:49.637102+00"), 100014))
    )


def test_a_job_not_due_at_its_insert_is_announced_as_later() -> None:
    payload = f"emails{US}0{US}2026-12-06 01:30:49+00{US}7{US}later"
    assert parse_payload(payload) == Notice(
        "emails", (0, ClaimKey(at("2026-12-06 01:30:49+00"), 7)), later=True
    )


def test_a_resumed_queue_asks_for_a_walk_from_the_front() -> None:
    assert parse_payload(front_payload("reports")) == Notice("reports", front=True)
    assert parse_payload(front_payload(f"odd{US}name")) == Notice(f"odd{US}name", front=True)


def test_a_wake_up_sorts_what_its_notifies_said() -> None:
    heard = Heard()
    for payload in (
        f"q{US}0{US}2026-12-06 01:30:49+00{US}7",
        f"q{US}0{US}2026-12-06 01:30:50+00{US}9{US}later",
        "q",
        front_payload("q"),
    ):
        heard.add(parse_payload(payload))
    assert heard == Heard(
        places=[(0, ClaimKey(at("2026-12-06 01:30:49+00"), 7))],
        later=[(0, ClaimKey(at("2026-12-06 01:30:50+00"), 9))],
        front=True,
        news=True,
    )


@pytest.mark.parametrize(
    "queue",
    [
        "reports",
        f"odd{US}front",  # a name ending as a tag does: read whole (review 7)
        f"odd{US}later",
        f"odd{US}",
        f"q{US}0{US}2026-12-06 01:30:49+00{US}5",  # a name that reads as a place
    ],
)
def test_every_payload_leasejobs_sends_names_its_queue_whole(queue: str) -> None:
    assert parse_payload(queue_payload(queue)) == Notice(queue)
    assert parse_payload(front_payload(queue)) == Notice(queue, front=True)
    place = f"{US}-3{US}2026-12-06 01:30:49+00{US}7"
    assert parse_payload(queue + place) == Notice(queue, (-3, ClaimKey(at("2026-12-06 01:30:49+00"), 7)))
    assert parse_payload(queue + place + f"{US}later") == Notice(
        queue, (-3, ClaimKey(at("2026-12-06 01:30:49+00"), 7)), later=True
    )


@pytest.mark.parametrize(
    "payload",
    [
        "emails",  # a place freed, a workflow's children due: the queue alone
        "",
        f"a{US}b",
        f"q{US}x{US}2026-12-06 01:30:49+00{US}7",  # a priority that is not a number
        f"q{US}1{US}2026-12-06 01:30:49+00{US}seven",
        # Sent by another program on the channel: no place a claim could bind.
        f"default{US}7{US}not a time{US}5",
        f"default{US}99999999999{US}2026-01-01 00:00:00+00{US}5",
        f"default{US}-32769{US}2026-01-01 00:00:00+00{US}5",
        f"default{US}0{US}2026-01-01 00:00:00{US}5",  # no zone: the claim's session would choose it
        f"default{US}0{US}2026-01-01 00:00:00+00{US}0",
        f"default{US}0{US}2026-01-01 00:00:00+00{US}9223372036854775808",
        f"default{US}later",  # a marker with no place before it
        f"default{US}0{US}2026-01-01 00:00:00+00{US}later",
        f"default{US}0{US}2026-01-01 00:00:00+00{US}5{US}soon",
    ],
)
def test_a_payload_without_a_place_is_a_queue_name_whole(payload: str) -> None:
    assert parse_payload(payload) == Notice(payload)


def test_a_queue_name_holding_the_separator_is_read_from_the_right() -> None:
    payload = f"odd{US}name{US}0{US}2026-12-06 01:30:49+00{US}5"
    assert parse_payload(payload) == Notice(f"odd{US}name", (0, ClaimKey(at("2026-12-06 01:30:49+00"), 5)))


def test_a_time_python_reads_and_postgresql_would_not_is_kept_as_the_time_it_means() -> None:
    """An ISO week date, sent by another program (review 7b): Python reads it, a
    ``timestamptz`` cast would not; the place holds the datetime, which any claim binds."""
    notice = parse_payload(f"q{US}0{US}2026-W01-1T00:00:00+00:00{US}5")
    assert notice.place == (0, ClaimKey(datetime(2025, 12, 29, tzinfo=UTC), 5))
