"""Review 52: jobs waiting in a child's queue and jobs given back, broken with real processes.

Every test starts real ``runworker`` processes (settings ``tests.review52_settings``,
which add the bodies of ``tests.review52_tasks``) against PostgreSQL and reads what the
bodies really did from their journal (``tests.journal``) and the job rows. Each one
fails against the branch it was written on; what it found is in its docstring.
"""

import signal
import time
from collections.abc import Callable

import pytest

from leasejobs.jobs import registry
from leasejobs.models import Job
from leasejobs.queues import controls
from tests import review52_tasks
from tests.helpers import WorkerProcess, wait_until
from tests.journal import first_lines
from tests.review52_tasks import works

# The workers import tests.review52_tasks (tests.review52_settings names it in TASK_MODULES).
registry.found_by_workers(*(v for v in vars(review52_tasks).values() if isinstance(v, registry.Task)))

FINAL = ("done", "failed", "cancelled")
SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.review52_settings"}


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    """``runworker`` with this review's bodies registered."""

    def start(*args: str, prefix: tuple[str, ...] = ()) -> WorkerProcess:
        return start_worker(*args, env=SETTINGS, prefix=prefix)

    return start


def job_now(job: Job) -> Job:
    job.refresh_from_db()
    return job


def all_final(jobs: list[Job]) -> bool:
    return Job.objects.filter(id__in=[j.id for j in jobs], status__in=FINAL).count() == len(jobs)


def test_jobs_behind_a_slowed_body_go_to_the_idle_child(worker, tmp_path):
    """docs/queue-controls.md: "jobs waiting behind a body 40 ms past its estimate go to an
    idle child"; docs/worker.md: each child holds the job it runs "and those it will start
    within the next 20 ms of its work"; ``stopping._rebalance``.

    The rebalance only sends the child a REVOKE, and a child reads its socket between
    bodies, never while one runs: the jobs waiting behind a body that slowed down (a task
    measured at a millisecond, now 4 s) stay in its queue, ``running``, until that body
    has ended, while the worker's other child sits idle. 10 of the 20 jobs claimed behind
    it started 4.0 s after the slow body (6 of 6 runs).
    """
    fast, slow, after = tmp_path / "fast", tmp_path / "slow", tmp_path / "after"
    queue = "svc52-idle"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(fast), 0), {}) for _ in range(300)])
    long = works.using(queue=queue, priority=5).enqueue(str(slow), 4)
    behind = works.using(queue=queue).bulk_enqueue([((str(after), 0), {}) for _ in range(20)])
    worker("--concurrency", "2", "--queue", queue)
    wait_until(lambda: all_final(behind) and all_final([long]), timeout=60, what="every job ends")
    began = first_lines(slow, "S")[(long.id, 1)]
    late = sorted(t - began for t in first_lines(after, "S").values() if t - began > 1.0)
    assert late == [], (
        f"{len(late)} of the 20 jobs claimed behind the slowed body started {late[0]:.1f} to "
        f"{late[-1]:.1f} s after it, with the worker's other child idle"
    )


def test_max_jobs_runs_as_many_jobs_as_it_says(worker, tmp_path):
    """README: "``--max-jobs N``: exit after claiming and finishing N jobs".

    54 jobs of 94 ready, ``--max-jobs 54``, one child: the claim that reaches 54 takes the
    one body that slowed down (3 s) and the jobs behind it, and the claim loop ends. Once
    the slow body is over, its child reports the jobs behind it unstarted, the worker gives
    two of them back to the queue (their claims undone, so they no longer count), and no
    claim loop is left to take anything in their place: the worker logs "reached
    --max-jobs 54", then "worker stopped ... claimed=52 done=52" and exits 0, with 40
    ready jobs left in the queue (8 of 8 runs). The two jobs stayed ``running`` under its
    lease the whole 3 s, released only as it exited.
    """
    fast, slow, after = tmp_path / "fast", tmp_path / "slow", tmp_path / "after"
    queue = "svc52-max-jobs"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(fast), 0), {}) for _ in range(50)])
    works.using(queue=queue, priority=5).enqueue(str(slow), 3)
    works.using(queue=queue).bulk_enqueue([((str(after), 0), {}) for _ in range(43)])
    w = worker("--concurrency", "1", "--queue", queue, "--max-jobs", "54")
    code = w.wait(timeout=60)
    done = Job.objects.filter(queue=queue, status="done").count()
    stopped = [line[line.index("claimed=") :] for line in w.log().splitlines() if "worker stopped" in line]
    assert (code, done) == (0, 54), f"exit {code}, {done} jobs done of --max-jobs 54: {stopped}"


