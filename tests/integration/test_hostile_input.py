"""The integration half of tests/unit/test_hostile_input.py: its tests that start workers or commit."""

import subprocess
import sys

from django.db import connection

from leasejobs.models import Job, SideEffect
from tests.chaos.helpers import SETTINGS
from tests.chaos.tasks import HOSTILE_NAME, hostile
from tests.helpers import ROOT, worker_env
from tests.testapp.tasks import add, record

#: Quotes, placeholders of psycopg (%s, %(name)s) and of str.format, backslashes,
#: an SQL injection, and text that is not ASCII.
HOSTILE = [
    "'; DROP TABLE leasejobs_job; --",
    "%s",
    "%(queue)s %%",
    "{0} {queue}",
    "Robert'); DROP TABLE leasejobs_sideeffect;--",
    "\"double\" \\'single\\' back\\slash",
    "ünïcødé ✓ 队列",
]


def insert_row(task_name: str, args: str = "[]", kwargs: str = "{}", max_attempts: int = 1) -> int:
    """A job row as someone with SQL access might write it: the worker must cope."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO leasejobs_job (task_name, queue, priority, args, kwargs, status, attempt,"
            " max_attempts, run_at, leased_by, cancel_requested, last_error, errors, worker_ids,"
            " created_at) VALUES (%s, 'default', 0, %s::jsonb, %s::jsonb, 'queued', 0, %s, now(), '',"
            " false, '', '[]', '[]', now()) RETURNING id",
            [task_name, args, kwargs, max_attempts],
        )
        return cursor.fetchone()[0]


def test_hostile_strings_are_stored_run_and_read_back_verbatim(start_worker):
    """As queue names, idempotency keys, side-effect keys and a task name, through a real worker."""
    jobs = {h: hostile.using(queue=h, idempotency_key=h).enqueue(h) for h in HOSTILE}
    # The same hostile idempotency key finds the same job: matched as data, not as SQL.
    assert {h: hostile.using(queue=h, idempotency_key=h).enqueue(h).id for h in HOSTILE} == {
        h: j.id for h, j in jobs.items()
    }
    unknown = {h: insert_row(h) for h in HOSTILE}  # hostile task names nobody registered
    queues = [arg for h in HOSTILE for arg in ("--queue", h)]
    worker = start_worker(
        "--burst", "-v", "2", *queues, "--queue", "default", env={"DJANGO_SETTINGS_MODULE": SETTINGS}
    )
    assert worker.wait() == 0, worker.log()[-3000:]
    for h, job in jobs.items():
        job.refresh_from_db()
        assert (job.status, job.task_name, job.queue, job.idempotency_key) == ("done", HOSTILE_NAME, h, h)
        assert job.result == {"key": h, "created": True, "queue": h}
        assert SideEffect.objects.get(key=h).job_id == job.id
    for h, job_id in unknown.items():
        job = Job.objects.get(id=job_id)
        assert (job.status, job.task_name, job.last_error) == ("failed", h, f"unknown task {h!r}")
    # Shown verbatim in the worker's log too, and both tables are still there.
    assert f"task={HOSTILE_NAME} queue={HOSTILE[0]}" in worker.log()
    assert Job.objects.count() == 2 * len(HOSTILE) and SideEffect.objects.count() == len(HOSTILE)


def test_a_task_name_naming_a_module_with_import_side_effects_imports_nothing(start_worker, tmp_path):
    marker = tmp_path / "imported"
    env = {"LEASEJOBS_IMPORT_MARKER": str(marker)}
    # The marker works: importing the module does write it.
    subprocess.run(
        [sys.executable, "-c", "import tests.import_marker"], cwd=ROOT, env=worker_env(**env), check=True
    )
    assert marker.exists()
    marker.unlink()
    names = ["tests.import_marker", "tests.import_marker.run", "tests.import_marker:run"]
    rows = [insert_row(name) for name in names]
    ok = record.enqueue("the worker goes on")
    worker = start_worker("--burst", env=env)
    assert worker.wait() == 0, worker.log()[-3000:]
    failed = dict(Job.objects.filter(id__in=rows).values_list("task_name", "last_error"))
    assert failed == {name: f"unknown task {name!r}" for name in names}
    assert not marker.exists(), marker.read_text()
    ok.refresh_from_db()
    assert ok.status == "done"


def test_malformed_args_and_kwargs_in_rows_fail_those_jobs_and_the_worker_lives(start_worker):
    malformed = {
        insert_row(add.name, kwargs=kwargs): "malformed job row"
        for kwargs in ('["a", "list"]', '"text"', "null", "5", "true")
    }
    malformed[insert_row(add.name, args='"1, 2"')] = "malformed job row"
    malformed[insert_row(add.name, args="null")] = "malformed job row"
    # Well-formed JSON that does not fit the function: a TypeError, failed on its last attempt.
    malformed[insert_row(add.name, args="[1]", kwargs='{"c": 3}')] = "TypeError: add() got an unexpected"
    malformed[insert_row(add.name, args="[1, 2, 3]")] = "TypeError: add() takes 2 positional"
    ok = add.enqueue(2, 3)
    worker = start_worker("--burst")
    assert worker.wait() == 0, worker.log()[-3000:]
    for job_id, error in malformed.items():
        job = Job.objects.get(id=job_id)
        assert job.status == "failed", (job.args, job.kwargs, job.status)
        assert job.last_error.startswith(error), (job.args, job.kwargs, job.last_error)
    ok.refresh_from_db()
    assert (ok.status, ok.result) == ("done", 5)


#: runworker options with bad values that tests/integration/test_worker.py does not try.
BAD_OPTIONS = [
    (["--max-jobs", "0"], "--max-jobs: '0' is not a whole number greater than 0: give one such as 1 or 8."),
    (["--max-jobs", "-3"], "--max-jobs: '-3' is not a whole number greater than 0"),
    (["--max-jobs", "many"], "--max-jobs: 'many' is not a whole number greater than 0"),
    (["--worker-id", ""], "--worker-id must be 1 to 200 characters"),
    (["--worker-id", "   "], "--worker-id must be 1 to 200 characters"),
    (["--worker-id", "w" * 201], "--worker-id must be 1 to 200 characters"),
    (
        ["--heartbeat", "0"],
        "--heartbeat: '0' is not a number of seconds above 0 and a day at most: give one such as 10 or 0.5.",
    ),
    (["--heartbeat", "-1"], "--heartbeat: '-1' is not a number of seconds above 0 and a day at most"),
    (["--heartbeat", "nan"], "--heartbeat: 'nan' is not a number of seconds above 0 and a day at most"),
    (["--heartbeat", "1e10"], "--heartbeat: '1e10' is not a number of seconds above 0 and a day at most"),
    (["--lease", "0"], "--lease: '0' is not a lease of at least 1 second"),
    (
        ["--lease", "0.5"],
        "--lease: '0.5' is not a lease of at least 1 second and a day at most: "
        "give a number of seconds such as 30",
    ),
    (["--lease", "nan"], "--lease: 'nan' is not a lease of at least 1 second"),
    (["--lease", "inf"], "--lease: 'inf' is not a lease of at least 1 second"),
    (["--lease", "1e12"], "--lease: '1e12' is not a lease of at least 1 second and a day at most"),
    (["--concurrency", "-1"], "--concurrency: '-1' is not a whole number greater than 0"),
    (["--concurrency", "2.5"], "--concurrency: '2.5' is not a whole number greater than 0"),
    (
        ["--grace", "nan"],
        "--grace: 'nan' is not a number of seconds, 0 or more and a day at most: give one such as 0 or 2.5.",
    ),
    (["--grace", "soon"], "--grace: 'soon' is not a number of seconds, 0 or more and a day at most"),
    (["--grace", "1e10"], "--grace: '1e10' is not a number of seconds, 0 or more and a day at most"),
    (["--queue", "q" * 101], "--queue must be a name of 1 to 100 characters"),
    (["--max-jobs"], "--max-jobs: expected one argument"),
]


def test_every_runworker_option_with_a_bad_value_exits_non_zero_with_one_clear_message(start_worker):
    # All at once (each is a process); --burst so a value wrongly accepted ends the run, not hangs it.
    workers = [(args, message, start_worker("--burst", *args)) for args, message in BAD_OPTIONS]
    wrong = []
    for args, message, worker in workers:
        code, log = worker.wait(timeout=60), worker.log()
        if code == 0 or message not in log or "Traceback" in log:
            wrong.append(f"{args}: exit {code}, log {log[-300:]!r}")
    assert not wrong, "\n".join(wrong)


def test_a_job_due_in_year_one_runs_and_the_worker_lives(start_worker):
    """A ``run_at`` at Python's smallest datetime, read by a worker whose connections are in
    another time zone (``PGTZ``: the server's or the role's zone does the same): PostgreSQL
    prints it in 1 BC there, which Python cannot hold. The claim's keys travel as text, so
    the job and its neighbours run."""
    from datetime import UTC, datetime

    ancient = record.using(run_at=datetime.min.replace(tzinfo=UTC)).enqueue("year one")
    neighbours = [record.enqueue(n) for n in range(3)]
    worker = start_worker("--burst", env={"PGTZ": "America/New_York"})
    assert worker.wait(timeout=60) == 0, worker.log()
    for job in (ancient, *neighbours):
        job.refresh_from_db()
        assert (job.status, job.attempt) == ("done", 1), worker.log()
