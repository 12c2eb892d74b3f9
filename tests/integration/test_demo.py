"""The integration half of tests/unit/test_demo.py: its tests that start workers or commit."""

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection

from demo_site.receipts import story
from demo_site.receipts.models import BodyRun, Message
from demo_site.receipts.story import FAST, SCENARIOS, Story, StoryError
from leasejobs.models import Job
from tests.helpers import wait_until
from tests.unit.test_demo import EXPECTED, table


# Alone: the story's outcomes are timings (a fast attempt inside a 2 s lease with no
# heartbeat), and the parallel phase, where the chaos storms run, once made that
# attempt take longer than its lease and run a third time.
@pytest.mark.alone
@pytest.mark.django_db(transaction=True)
def test_demo_tells_the_story_with_real_workers(tmp_path):
    out = StringIO()
    call_command("demo", "--fast", "--log-dir", str(tmp_path), stdout=out)
    output = out.getvalue()

    assert table(output) == EXPECTED, output

    jobs = {j.queue: j for j in Job.objects.filter(queue__startswith="demo-")}
    # On a failure, the workers' own accounts of what they claimed and when.
    logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted(tmp_path.glob("scenario-*.log")))
    assert {q: (j.status, len(j.attempt_workers), len(set(j.attempt_workers))) for q, j in jobs.items()} == {
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
    first, second = (
        {q: j.attempt_workers[i] for q, j in jobs.items() if len(j.attempt_workers) > i} for i in (0, 1)
    )
    assert outcomes == {
        "demo-1": [(first["demo-1"], "sent"), (second["demo-1"], "sent")],
        "demo-2": [(first["demo-2"], "stale write rejected"), (second["demo-2"], "sent")],
        "demo-3": [(first["demo-3"], "sent")],
        "demo-4": [(first["demo-4"], "stopped by its worker"), (second["demo-4"], "sent")],
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
