"""The story demo: ``manage.py demo --fast`` runs the four scenarios with real
worker processes, and its table shows what the story promises."""

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from demo_site.receipts import mailapi, story
from demo_site.receipts.management.commands.demo import COLUMNS, Command, format_table
from demo_site.receipts.models import BodyRun, Message
from demo_site.receipts.story import FAST, SCENARIOS, Result, Story, StoryError
from leasejobs.models import Job
from tests.helpers import MANY_CONNECTIONS, ROOT, wait_until

# scenario: (body runs, receipts sent, stale writes rejected, attempts)
EXPECTED = {
    "1 no heartbeat, unfenced send": (2, 2, 1, 2),
    "2 no heartbeat, fenced + idempotent": (2, 1, 1, 2),
    "3 heartbeat": (1, 1, 0, 1),
    "4 heartbeat, worker paused (SIGSTOP)": (2, 1, 1, 2),
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


@pytest.mark.django_db(transaction=True)
@MANY_CONNECTIONS
def test_demo_tells_the_story_with_real_workers(tmp_path):
    out = StringIO()
    call_command("demo", "--fast", "--log-dir", str(tmp_path), stdout=out)
    output = out.getvalue()

    assert table(output) == EXPECTED, output

    jobs = {j.queue: j for j in Job.objects.filter(queue__startswith="demo-")}
    # On a failure, the workers' own accounts of what they claimed and when.
    logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("scenario-*.log")))
    assert {q: (j.status, len(j.worker_ids), len(set(j.worker_ids))) for q, j in jobs.items()} == {
        "demo-1": ("done", 2, 2),
        "demo-2": ("done", 2, 2),
        "demo-3": ("done", 1, 1),
        "demo-4": ("done", 2, 2),
    }, logs
    # Who did what: the first worker got the slow (or paused) attempt, the other took over.
    outcomes = {
        q: list(BodyRun.objects.filter(job_id=j.id).order_by("attempt").values_list("worker_id", "outcome"))
        for q, j in jobs.items()
    }
    first, second = ({q: j.worker_ids[i] for q, j in jobs.items() if len(j.worker_ids) > i} for i in (0, 1))
    assert outcomes == {
        "demo-1": [(first["demo-1"], "sent"), (second["demo-1"], "sent")],
        "demo-2": [(first["demo-2"], "stale write rejected"), (second["demo-2"], "sent")],
        "demo-3": [(first["demo-3"], "sent")],
        "demo-4": [(first["demo-4"], "stale write rejected"), (second["demo-4"], "sent")],
    }
    # Every receipt is a PDF; the fenced ones went out with their side effect's key.
    messages = list(Message.objects.order_by("id"))
    assert len(messages) == 5
    assert all(bytes(m.attachment).startswith(b"%PDF-") for m in messages)
    assert [m.idempotency_key is None for m in messages] == [True, True, False, False, False]
    # The paused worker was not killed by its lost lease.
    assert f"{first['demo-4']} lives on" in output

    password = re.search(r"log in as admin / (\S+) ", output)
    assert password, output
    admin = get_user_model().objects.get(username="admin")
    assert admin.is_superuser and admin.check_password(password[1])
    assert "http://127.0.0.1:8000/admin/leasejobs/job/" in output

    # Every worker process the demo started is gone (their connections close as they exit).
    def workers_connected():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE %s",
                ["leasejobs % demo-%"],
            )
            return cursor.fetchone()[0]

    wait_until(lambda: workers_connected() == 0, timeout=10, what="the demo's workers to disconnect")


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_cannot_start_is_reported_and_no_job_is_enqueued(monkeypatch, tmp_path):
    class Unstartable(story.WorkerProcess):
        def __init__(self, worker_id, args, log_path):
            super().__init__(worker_id, [*args, "--no-such-option"], log_path)

    monkeypatch.setattr(story, "WorkerProcess", Unstartable)
    teller = Story(FAST, tmp_path, lambda scenario, snapshot: None)
    teller.prepare()
    try:
        with pytest.raises(StoryError, match=r"worker demo-[ab] exited with \d+; its log .* ends:") as error:
            teller.run(SCENARIOS[0])
    finally:
        teller.stop_all()
    assert "unrecognized arguments: --no-such-option" in str(error.value)
    assert not Job.objects.filter(queue=SCENARIOS[0].queue).exists()


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
