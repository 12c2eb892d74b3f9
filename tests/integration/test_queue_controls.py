"""The integration half of tests/unit/test_queue_controls.py: its tests that start workers or commit."""

import datetime as dt
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test import override_settings

from leasejobs.models import Job, Queue, Slot
from leasejobs.queues import controls
from tests.connection_budget import many_connections
from tests.helpers import ROOT, wait_until, worker_env
from tests.journal import max_concurrency, most_at_once
from tests.journal import read as read_journal
from tests.testapp.tasks import add, export, journal


def done(queue: str | None = None) -> int:
    jobs = Job.objects.filter(status="done")
    return (jobs.filter(queue=queue) if queue else jobs).count()


def enqueue_journal(path: Path, n: int, seconds: float, queue: str) -> None:
    journal.using(queue=queue).bulk_enqueue([((str(path), seconds), {}) for _ in range(n)])


def place_holder(kind: str, name: str) -> list[tuple[int | None, int | None]]:
    """The (job, attempt) holding each unexpired place of a limit."""
    from django.utils import timezone

    return list(
        Slot.objects.filter(kind=kind, name=name, held_until__gte=timezone.now())
        .order_by("n")
        .values_list("job_id", "attempt")
    )


# -- never over the limit --------------------------------------------------------


@many_connections(50)
def test_eight_workers_of_sixteen_threads_never_run_four_jobs_of_a_queue_limited_to_three(
    start_worker, tmp_path
):
    """Thousands of short jobs, 128 runner threads racing for 3 places: never 4 at once."""
    path = tmp_path / "journal"
    controls.set_limits("pdf", concurrency=3)
    enqueue_journal(path, 1200, 0.002, "pdf")
    workers = [start_worker("--concurrency", "16", "--queue", "pdf", "-v", "2") for _ in range(8)]
    deadline = time.monotonic() + 60  # all 1200, or what a minute allows on a loaded machine
    wait_until(lambda: done("pdf") == 1200 or time.monotonic() > deadline, timeout=120, interval=0.5)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.log()[-2000:]
    _, ends, _ = read_journal(path)
    assert len(ends) >= 600, f"only {len(ends)} jobs ran in a minute"
    assert max_concurrency(path) == 3
    assert sum(w.count(r"claimed job=") for w in workers) >= 600


# -- tied to the lease -------------------------------------------------------------


def test_a_sigkilled_workers_place_is_free_once_its_lease_runs_out(start_worker, tmp_path):
    path = tmp_path / "journal"
    controls.set_limits("pdf", concurrency=1)
    enqueue_journal(path, 1, 30.0, "pdf")  # the holder: runs until killed
    holder = start_worker("--concurrency", "2", "--queue", "pdf", "--lease", "3")
    wait_until(lambda: read_journal(path)[0], timeout=60, what="the first job to start")
    first = Job.objects.get()
    enqueue_journal(path, 3, 0.1, "pdf")
    holder.signal(signal.SIGKILL)
    killed_at = time.time()
    holder.wait(timeout=30)
    assert place_holder("concurrency", "pdf") == [(first.id, 1)]
    # Cancelled as the admin cancels a running job: the claim that finds its lease run out
    # ends it (its place freed then, not before) instead of running its 30 s body again.
    Job.objects.filter(id=first.id).update(cancel_requested=True)
    other = start_worker("--concurrency", "4", "--queue", "pdf", "--lease", "3")
    wait_until(lambda: done("pdf") >= 3, timeout=60, what="the waiting jobs to run")
    assert Job.objects.get(id=first.id).status == "cancelled"
    starts, _, _ = read_journal(path)
    later = sorted(at for (job_id, _), at in starts.items() if job_id != first.id)
    # Nothing started while the killed attempt's lease ran (3 s from its last heartbeat).
    assert later[0] > killed_at + 1.0, later[0] - killed_at
    assert max_concurrency(path, open_until=killed_at) == 1
    other.signal(signal.SIGTERM)
    assert other.wait(timeout=60) == 0


def test_a_stopped_slot_holder_loses_its_place_and_its_finish_frees_nothing_of_the_new_holder(
    start_worker, tmp_path
):
    path = tmp_path / "journal"
    controls.set_limits("pdf", concurrency=1)
    enqueue_journal(path, 1, 4.0, "pdf")
    stopped = start_worker("--concurrency", "1", "--queue", "pdf", "--lease", "2")
    wait_until(lambda: read_journal(path)[0], timeout=60, what="the job to start")
    job = Job.objects.get()
    stopped.signal(signal.SIGSTOP)
    try:
        taker = start_worker("--concurrency", "2", "--queue", "pdf", "--lease", "2")
        # The lease runs out; the other worker takes the job over, with its place.
        wait_until(lambda: place_holder("concurrency", "pdf") == [(job.id, 2)], timeout=60, what="takeover")
        enqueue_journal(path, 1, 0.1, "pdf")  # must wait for the place
    finally:
        stopped.signal(signal.SIGCONT)
    # The old holder wakes: its heartbeat finds the place lost, its body ends, its finish is fenced off.
    stopped.wait_for_log(rf"lease lost job={job.id} attempt=1 ", timeout=30)
    assert place_holder("concurrency", "pdf") == [(job.id, 2)]
    wait_until(lambda: done("pdf") == 2, timeout=60, what="both jobs done")
    starts, ends, _ = read_journal(path)
    second = next(key for key in starts if key[0] != job.id)
    # The queued job started only after the new holder (attempt 2) ended.
    assert starts[second] >= ends[(job.id, 2)]
    assert Job.objects.get(id=job.id).attempt == 2
    taker.signal(signal.SIGTERM)
    assert taker.wait(timeout=60) == 0