def test_jobs_given_back_after_a_lost_connection_are_not_failed_unrun(worker, tmp_path):
    """docs/guarantees.md: "A run counted for a job whose body never started is taken back
    where the worker knows it: a job its child gave back unstarted"; the one window where
    a ``max_attempts=1`` job fails without running is a worker killed from outside or
    stopped past its lease.

    A healthy worker (``--lease 3``, one child) loses its finish connection (the server
    ended it: ``pg_terminate_backend``, a failover, an idle timeout) while a body that
    slowed down runs, 20 jobs claimed behind it. When the body ends, its child reports
    them unstarted and the claim loop gives them back, on that connection: "could not give
    back 19 lease(s) ...: AdminShutdown ...; they expire on their own". Nothing tries
    again (the finisher reconnects 0.1 s later for its own rows), nothing heartbeats them:
    3 s later the worker's own claim fails all 19 (of 20) "lease expired on the last run
    (1 of 1): worker ... stopped heartbeating", no body of them having started (6 of 6 runs).
    """
    import psycopg

    from leasejobs.db.connection import connection_params

    fast, slow, after = tmp_path / "fast", tmp_path / "slow", tmp_path / "after"
    queue = "svc52-cut"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(fast), 0), {}) for _ in range(100)])
    long = works.using(queue=queue, priority=5).enqueue(str(slow), 2)
    behind = works.using(queue=queue).bulk_enqueue([((str(after), 0), {}) for _ in range(20)])
    worker("--concurrency", "1", "--queue", queue, "--lease", "3", "--worker-id", "cut52")
    wait_until(lambda: first_lines(slow, "S"), timeout=60, what="the slow body starts")
    with psycopg.connect(**connection_params(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'leasejobs finish cut52'"
        )
    wait_until(lambda: all_final(behind) and all_final([long]), timeout=60, what="every job ends")
    ran = first_lines(after, "S")
    unrun = [job_now(j) for j in behind if (j.id, 1) not in ran and job_now(j).status == "failed"]
    why = sorted({j.last_error.split(":")[0] for j in unrun})
    assert unrun == [], f"{len(unrun)} of the 20 jobs failed without a body having started: {why}"


def test_sigterm_gives_the_jobs_waiting_behind_a_body_back_at_once(worker, tmp_path):
    """docs/guarantees.md: "SIGTERM gives unfinished leases back at once"; ``Worker._drain``:
    "After a stop request, jobs no child has started never start: their leases are given
    back at once (their counted runs refunded), so other workers can take them now."

    Worker a (one child, ``--grace 30``) runs a body that slowed down (6 s), 20 jobs
    claimed behind it; worker b is idle on the same queue. a gets SIGTERM. The STOP a sends
    its child is read only between bodies: the jobs behind stay ``running`` under a's
    lease until the slow body ends, and b starts them only then, 5.5 s after the SIGTERM
    (5 of 5 runs).
    """
    fast, slow, after = tmp_path / "fast", tmp_path / "slow", tmp_path / "after"
    queue = "svc52-term"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(fast), 0), {}) for _ in range(100)])
    long = works.using(queue=queue, priority=5).enqueue(str(slow), 6)
    behind = works.using(queue=queue).bulk_enqueue([((str(after), 0), {}) for _ in range(20)])
    a = worker("--concurrency", "1", "--queue", queue, "--grace", "30", "--worker-id", "a52")
    wait_until(lambda: first_lines(slow, "S"), timeout=60, what="the slow body starts")
    b = worker("--concurrency", "2", "--queue", queue, "--worker-id", "b52")
    b.wait_for_log("worker started", timeout=30)
    time.sleep(0.5)
    a.signal(signal.SIGTERM)
    termed = time.time()
    wait_until(lambda: all_final(behind) and all_final([long]), timeout=60, what="every job ends")
    assert a.wait(timeout=30) == 0
    late = sorted(t - termed for t in first_lines(after, "S").values() if t - termed > 1.5)
    assert late == [], (
        f"{len(late)} of the 20 jobs waiting behind a's slow body started {late[0]:.1f} to "
        f"{late[-1]:.1f} s after a's SIGTERM, with worker b idle"
    )


