"""The story demo: ``manage.py demo --fast`` runs the four scenarios with real
worker processes, and its table shows what the story promises."""

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from demo_site.receipts import mailapi
from demo_site.receipts.management.commands.demo import COLUMNS, Command, format_table
from demo_site.receipts.models import Message
from demo_site.receipts.story import SCENARIOS, Result
from tests.helpers import ROOT

# scenario: (body runs, receipts sent, stale writes rejected, attempts)
EXPECTED = {
    "1 no heartbeat, unfenced send": (2, 2, 1, 2),
    "2 no heartbeat, fenced + idempotent": (2, 1, 1, 2),
    "3 heartbeat": (1, 1, 0, 1),
    "4 heartbeat, worker paused (SIGSTOP)": (2, 1, 0, 2),
}
ROW = re.compile(r"^(\d \S.*?)\s{2,}(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$")


def table(output: str) -> dict[str, tuple[int, ...]]:
    """The rows of the demo's closing table, read back from its output."""
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == " ".join(COLUMNS).split())
    rows = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        match = ROW.match(line)
        assert match, f"not a table row: {line!r}"
        rows[match[1]] = tuple(int(n) for n in match.groups()[1:])
    return rows


@pytest.mark.django_db
def test_no_superuser_for_a_database_on_another_host(monkeypatch, tmp_path):
    monkeypatch.setitem(connection.settings_dict, "HOST", "db.example.com")
    command = Command(stdout=StringIO())
    command._where_next(tmp_path)
    output = command.stdout._out.getvalue()
    assert "no superuser made: the database is on db.example.com" in output
    assert not get_user_model().objects.filter(username="admin").exists()


@pytest.mark.django_db
def test_mail_api_honours_idempotency_keys():
    email = {"to": "ada@example.com", "subject": "Receipt", "text": "Thanks", "attachment_name": "r.pdf"}
    first = mailapi.send(**email, attachment=b"%PDF-1", idempotency_key="receipt:1")
    again = mailapi.send(**email, attachment=b"%PDF-1", idempotency_key="receipt:1")
    assert (again.message_id, again.replayed, first.replayed) == (first.message_id, True, False)
    with pytest.raises(mailapi.IdempotencyKeyReused):
        mailapi.send(**email, attachment=b"%PDF-2", idempotency_key="receipt:1")
    unkeyed = [mailapi.send(**email, attachment=b"%PDF-1") for _ in range(2)]
    assert not any(d.replayed for d in unkeyed)
    assert Message.objects.count() == 3


def test_readme_shows_the_table_as_the_demo_prints_it():
    results = [
        Result(scenario, job_id=0, body_runs=runs, receipts=sent, stale_writes=stale, attempts=attempts)
        for scenario, (runs, sent, stale, attempts) in zip(SCENARIOS, EXPECTED.values(), strict=True)
    ]
    assert format_table(results) in (ROOT / "README.md").read_text()
