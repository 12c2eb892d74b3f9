"""Review 6: keyed NOTIFY payloads (d85301a, 17424b1) and the E006 check, attacked with
real ``runworker`` processes. Each test shows one broken promise."""

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
from django.db import connection, transaction
from django.utils import timezone

import leasejobs
from leasejobs.db.connection import connection_params
from leasejobs.db.sql.fragments import keyed_payload
from leasejobs.models import Job
from leasejobs.operations import bulk
from tests.helpers import ROOT, wait_until, worker_env
from tests.integration.test_claim_queues import _done, _front_look_hung
from tests.testapp.tasks import record, sleeper


def _notify(payload: str) -> None:
    """Another program on the database sends ``payload`` on the ``leasejobs`` channel."""
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        conn.execute("SELECT pg_notify('leasejobs', %s)", [payload])


def test_a_malformed_notify_payload_from_another_program_stops_the_worker(start_worker):
    """Any session of the database may NOTIFY on the ``leasejobs`` channel (docs invite
    programs of one's own to listen on it). A worker with keys (its first job done)
    hears ``default<US>7<US>not a time<US>5``: ``parse_payload`` takes it as a place
    (priority 7 has no key, so ``heard`` gives it the key ``('not a time', 4)``
    unchecked), and every claim from the keys then binds that text as a
    ``timestamptz``. What happened: the worker's claims fail on
    ``invalid input syntax for type timestamp with time zone`` and the worker stops
    (or runs nothing more); the job enqueued next never runs. Expected: a payload
    that is not a place is ignored (or treated as a queue name), the job runs."""
    worker = start_worker("--worker-id", "hostile-payload", "--concurrency", "2")
    first = record.enqueue(0)
    wait_until(lambda: _done(first), timeout=20, what="the first job done (the worker has keys)")
    _notify("default\x1f7\x1fnot a time\x1f5")
    time.sleep(0.5)
    after = record.enqueue(1)
    ran = True
    try:
        wait_until(lambda: _done(after), timeout=10, what="the job enqueued after the payload done")
    except AssertionError:
        ran = False
    alive = worker.proc.poll() is None
    assert ran and alive, (ran, alive, worker.log()[-3000:])


def test_a_notify_with_an_out_of_range_priority_stops_the_worker(start_worker):
    """Same as above with a well-formed time but a priority no smallint holds:
    ``default<US>99999999999<US>2026-01-01 00:00:00+00<US>5``. ``int()`` reads it, the key
    array bound to the claim overflows. What happened: the worker's claims fail and
    the next job never runs. Expected: the payload is ignored, the job runs."""
    worker = start_worker("--worker-id", "hostile-priority", "--concurrency", "2")
    first = record.enqueue(0)
    wait_until(lambda: _done(first), timeout=20, what="the first job done (the worker has keys)")
    _notify("default\x1f99999999999\x1f2026-01-01 00:00:00+00\x1f5")
    time.sleep(0.5)
    after = record.enqueue(1)
    ran = True
    try:
        wait_until(lambda: _done(after), timeout=10, what="the job enqueued after the payload done")
    except AssertionError:
        ran = False
    alive = worker.proc.poll() is None
    assert ran and alive, (ran, alive, worker.log()[-3000:])


def test_a_job_with_a_short_delay_committed_late_runs_without_a_walk(start_worker):
    """A request enqueues ``record.using(delay=0.2)`` (due in 200 ms) inside its
    transaction, then works on for a second before it commits, while other jobs,
    enqueued and committed 0.3 s after it, are claimed and run: the worker's key moves
    past the delayed job's ``run_at``. ENQUEUE sends no NOTIFY for a job not yet due at
    its statement (``CASE WHEN run_at <= statement_timestamp()``), so nothing carries
    its place; when it commits it is already due and lies behind the key. The front
    look is hung (as in test_claim_queues). guarantees.md: a job "committed long after
    its statement, as a request that enqueues and then works on commits it, is
    announced by its NOTIFY, which carries its place: the next claim starts before it".
    What happened: it stays queued until the stuck look is walked past (about 10 s
    after the commit): it runs only after a walk from the front. Now its NOTIFY carries
    its place, marked ``later``, and the key moves back to it."""
    worker, pid = _front_look_hung(start_worker, "delay-late")
    opened, release = threading.Event(), threading.Event()
    late: list[Job] = []

    def producer() -> None:
        try:
            with transaction.atomic():
                late.append(record.using(delay=0.2).enqueue(97))
                opened.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        assert opened.wait(10)
        time.sleep(0.4)
        jobs = [record.enqueue(n) for n in range(1, 11)]
        wait_until(lambda: _done(*jobs), timeout=30, what="the jobs enqueued after the open one done")
        release.set()
        thread.join(10)
        committed = time.monotonic()
        wait_until(lambda: _done(*late), timeout=30, what="the job committed late done")
        took = time.monotonic() - committed
    finally:
        release.set()
        os.kill(pid, signal.SIGCONT)
    assert worker.proc.poll() is None
    assert took < 4, f"the delayed job committed late ran {took:.1f} s after its commit: after a walk"


