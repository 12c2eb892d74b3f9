"""Hostile review 51 (b), the database side: promises broken with real ``runworker`` processes.

Every test starts real workers (settings ``tests.review51_b_settings``, which add the
bodies of ``tests.review51_b_tasks``) against PostgreSQL and reads what happened from
the job rows and the workers' exit codes and logs.
"""

import signal
import time
from collections import Counter
from collections.abc import Callable

import pytest

from leasejobs.jobs import registry
from leasejobs.models import Job, Step
from tests import review51_b_tasks
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import BodyRun
from tests.testapp.tasks import quick, record

registry.found_by_workers(*(v for v in vars(review51_b_tasks).values() if isinstance(v, registry.Task)))

FINAL = ("done", "failed", "cancelled")
SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.review51_b_settings"}


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    def start(*args: str) -> WorkerProcess:
        return start_worker(*args, env=SETTINGS)

    return start


def job_now(job: Job) -> Job:
    job.refresh_from_db()
    return job


# -- hostile rows written by SQL ---------------------------------------------------------------


def _insert_row(task_name: str, run_at: str = "now()", **columns: object) -> int:
    """A job row written by SQL (another producer, a hand-written fix), not by enqueue."""
    from django.db import connection

    row = {
        "task_name": task_name,
        "queue": "default",
        "priority": 0,
        "args": "[1]",
        "kwargs": "{}",
        "status": "queued",
        "attempt": 0,
        "max_attempts": 5,
        "leased_by": "",
        "cancel_requested": False,
        "last_error": "",
        "errors": "[]",
        "worker_ids": "[]",
        "snoozes": 0,
        "runs": 0,
        **columns,
    }
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO leasejobs_job ({', '.join(row)}, run_at, created_at) "
            f"VALUES ({', '.join(['%s'] * len(row))}, {run_at}, now()) RETURNING id",
            list(row.values()),
        )
        return cursor.fetchone()[0]


