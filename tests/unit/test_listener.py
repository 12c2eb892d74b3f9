"""What the listener reads from a NOTIFY payload (``leasejobs.worker.listener.parse_payload``)."""

import pytest

from leasejobs.db.sql.fragments import PAYLOAD_SEPARATOR
from leasejobs.db.store import ClaimKey
from leasejobs.worker.listener import parse_payload

US = PAYLOAD_SEPARATOR


def test_a_keyed_payload_names_its_queue_and_the_jobs_place() -> None:
    payload = f"emails{US}-3{US}2026-12-06 01:30:49.637102+00{US}100014"
    assert parse_payload(payload) == ("emails", (-3, ClaimKey("2026-12-06 01:30:49.637102+00", 100014)))


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
    ],
)
def test_a_payload_without_a_place_is_a_queue_name_whole(payload: str) -> None:
    assert parse_payload(payload) == (payload, None)


def test_a_queue_name_holding_the_separator_is_read_from_the_right() -> None:
    payload = f"odd{US}name{US}0{US}2026-12-06 01:30:49+00{US}5"
    assert parse_payload(payload) == (f"odd{US}name", (0, ClaimKey("2026-12-06 01:30:49+00", 5)))