# -- pause and resume ----------------------------------------------------------------


def test_pause_during_a_drain_stops_new_starts_within_a_second_and_resume_finishes_it(start_worker, tmp_path):
    path = tmp_path / "journal"
    enqueue_journal(path, 300, 0.05, "mail")
    enqueue_journal(tmp_path / "other", 50, 0.01, "other")
    workers = [start_worker("--concurrency", "4") for _ in range(2)]
    wait_until(lambda: done("mail") >= 30, timeout=60, what="the drain to get going")
    controls.pause_queue("mail")
    paused_at = time.time()
    time.sleep(3)
    starts, _, _ = read_journal(path)
    assert max(starts.values()) < paused_at + 1.0, max(starts.values()) - paused_at
    assert Job.objects.filter(queue="mail", status="running").count() == 0  # running jobs finished
    queued = Job.objects.filter(queue="mail", status="queued").count()
    assert queued > 0
    wait_until(lambda: done("other") == 50, timeout=60, what="another queue to go on while paused")
    controls.resume_queue("mail")
    wait_until(lambda: done("mail") == 300, timeout=120, what="the drain to finish after resume")
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0


def manage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env or worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_pause_and_resume_from_the_command_line(transactional_db):
    for action in ("pause", "resume"):
        out = manage("leasejobs_queue", action, "mail")
        assert out.returncode == 0, out.stderr
        assert f"queue mail {action}d" in out.stdout
    listing = manage("leasejobs_queue", "list")
    assert "mail" in listing.stdout and "active" in listing.stdout


# -- limits changed at run time ---------------------------------------------------------


def test_limits_changed_at_run_time_apply_to_the_next_claims(start_worker, tmp_path):
    path = tmp_path / "journal"
    controls.set_limits("pdf", concurrency=1)
    enqueue_journal(path, 400, 0.05, "pdf")
    workers = [start_worker("--concurrency", "4", "--queue", "pdf") for _ in range(2)]
    wait_until(lambda: done("pdf") >= 20, timeout=60)
    raised_at = time.time()
    controls.set_limits("pdf", concurrency=3)
    wait_until(lambda: done("pdf") >= 120, timeout=90)
    lowered_at = time.time()
    controls.set_limits("pdf", concurrency=2)
    wait_until(lambda: done("pdf") >= 200, timeout=90)
    settled = lowered_at + 1.0  # the jobs running under the old limit have ended by then (0.05 s each)
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    starts, ends, _ = read_journal(path)
    assert most_at_once([(s, ends[k]) for k, s in starts.items() if ends[k] < raised_at]) == 1
    assert max_concurrency(path) == 3  # raised: the workers used the new room
    assert max_concurrency(path, since=settled) == 2


# -- per-key limits and fairness -----------------------------------------------------------


def test_a_key_at_its_limit_runs_one_at_a_time_and_does_not_block_other_keys(start_worker, tmp_path):
    paths = {account: tmp_path / f"account-{account}" for account in (1, 2, 3)}
    for _ in range(5):
        export.using(concurrency_key="account:1").enqueue(str(paths[1]), 1.0)
    for account in (2, 3):
        for _ in range(20):
            export.using(concurrency_key=f"account:{account}").enqueue(str(paths[account]), 0.02)
    workers = [start_worker("--concurrency", "8") for _ in range(2)]
    # Accounts 2 and 3 finish while account 1's slow exports still go one by one.
    wait_until(
        lambda: len(read_journal(paths[2])[1]) == 20 and len(read_journal(paths[3])[1]) == 20, timeout=60
    )
    assert len(read_journal(paths[1])[1]) < 5
    wait_until(lambda: len(read_journal(paths[1])[1]) == 5, timeout=60)
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    for path in paths.values():
        assert max_concurrency(path) == 1


def test_a_queue_at_its_limit_does_not_starve_the_others_on_the_same_worker(start_worker, tmp_path):
    controls.set_limits("pdf", concurrency=1)
    enqueue_journal(tmp_path / "pdf", 3, 3.0, "pdf")
    enqueue_journal(tmp_path / "free", 200, 0.005, "free")
    worker = start_worker("--concurrency", "4")
    wait_until(lambda: done("free") == 200, timeout=60, what="the unlimited queue to drain")
    assert done("pdf") <= 1  # the limited queue is still at its limit
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


# -- rate limits -----------------------------------------------------------------------------