def test_a_queue_name_holding_the_separator_stops_the_worker_on_a_retry(start_worker):
    """Queue names may hold any character (``validate_queue``: 1 to 100 of them), and
    the enqueue's own keyed payload is parsed from the right, so the name survives it.
    But a retry (``leasejobs.operations.bulk.apply("retry", ...)``, the admin's action),
    like a freed place, a released job and a woken workflow step, still NOTIFYs the bare
    queue name, which ``parse_payload`` reads as a place when it ends in three fields:
    the queue ``q<US>7<US>not a time<US>5`` is heard as queue ``q`` and the place
    ``(7, ('not a time', 5))``. A worker with keys (its first job done) serving every
    queue gets that place as priority 7's key. What happened: its next claim binds
    ``'not a time'`` as a timestamptz, fails, and the worker stops; the retried job
    never runs. Expected: the retried job runs, the worker keeps running."""
    worker = start_worker("--worker-id", "queue-separator", "--concurrency", "2")
    first = record.enqueue(0)
    wait_until(lambda: _done(first), timeout=20, what="the first job done (the worker has keys)")
    name = "q\x1f7\x1fnot a time\x1f5"
    later = record.using(queue=name, run_at=timezone.now() + dt.timedelta(hours=1)).enqueue(1)
    assert Job.objects.get(pk=later.pk).queue == name
    changed = bulk.apply("retry", Job.objects.filter(pk=later.pk), by="review6")
    assert len(changed.changed) == 1
    ran = True
    try:
        wait_until(lambda: _done(later), timeout=10, what="the retried job done")
    except AssertionError:
        ran = False
    alive = worker.proc.poll() is None
    assert ran and alive, (ran, alive, worker.log()[-3000:])


def test_jobs_of_a_resumed_queue_run_without_waiting_for_a_walk(start_worker):
    """A queue is paused (``leasejobs.pause_queue("reports")``) with a job in it; jobs of
    another queue, enqueued 0.3 s later, are claimed and run, so the worker's key moves
    past the paused job (the claims pass over it). Then ``resume_queue("reports")``
    (docs/queue-controls.md: "its workers are woken at once"). Its NOTIFY is the bare
    queue name: no place, so the key stays past the job. With the front look hung (as
    under a pinned horizon, test_claim_queues), what happened: the resumed job runs
    only when the stuck look is walked past, about 10 s after the resume. Expected: the
    woken worker's next claim takes it (within a second or two). Now resume_queue's
    NOTIFY asks for a walk from the front (``fragments.front_payload``), which the
    worker makes at once, whatever walks cost."""
    worker, pid = _front_look_hung(start_worker, "resume-late")
    try:
        leasejobs.pause_queue("reports")
        paused = record.using(queue="reports").enqueue(50)
        time.sleep(0.3)
        jobs = [record.enqueue(n) for n in range(1, 11)]
        wait_until(lambda: _done(*jobs), timeout=30, what="the jobs of the other queue done")
        assert Job.objects.get(pk=paused.pk).status == "queued"
        leasejobs.resume_queue("reports")
        resumed = time.monotonic()
        wait_until(lambda: _done(paused), timeout=30, what="the resumed queue's job done")
        took = time.monotonic() - resumed
    finally:
        os.kill(pid, signal.SIGCONT)
    assert worker.proc.poll() is None
    assert took < 4, f"the resumed queue's job ran {took:.1f} s after the resume: after a walk"