def test_a_pause_stops_the_jobs_behind_a_slowed_body_from_starting(worker, tmp_path):
    """docs/queue-controls.md: "no body starts more than 1 s after ``pause_queue``", "also
    when the task slows down at the pause (jobs waiting behind a body 40 ms past its
    estimate go to an idle child; with none idle, 0.25 s past it, back to the queue)".

    Two children; the task, measured at a millisecond, slows down to 4 s for one body, with
    jobs claimed behind it, and the queue is paused as that body starts. The child reads
    the rebalance's REVOKE only once the body has ended; it then reports the jobs
    unstarted, and the worker hands the first of them to its other child (the rest go back
    to the queue): 2 bodies of the paused queue started 4.0 s after the pause (6 of 6 runs).
    """
    fast, slow, after = tmp_path / "fast", tmp_path / "slow", tmp_path / "after"
    queue = "svc52-pause"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(fast), 0), {}) for _ in range(300)])
    works.using(queue=queue, priority=5).enqueue(str(slow), 4)
    works.using(queue=queue).bulk_enqueue([((str(after), 0), {}) for _ in range(20)])
    worker("--concurrency", "2", "--queue", queue)
    try:
        wait_until(lambda: first_lines(slow, "S"), timeout=60, what="the slow body starts")
        controls.pause_queue(queue)
        paused = time.time()
        wait_until(lambda: first_lines(slow, "E"), timeout=30, what="the slow body ends")
        time.sleep(2)
    finally:
        controls.resume_queue(queue)
    late = sorted(t - paused for t in first_lines(after, "S").values() if t > paused + 1.0)
    assert late == [], (
        f"{len(late)} bodies of the paused queue started {late[0]:.1f} to {late[-1]:.1f} s after the pause"
    )


def test_a_lower_priority_job_starts_as_the_higher_ones_run_out(worker, tmp_path):
    """docs/performance.md: "What only a front walk finds (a job due before the keys: an
    expired lease, a job another worker gave back, a late commit; a priority the worker
    has not claimed from) waits for it: milliseconds on a healthy database".

    50 jobs of priority 10 and one of priority 0, all ready before the worker starts (one
    child). The claims go on from the key of priority 10, and the one that finds it empty
    claims nothing; the front walk that would find priority 0 is due milliseconds later,
    but nothing wakes the claim loop then: it sleeps its poll interval. The lower-priority
    job started 1.01 s after the last higher one ended, on an idle worker (6 of 6 runs).
    """
    high, low = tmp_path / "high", tmp_path / "low"
    queue = "svc52-priority"
    works.using(queue=queue, priority=10).bulk_enqueue([((str(high), 0), {}) for _ in range(50)])
    last = works.using(queue=queue).enqueue(str(low), 0)
    worker("--concurrency", "1", "--queue", queue)
    wait_until(lambda: all_final([last]), timeout=60, what="the low priority job ends")
    gap = first_lines(low, "S")[(last.id, 1)] - max(first_lines(high, "E").values())
    assert gap < 0.25, f"the lower-priority job started {gap:.2f} s after the last higher one ended"