def test_a_burst_under_a_rate_limit_never_exceeds_it_in_any_window(start_worker, tmp_path):
    controls.set_limits("email", rate="20/10s")
    enqueue_journal(tmp_path / "journal", 200, 0.0, "email")
    workers = [start_worker("--concurrency", "8", "--queue", "email") for _ in range(2)]
    wait_until(lambda: done("email") >= 55, timeout=90, what="three windows of claims")
    for worker in workers:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    claims = sorted(Job.objects.exclude(started_at=None).values_list("started_at", flat=True))
    window = dt.timedelta(seconds=10)
    most = max(sum(1 for t in claims[i:] if t < start + window) for i, start in enumerate(claims))
    assert most == 20, most  # reached, never passed
    assert len(claims) >= 55


def drain_span(queue: str) -> float:
    """Seconds from the queue's first start to its last finish, by the database clock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM leasejobs_job "
            "WHERE queue = %s AND status = 'done'",
            [queue],
        )
        return float(cursor.fetchone()[0])


def test_a_100000_a_day_quota_does_not_slow_another_queue_on_the_same_worker(start_worker):
    """Issue 28, item 8: each limited claim under a 100000/d rate locked all its free places
    (2 s a claim), and 3,000 jobs of another queue on the same worker drained in 11.5 s, not 0.9 s."""
    add.using(queue="plain").bulk_enqueue([((1, 2), {})] * 3000)
    alone = start_worker("--burst", "--concurrency", "4", "-v", "0")
    assert alone.wait(timeout=120) == 0, alone.log()[-2000:]
    baseline = drain_span("plain")
    Job.objects.all().delete()

    controls.set_limits("quota", rate="100000/d")
    add.using(queue="quota").bulk_enqueue([((1, 2), {})] * 500)
    add.using(queue="plain").bulk_enqueue([((1, 2), {})] * 3000)
    beside = start_worker("--burst", "--concurrency", "4", "-v", "0")
    wait_until(lambda: done("plain") == 3000, timeout=120, what="the plain queue to drain")
    with_quota = drain_span("plain")
    print(f"\n3,000 plain jobs: {baseline:.2f} s alone, {with_quota:.2f} s beside a 100000/d queue")
    # The fault this guards against cost 11.5 s where 0.9 s is right; a loaded machine (CI's
    # embedded PostgreSQL 18 run) once took 2.2 s against 0.3 s alone: the bound is set between.
    assert with_quota < 5 * baseline + 2.0, (baseline, with_quota)
    # And the quota's own jobs: 500 at 2 s per claim of at most 4 took minutes.
    assert beside.wait(timeout=60) == 0, beside.log()[-2000:]
    assert done("quota") == 500


# -- bad limits --------------------------------------------------------------------------------


TOO_LONG = "1/99999999999d"
TOO_LONG_SAYS = "has a window longer than 366 days, the largest allowed"


def test_a_rate_window_too_long_for_postgresql_is_refused_where_it_is_set(transactional_db):
    """Issue 28: set_limits(rate="1/99999999999d") passed, and every worker's claim then failed
    on a timestamp overflow. Refused by set_limits, the command and the system check alike."""
    with pytest.raises(ValueError, match=TOO_LONG_SAYS):
        controls.set_limits("quota", rate=TOO_LONG)
    assert not Queue.objects.filter(name="quota").exists()
    out = manage("leasejobs_queue", "limit", "quota", "--rate", TOO_LONG)
    assert out.returncode != 0 and TOO_LONG_SAYS in out.stderr, out.stderr
    assert not Queue.objects.filter(name="quota").exists()
    with override_settings(LEASEJOBS={"QUEUES": {"quota": {"rate": TOO_LONG}}}):
        errors = [e for e in run_checks() if e.id == "leasejobs.E003"]
    assert len(errors) == 1 and TOO_LONG_SAYS in errors[0].msg, errors
    controls.set_limits("quota", rate="100000/366d")  # the largest window is allowed


def test_runworker_refuses_to_start_with_a_bad_rate(transactional_db):
    out = manage("runworker", "--burst", env=worker_env(DJANGO_SETTINGS_MODULE="tests.settings_bad_queues"))
    assert out.returncode != 0
    assert "LEASEJOBS['QUEUES']: queue 'email': rate 'lots' is not of the form" in out.stderr


@pytest.mark.parametrize("bulk", [False, True], ids=["enqueue", "bulk_enqueue"])
def test_a_keyed_job_and_its_keys_places_commit_together_outside_atomic(transactional_db, bulk):
    """Autocommit would commit the job before its key's places: a failure in between strands it."""

    def fail_at_places(execute, sql, params, many, context):
        if "leasejobs_slot" in sql:
            raise RuntimeError("killed between the job and its places")
        return execute(sql, params, many, context)

    keyed = export.using(concurrency_key="account:9")
    with connection.execute_wrapper(fail_at_places), pytest.raises(RuntimeError, match="killed between"):
        if bulk:
            keyed.bulk_enqueue([(("a", 0.0), {}), (("b", 0.0), {})])
        else:
            keyed.enqueue("a", 0.0)
    assert Job.objects.count() == 0
    assert not connection.in_atomic_block
    keyed.enqueue("a", 0.0)
    assert Slot.objects.filter(kind="key", name="account:9").count() == 1