def test_a_poll_interval_no_wait_can_take_is_refused_by_the_check():
    """``LEASEJOBS["POLL_INTERVAL_SECONDS"] = 1e10`` (tests/review6_poll_settings.py):
    "never poll, the NOTIFY wakes us", written as a large finite number because E006
    refuses ``float("inf")``. What happened: ``manage.py check`` passed it, and the
    worker's claim loop died at once on ``self.wake.wait(1e10)``, over
    ``threading.TIMEOUT_MAX`` (``OverflowError``). Now the check refuses it in one
    sentence: a wait of the worker's is a day at most."""
    check = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=worker_env(DJANGO_SETTINGS_MODULE="tests.review6_poll_settings"),
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0
    assert (
        "(leasejobs.E006) LEASEJOBS['POLL_INTERVAL_SECONDS'] must be a number of seconds, more than 0 "
        in (check.stderr)
    ), check.stderr


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_busy_worker_keeps_every_notify_it_hears_until_its_next_claim(start_worker):
    """``ClaimStart.heard`` appends every place it is given to ``_heard``, which only the
    next claim's ``after()`` clears. A worker whose children are all busy (``--concurrency
    1 --prefetch 0``, a 120 s body running: room 0, so neither the loop nor the listener
    claims) goes on hearing the NOTIFY of every job enqueued in its queues. 400,000 jobs
    are enqueued (one INSERT ... SELECT whose rows each NOTIFY ``keyed_payload``, as
    ENQUEUE_PLAIN does), as producers feeding other workers would in minutes. What
    happened: the worker's main process grew by about 240 bytes a NOTIFY (about +95 MB
    here; at the parent commit 05c3432 it stays flat), without bound while the body runs:
    at 1,000 jobs a second, most of a GB an hour. Expected: memory independent of how
    many NOTIFYs arrive between two claims."""
    worker = start_worker("--worker-id", "heard-leak", "--concurrency", "1", "--prefetch", "0")
    long = sleeper.enqueue(120)
    wait_until(
        lambda: Job.objects.get(pk=long.pk).status == "running", timeout=20, what="the long body running"
    )
    time.sleep(1)
    before = _rss_mb(worker.pid)
    payload = keyed_payload("'default'")
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        for _ in range(4):
            conn.execute(
                f"""
                WITH inserted AS (
                    INSERT INTO leasejobs_job (
                        task_name, queue, priority, args, kwargs, status, attempt, max_attempts, run_at,
                        leased_by, cancel_requested, last_error, errors, worker_ids, created_at, snoozes
                    )
                    SELECT 'tests.testapp.tasks.record', 'default', 0, '[1]', '{{}}', 'queued', 0, 3,
                           statement_timestamp(), '', false, '', NULL, NULL, statement_timestamp(), 0
                    FROM generate_series(1, 100000)
                    RETURNING id, priority, run_at
                )
                SELECT count(pg_notify('leasejobs', {payload})) FROM inserted
                """
            )
    time.sleep(3)
    grown = _rss_mb(worker.pid) - before
    assert worker.proc.poll() is None
    assert Job.objects.get(pk=long.pk).status == "running"
    assert grown < 30, f"the busy worker grew by {grown:.0f} MB hearing 400,000 NOTIFYs"


def test_a_queue_name_with_a_lone_surrogate_is_refused_like_a_worker_id(transactional_db):
    """``runworker --queue $'q\\xff'`` (a byte that is not UTF-8 on the command line,
    which Python reads as the lone surrogate ``'q\\udcff'``). 34222c5 refuses a NUL or a
    lone surrogate in keys and worker ids "where it is given", in one sentence
    (``runworker --worker-id $'w\\xff'`` says "--worker-id must not contain a NUL
    character or a lone surrogate"), but ``validate_queue`` checks only the length.
    What happened: the worker logs "worker started", and its first claim loop turn dies
    with a traceback ending in ``UnicodeEncodeError: 'utf-8' codec can't encode
    character '\\udcff'``. Expected: a one-sentence refusal before the worker starts."""
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "runworker",
            "--burst",
            "--worker-id",
            "surrogate",
            "--queue",
            "q\udcff",
        ],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "worker started" not in output, output[-2000:]
    assert "--queue" in output, output[-2000:]