def _status(job_id: int) -> tuple[str, str]:
    """The row's status and last error, read without its timestamps (Python may not hold them)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT status, last_error FROM leasejobs_job WHERE id = %s", [job_id])
        return cursor.fetchone()


def test_a_row_due_since_minus_infinity_fails_alone_and_its_neighbours_run(worker):
    """A row written by SQL with ``run_at = '-infinity'`` (PostgreSQL takes it; "due since
    forever" is what a hand-written fix or another producer may well write).

    Every claim computes ``waited`` as ``extract(epoch FROM statement_timestamp() - run_at)``,
    which PostgreSQL refuses for an infinite timestamp ("cannot subtract infinite
    timestamps"): the whole CLAIM fails, the claimer raises, the worker exits 1 with a
    traceback, and the row stays queued at the front of its priority, so every worker that
    starts dies the same way and none of the jobs beside it ever runs.
    (guarantees.md, "Bad input is refused with a clear error, or fails its own job only".)
    """
    hostile = _insert_row(record.name, run_at="'-infinity'::timestamptz")
    neighbours = [record.enqueue(n) for n in range(5)]
    w = worker("--burst")
    code = w.wait(timeout=60)
    statuses = [job_now(j).status for j in neighbours]
    status, last_error = _status(hostile)
    assert (code, statuses) == (0, ["done"] * 5), f"exit {code}; neighbours {statuses}; {w.log()[-1500:]}"
    assert status in FINAL, (status, last_error)


# -- a hand-written worker_ids that is not a list, given back ---------------------------------


def test_a_row_whose_worker_ids_is_not_a_list_is_given_back_without_killing_the_worker(start_worker):
    """3,000 short jobs of ``max_attempts=1``, every tenth row's ``worker_ids`` set by SQL to
    ``{}`` (an object, not a list; the claim takes care to read such a row: "a hand-written
    non-array counts as empty"), drained by one ``runworker --burst``.

    A worker gives back, with their runs refunded, the jobs a claim took beyond what its
    children have room for (``claimer._give_back``, which happens now and then in any
    drain). The refund's ``worker_ids - -1`` is refused by PostgreSQL on an object
    ("cannot delete from object using integer index"): the whole RELEASE fails, the
    claimer raises, the worker dies with a traceback, and every job of the batch, plain
    or not, keeps its counted run and its lease: once the lease runs out the next worker
    fails them ("lease expired on the last run (1 of 1)") though no body of theirs
    started. guarantees.md: a give-back "undoes the whole claim: its run ..."; a bad row
    "fails its own job only".
    """
    from django.db import connection

    jobs = quick.bulk_enqueue([((i,), {}) for i in range(3000)])
    ids = [j.id for j in jobs]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE leasejobs_job SET worker_ids = '{}'::jsonb WHERE id = ANY(%s) AND id %% 10 = 0", [ids]
        )
    # A supervisor's restarts: three workers, one after the other, each until it exits.
    codes, last = [], None
    for n in range(3):
        last = start_worker("--lease", "10", "--worker-id", f"w{n}", "--burst")
        codes.append(last.wait(timeout=60))
    statuses = dict(Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True)))
    ran = set(BodyRun.objects.filter(job_id__in=ids).values_list("job_id", flat=True))
    failed = set(Job.objects.filter(id__in=ids, status="failed").values_list("id", flat=True))
    tail = "\n".join(last.log().strip().splitlines()[-2:])
    assert (codes, statuses) == ([0, 0, 0], {"done": 3000}), (
        f"exit codes {codes}; jobs {statuses}, {len(failed - ran)} failed without a body run; "
        f"the last worker's log ends:\n{tail}"
    )


# -- a rate window of minus infinity written by hand -------------------------------------------


def test_a_rate_window_of_minus_infinity_written_by_hand_fails_no_claim(worker):
    """queue-controls.md: a rate window over 366 days "already in the table is read as 366
    days" (``LEAST(rate_seconds, 31622400)``): a hand-written window must not break the
    claim, and +infinity is indeed read so. But ``rate_seconds`` is a float column with no
    check, and ``-infinity`` passes ``LEAST`` unchanged: the limited claim's
    ``clock_timestamp() + make_interval(secs => -infinity)`` is "interval out of range",
    so every limited claim that would take a job of that queue fails whole, the claimer
    raises, the worker dies with a traceback, and the plain jobs beside it never run."""
    from django.db import connection

    from leasejobs.queues import controls

    controls.set_limits("hand_rate", rate="5/s")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE leasejobs_queue SET rate_seconds = '-infinity' WHERE name = 'hand_rate'")
    limited = [record.using(queue="hand_rate").enqueue(n) for n in range(3)]
    plain = [record.enqueue(n) for n in range(5)]
    w = worker("--burst")
    code = w.wait(timeout=60)
    statuses = [job_now(j).status for j in plain]
    tail = "\n".join(w.log().strip().splitlines()[-2:])
    assert (code, statuses) == (0, ["done"] * 5), f"exit {code}; plain jobs {statuses}; log ends:\n{tail}"
    assert {job_now(j).status for j in limited} <= {"queued", "done"}


# -- a durable sleep whose worker died before writing the job back -----------------------------


def test_a_sleep_under_a_limit_whose_worker_died_before_the_write_back_is_not_cut_short(worker, tmp_path):
    """workflows.md, Durable sleep: "If the worker dies between the sleep's commit and
    writing the job back, the job is reclaimed when the sleep ends, not before."

    The sleep's fenced transaction sets ``run_at`` to the sleep's end while the row is
    still ``running``; the plain claim finds an expired lease only among rows with
    ``run_at <= now``, but the limited claim (``CLAIM_LIMITED``: a job with a concurrency
    key, or of a limited queue) takes ``status = 'running' AND lease_until < now`` whatever
    its ``run_at``. So a job under a limit is claimed again as soon as the dead worker's
    lease runs out, its body runs again, its recorded sleep "returns at once", and a
    sleep of an hour ends after a few seconds.

    The worker is SIGSTOPped while the body runs (its child goes on), the body sleeps
    (committed), the worker is SIGKILLed before it could write the job back; a second
    worker runs for the lease and a few seconds more. (The same without a limit holds: the
    job stays asleep.)"""
    from tests.review51_b_tasks import naps_once_the_file_exists

    go = tmp_path / "go"
    job = naps_once_the_file_exists.using(concurrency_key="sleepy").enqueue(str(go), 3600)
    first = worker("--lease", "4", "--worker-id", "first")
    wait_until(lambda: BodyRun.objects.filter(job_id=job.id).exists(), timeout=30, what="the body started")
    first.signal(signal.SIGSTOP)
    go.touch()
    wait_until(lambda: Step.objects.filter(job_id=job.id, kind="sleep").exists(), timeout=3, what="the sleep")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    worker("--lease", "4", "--worker-id", "second")
    time.sleep(10)  # past the first worker's 4 s lease
    job = job_now(job)
    runs = BodyRun.objects.filter(job_id=job.id).count()
    assert (job.status, runs) != ("done", 2), (
        f"a sleep of an hour ended after {(job.finished_at - job.created_at).total_seconds():.1f} s: "
        f"job {job.status}, {runs} body runs, result {job.result!r}"
    )
    assert runs == 1, (job.status, runs)


# -- a rate lowered and raised again within its window -----------------------------------------


def test_a_rate_lowered_and_raised_again_lets_no_more_than_n_claims_into_a_window(worker):
    """queue-controls.md: a rate place "is held for the rate window from its claim and freed
    by nothing else, so ... any window of that length holds at most N claims"; "Rate places
    above a lowered count are removed at once, held or not: the claims they recorded stay
    in the past, and the places 1..N left still let no more than N claims into any window."

    The rate is ``4/30s``; four jobs are claimed at once. An operator lowers it to ``1/30s``
    (the three held places above 1 are deleted, with the claims they recorded) and puts it
    back to ``4/30s`` a moment later: places 2 to 4 are made again, free, and three more
    jobs are claimed at once: seven claims in a window of 30 s under a rate of 4 per 30 s."""
    from leasejobs.queues import controls

    controls.set_limits("rq", rate="4/30s")
    jobs = [record.using(queue="rq").enqueue(n) for n in range(12)]
    w = worker("--concurrency", "4", "--queue", "rq")
    claimed = Job.objects.filter(id__in=[j.id for j in jobs]).exclude(started_at=None)
    wait_until(lambda: claimed.count() >= 4, timeout=30, what="the first four claims")
    controls.set_limits("rq", rate="1/30s")
    controls.set_limits("rq", rate="4/30s")
    time.sleep(3)
    w.signal(signal.SIGTERM)
    w.wait(timeout=30)
    starts = sorted(claimed.values_list("started_at", flat=True))
    in_window = [t for t in starts if (t - starts[0]).total_seconds() < 30]
    assert len(in_window) <= 4, (
        f"{len(in_window)} claims within {(in_window[-1] - starts[0]).total_seconds():.1f} s "
        "under a rate of 4/30s"
    )


# -- a workflow child locked by the application holds up every finish of the worker -------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a finish settles a workflow parent's edges in its own statement and waits for a "
        'child row another transaction holds (docs/guarantees.md, "What does not hold")'
    ),
)
def test_a_child_row_held_by_the_application_holds_up_no_other_jobs_finish(worker):
    """guarantees.md, "A locked row or a slow database does not wedge the worker": a
    finish waits for a locked row 0.2 s, "one held longer holds its batch up that long,
    once", and "the worker's other jobs keep being renewed and finished".

    A workflow parent finishes while an application transaction holds its *child* row
    (``select_for_update()``, 12 s). The settling of the parent's edges, inside the
    finish, waits for the child 5 s (the finish connection's ``lock_timeout``) each try
    and fails the whole batch, which is tried again with every outcome that arrived
    meanwhile: ten plain jobs, nothing to do with the workflow, whose bodies returned,
    stay ``running`` for the whole 12 s, their rows locked by the waiting finish so that
    the heartbeat skips them and their 2 s leases run out; the parent's own lease runs
    out too and a second worker takes it over and runs its body again ("stale done
    dropped"). The plain jobs (``max_attempts=1``) taken over meanwhile end *failed*,
    "lease expired on the last run (1 of 1)", though their bodies returned."""
    import psycopg

    import leasejobs
    from leasejobs.db.connection import connection_params
    from tests.testapp.workflow_tasks import leaf

    with leasejobs.workflow("held child") as wf:
        parent = wf.add(leaf, args=(7, 0.0))
        child = wf.add(leaf, args=(8, 0.0), after=[parent])
    app = psycopg.connect(**connection_params())
    app.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [child.id])
    try:
        a = worker("--lease", "2", "--worker-id", "a", "--concurrency", "2")

        def finish_waits() -> bool:
            with psycopg.connect(**connection_params(), autocommit=True) as look:
                return bool(
                    look.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'leasejobs finish%%'"
                        " AND wait_event_type = 'Lock'"
                    ).fetchone()
                )

        wait_until(finish_waits, timeout=30, interval=0.02, what="the parent's finish waiting for the child")
        plain = [quick.enqueue(n) for n in range(10)]
        worker("--lease", "2", "--worker-id", "b")
        time.sleep(12)
    finally:
        app.rollback()
        app.close()
    ids = [j.id for j in plain]
    wait_until(
        lambda: all(job_now(j).status in FINAL for j in plain), timeout=30, what="the plain jobs ended"
    )
    started = dict(BodyRun.objects.filter(job_id__in=ids).values_list("job_id", "created_at"))
    rows = Job.objects.filter(id__in=ids)
    statuses = dict(Counter(rows.values_list("status", flat=True)))
    held_up = sorted(
        round((j.finished_at - started[j.id]).total_seconds(), 1) for j in rows if j.id in started
    )
    errors = sorted({j.last_error.split(": worker")[0] for j in rows if j.status != "done"})
    parent_runs = BodyRun.objects.filter(job_id=parent.id).count()
    assert (statuses, held_up[-1] < 2.0, parent_runs) == ({"done": 10}, True, 1), (
        f"plain jobs {statuses} {errors}; seconds from body start to finish: {held_up}; "
        f"the parent's body ran {parent_runs} times; worker a: "
        + "".join(line[24:200] + "\n" for line in a.log().splitlines() if "WARNING leasejobs.worker" in line)
    )


# -- a bulk retry beside a row whose counter is at its end -------------------------------------


def test_a_bulk_retry_of_failed_jobs_is_not_stopped_by_one_whose_run_counter_is_at_its_end(worker):
    """A row written by SQL with ``runs`` = 2,147,483,647: the worker fails it alone, as
    promised (test_hostile_review's counter test: "its attempt (…) or run (…) counter is at
    the largest integer"). Beside it, three jobs that failed in the ordinary way.

    operations.md: ``leasejobs_jobs retry`` "queues failed (or cancelled) jobs due now with
    one more attempt allowed", each batch through the admin's own statement, which changes
    a job only while it still has the status and attempt it was matched with. That
    statement's ``max_attempts = GREATEST(j.max_attempts, j.runs + 1)`` is out of range
    for the one row, so the whole batch fails: the command dies with a traceback and none
    of the three is retried (the admin's "Retry now" on a selection including it is the
    same statement)."""
    import subprocess
    import sys

    from tests.adminpages import make_job
    from tests.helpers import ROOT, worker_env

    hostile = _insert_row(record.name, runs=2**31 - 1)
    w = worker("--burst")
    assert w.wait(timeout=60) == 0, w.log()[-2000:]
    assert _status(hostile)[0] == "failed"
    ordinary = [make_job(status="failed", attempt=1, max_attempts=1, last_error="boom") for _ in range(3)]
    command = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "leasejobs_jobs", "retry", "--all"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    statuses = [job_now(j).status for j in ordinary]
    said = (command.stdout + command.stderr).strip().splitlines()
    assert (command.returncode, statuses) == (0, ["queued"] * 3), (
        f"exit {command.returncode}; the ordinary failed jobs are {statuses}; it said: {said[-1:]}"
    )


# -- a database that ends idle sessions ---------------------------------------------------------


@pytest.fixture
def database_setting():
    """``ALTER DATABASE <this test's own database> SET name = value`` for the sessions
    started after it (the workers'), reset at the end."""
    from django.db import connection

    name = connection.settings_dict["NAME"]
    assert name.startswith("test_"), name  # the test run's own database, never another
    made: list[str] = []

    def apply(setting: str, value: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} SET {setting} = %s", [value])
        made.append(setting)

    yield apply
    with connection.cursor() as cursor:
        for setting in made:
            cursor.execute(f"ALTER DATABASE {name} RESET {setting}")


@pytest.mark.parametrize("how", ["idle_session_timeout", "sessions_terminated"])
def test_a_job_after_its_childs_connection_was_cut_while_idle_runs(worker, database_setting, how):
    """guarantees.md, "No job is lost while PostgreSQL keeps its data": "Restarts of the
    server, killed connections ... delay jobs but lose none: workers reconnect (with
    backoff) and go on".

    A child keeps its Django connection between bodies (``CONN_MAX_AGE``), and checks it
    only after a body that raised. When the server ends that connection while the child
    is idle (``idle_session_timeout``, a managed database's default on some hosts; or
    every session of the database terminated, as a restart of the server does), the next
    body's first query raises "terminating connection ...": with ``max_attempts=1`` the
    job fails, though its body never got to do anything, and every child fails one job
    that way."""
    from django.db import connection

    if how == "idle_session_timeout":
        database_setting("idle_session_timeout", "1s")
    first = [quick.enqueue(n) for n in range(4)]
    worker("--concurrency", "2", "--lease", "3")
    wait_until(lambda: all(job_now(j).status in FINAL for j in first), timeout=30, what="the first jobs")
    time.sleep(0.5)
    if how == "sessions_terminated":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
    time.sleep(3)
    second = [quick.enqueue(n) for n in range(4)]
    wait_until(lambda: all(job_now(j).status in FINAL for j in second), timeout=30, what="the second jobs")
    ended = [job_now(j) for j in first + second]
    failed = sorted({j.last_error.split(": ", 1)[-1][:90] for j in ended if j.status != "done"})
    statuses = dict(Counter(j.status for j in ended))
    assert statuses == {"done": 8}, f"{statuses}: {failed}"


# -- a running job's row held by the application longer than its lease -------------------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a lease the heartbeat cannot renew (its row held by another transaction) ends at"
        " its time: the zygote kills the body before any worker could take the job "
        '(docs/guarantees.md, "What does not hold")'
    ),
)
def test_a_running_job_whose_row_the_application_holds_past_its_lease_completes(worker):
    """guarantees.md, "A locked row or a slow database does not wedge the worker": the
    heartbeat skips a row another transaction holds, "Claims skip locked rows too, so
    nobody takes a locked job over meanwhile", and "the locked jobs complete once the lock
    is gone".

    A job of one attempt (``max_attempts=1``) runs a 4 s body that never touches its row;
    an application transaction holds the row ``FOR UPDATE`` for 5 s (lease 2 s). The
    worker, alive and heartbeating, cannot renew that one lease, so its zygote kills the
    body at the lease's end though nobody can take the job; the kill spends the job's only
    run, and once the lock is gone the job ends *failed*, "lease expired on the last run
    (1 of 1): worker a stopped heartbeating". (chaos/test_slow_database accepts the kill,
    with jobs that have runs to spare.)"""
    import psycopg

    from leasejobs.db.connection import connection_params
    from tests.review51_b_tasks import naps_once

    job = naps_once.enqueue(4.0)
    w = worker("--lease", "2", "--worker-id", "a")
    wait_until(lambda: BodyRun.objects.filter(job_id=job.id).exists(), timeout=30, what="the body started")
    with psycopg.connect(**connection_params()) as app:
        app.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [job.id])
        time.sleep(5)
        app.commit()
    wait_until(lambda: job_now(job).status in FINAL, timeout=30, what="the job ended")
    job = job_now(job)
    runs = BodyRun.objects.filter(job_id=job.id).count()
    assert (job.status, job.result, runs) == ("done", 4.0, 1), (
        f"{job.status} ({job.last_error!r}), {runs} body runs; "
        + "".join(
            line[24:220] + "\n" for line in w.log().splitlines() if "WARNING" in line or "ERROR" in line
        )
    )


# -- a place released from the admin renewed by the worker that lost it -----------------------


def test_a_place_of_a_lease_released_from_the_admin_is_not_renewed_by_its_old_holder(worker):
    """queue-controls.md / admin.py: a lease released from the admin "leaves the attempt's
    places under limits alone: its body may run until its worker's next heartbeat notices,
    so a place frees only when its hold runs out (the worker can no longer renew it)".

    The worker's heartbeat renews the places of every attempt it holds in a part of the
    statement that does not look at the job row (``places``, meant for rows its own
    side-effect block locks): the heartbeat that finds the lease released renews the
    released attempt's place for a whole lease more, after which the body is stopped
    within a second. Limit 1, lease 6 s: the queue's only place stays held for seconds
    after the last body that could use it is gone."""
    from django.db import connection

    from leasejobs import conf
    from leasejobs.db import sql
    from leasejobs.queues import controls
    from tests.review51_b_tasks import naps

    controls.set_limits("svc51", concurrency=1)
    job = naps.using(queue="svc51").enqueue(30)
    a = worker("--concurrency", "1", "--lease", "6", "--worker-id", "a", "--queue", "svc51")

    def held_until():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT held_until FROM leasejobs_slot WHERE kind = 'concurrency' AND name = 'svc51'"
                " AND job_id = %s",
                [job.id],
            )
            row = cursor.fetchone()
            return row[0] if row else None

    wait_until(lambda: job_now(job).heartbeat_at is not None, timeout=30, what="a first heartbeat")
    with connection.cursor() as cursor:
        cursor.execute(
            sql.ADMIN_RELEASE, {"ids": [job.id], "attempts": [1], "channel": conf.get("NOTIFY_CHANNEL")}
        )
        cursor.execute("SELECT clock_timestamp()")
        released_at = cursor.fetchone()[0]
    at_release = held_until()
    a.wait_for_log(rf"lease lost job={job.id} attempt=1", timeout=20)
    after = held_until()
    assert after <= at_release, (
        f"the place was held until {(at_release - released_at).total_seconds():.1f} s after the release; "
        f"the old holder's heartbeat moved that to {(after - released_at).total_seconds():.1f} s"
    )


# -- a claim that ends a workflow parent waits for a child the application holds --------------


@pytest.mark.xfail(
    strict=True,
    reason=(
        "a claim that ends a workflow parent settles its edges in its own statement and "
        'waits for a child row another transaction holds (docs/guarantees.md, "What does '
        'not hold")'
    ),
)
def test_a_child_row_held_by_the_application_does_not_stop_every_claim(worker):
    """guarantees.md, "A locked row or a slow database does not wedge the worker": claims
    "skip locked rows", and a row locked elsewhere delays only its own job.

    A workflow parent of one attempt whose worker was SIGKILLed mid-body: at the next
    claim it ends *failed* ("lease expired on the last run"), and that claim settles its
    edges in the same statement, locking its child, which an application transaction
    holds (``select_for_update()``, 12 s). The claim waits for the child (the claim
    connection's 5 s ``lock_timeout``), fails, and the next claim picks the same parent
    first and waits again: twenty plain jobs enqueued beside it, nothing to do with the
    workflow, run on no worker for as long as the application holds one child row."""
    import psycopg

    import leasejobs
    from leasejobs.db.connection import connection_params
    from tests.review51_b_tasks import naps_once

    with leasejobs.workflow("orphaned parent") as wf:
        parent = wf.add(naps_once, args=(30.0,))
        child = wf.add(naps_once, args=(0.0,), after=[parent])
    a = worker("--lease", "2", "--worker-id", "a")
    wait_until(lambda: BodyRun.objects.filter(job_id=parent.id).exists(), timeout=30, what="the parent runs")
    a.signal(signal.SIGKILL)
    a.wait(timeout=10)
    app = psycopg.connect(**connection_params())
    try:
        app.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [child.id])
        plain = [quick.enqueue(n) for n in range(20)]
        time.sleep(2.5)  # the parent's lease has run out
        worker("--lease", "2", "--worker-id", "b")
        time.sleep(10)
        done = Job.objects.filter(id__in=[j.id for j in plain], status="done").count()
    finally:
        app.rollback()
        app.close()
    ids = [j.id for j in plain]
    wait_until(
        lambda: not Job.objects.filter(id__in=ids, status__in=["queued", "running"]).exists(),
        timeout=30,
        what="the plain jobs ended",
    )
    statuses = dict(Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True)))
    assert (done, statuses) == (20, {"done": 20}), (
        f"{done} of 20 plain jobs done in the 10 s the child row was held; in the end {statuses}"
    )


@pytest.mark.parametrize("limit", [None, 0, -1])
def test_a_keyed_row_without_a_usable_limit_fails_instead_of_waiting_forever(worker, limit):
    """A row written by SQL with a concurrency key and a ``concurrency_limit`` of NULL, 0 or
    -1 (enqueue refuses each). No place can be numbered within such a limit, so the limited
    claim never takes it and the plain claim leaves every keyed row alone: it stays queued
    for ever, neither run nor failed, and a ``--burst`` worker exits 0 with it queued.
    guarantees.md: a bad row "fails its own job only"."""
    record.using(concurrency_key="k51", concurrency_limit=2).enqueue(0)  # the key's places exist
    hostile = _insert_row(record.name, concurrency_key="k51", concurrency_limit=limit)
    w = worker("--burst")
    assert w.wait(timeout=60) == 0, w.log()[-1500:]
    assert _status(hostile)[0] in FINAL, _status(hostile)
