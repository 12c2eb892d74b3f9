"""A hostile review of a89d0e3..c974d3c (kept outcomes, the claimer's sends, claims in the
listener's thread, $n placeholders), with real processes. Its first three tests broke the
kept outcomes: a body kept as done, with a long body after it in the same child, was
reported only once that body ended (fixed: the pool thread reads the children's slots).

House style of tests/integration/test_hostile_review.py: real ``runworker`` processes
(settings ``tests.hostile_settings``), every wait bounded, every process stopped.
"""

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import transaction

from leasejobs.jobs import registry
from leasejobs.models import Job
from tests import hostile_tasks
from tests.helpers import WorkerProcess, wait_until
from tests.hostile_tasks import quiet, step
from tests.journal import read as read_journal

registry.found_by_workers(*(v for v in vars(hostile_tasks).values() if isinstance(v, registry.Task)))

SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.hostile_settings"}


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    def start(*args: str) -> WorkerProcess:
        return start_worker(*args, env=SETTINGS)

    return start


def _settled(ids: list[int]) -> bool:
    return not Job.objects.filter(id__in=ids, status__in=["queued", "running"]).exists()


def _warm_up(n: int = 40) -> None:
    """Quick bodies first, so the worker has measured ``quiet`` and queues several per child."""
    ids = [j.id for j in quiet.bulk_enqueue([((i,), {}) for i in range(n)])]
    wait_until(lambda: _settled(ids), timeout=60, what="the warm-up jobs end")


# -- 1. a kept outcome waits for the whole next body ----------------------------------------


def test_a_quick_done_body_is_reported_before_a_long_neighbour_ends(worker, tmp_path):
    """a89d0e3: a body that returned None is kept in the slot, and "the child sends what it
    keeps ... at least every REPORT_LINGER_SECONDS while it works through its jobs".

    But the only send points are before a body (and only when something is *unkept*) and
    after a body (only when 1 ms passed since the last look). A quick ``quiet`` body that
    ends within 1 ms of the previous look, followed in the same child by a long body, stays
    unsent for the *whole* long body: its job stays ``running`` (lease held, dependants
    waiting) for seconds after its body returned. Before a89d0e3 it was sent before the
    long body started.
    """
    path = tmp_path / "journal"
    worker("--concurrency", "1")
    _warm_up()
    with transaction.atomic():
        quick_ones = quiet.bulk_enqueue([((i,), {}) for i in range(6)])
        (slow,) = step.bulk_enqueue([((str(path), 6.0), {})])
    wait_until(lambda: read_journal(path)[0], timeout=20, what="the long body starts")
    started = time.monotonic()
    ids = [j.id for j in quick_ones]
    try:
        wait_until(lambda: _settled(ids), timeout=2.0, what="the quick jobs done while the long body runs")
    except AssertionError:
        waiting = Job.objects.filter(id__in=ids).exclude(status="done").count()
        wait_until(lambda: _settled([*ids, slow.id]), timeout=30, what="every job ends")
        pytest.fail(
            f"{waiting} quick job(s) whose bodies had returned stayed unreported for "
            f"{time.monotonic() - started:.1f}s+, until the 6 s body beside them ended"
        )


def test_a_done_body_kept_unsent_is_not_run_again_when_its_lease_runs_out(worker, tmp_path):
    """The same withheld report, with ``--no-heartbeat`` (documented: a lease then simply runs
    out after ``--lease``): the quick jobs' bodies returned at once, but their reports wait
    for the 6 s body beside them, their 2 s leases run out meanwhile, and a second worker's
    claim takes them again: a body that returned None is run twice (or, at max_attempts=1,
    ended *failed* for a lease that expired after its body was done)."""
    path = tmp_path / "journal"
    worker("--concurrency", "1", "--no-heartbeat", "--lease", "2")
    _warm_up()
    with transaction.atomic():
        quick_ones = quiet.bulk_enqueue([((i,), {}) for i in range(6)])
        (slow,) = step.bulk_enqueue([((str(path), 6.0), {})])
    wait_until(lambda: read_journal(path)[0], timeout=20, what="the long body starts")
    worker("--concurrency", "1", "--lease", "30")  # another worker, free to claim
    ids = [j.id for j in quick_ones]
    wait_until(lambda: _settled([*ids, slow.id]), timeout=40, interval=0.2, what="every job ends")
    bad = {
        j.id: (j.status, j.attempt, j.last_error)
        for j in Job.objects.filter(id__in=ids)
        if j.status != "done"
    }
    assert not bad, f"quick bodies that returned None, not done: {bad}"


def test_a_worker_killed_from_outside_costs_no_finished_job_an_attempt(worker, tmp_path):
    """docs/guarantees.md: "A worker killed from outside costs the jobs its children held
    *unstarted* one attempt" (at most 20 ms of each child's work). The quick bodies here
    returned None a whole second before the kill; their outcomes sat unsent in the child
    (kept in the slot, which nobody reads once the worker is gone) behind the long body, so
    the kill costs them their only attempt: they fail "lease expired on the last run"."""
    import signal

    path = tmp_path / "journal"
    first = worker("--concurrency", "1", "--lease", "3")
    _warm_up()
    with transaction.atomic():
        quick_ones = quiet.bulk_enqueue([((i,), {}) for i in range(6)])
        (_slow,) = step.bulk_enqueue([((str(path), 6.0), {})])
    wait_until(lambda: read_journal(path)[0], timeout=20, what="the long body starts")
    time.sleep(1.0)
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    worker("--concurrency", "1", "--lease", "30")
    ids = [j.id for j in quick_ones]
    wait_until(lambda: _settled(ids), timeout=40, interval=0.2, what="the quick jobs end")
    bad = {j.id: (j.status, j.last_error) for j in Job.objects.filter(id__in=ids) if j.status != "done"}
    assert not bad, f"bodies that returned None a second before the kill, not done: {bad}"


# -- 3. claims in the listener's thread ---------------------------------------------------------


def _terminate_listeners(worker_id: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
            [f"leasejobs listen {worker_id}"],
        )
        return cursor.fetchone()[0]


def _trickle(
    path: Path, count: int, pause: float, between: Callable[[int], None] = lambda i: None
) -> list[int]:
    """``count`` jobs, each enqueued (and NOTIFYed) on its own; ``between`` runs after each."""
    ids = []
    for i in range(count):
        ids.append(step.enqueue(str(path), 0.0).id)
        between(i)
        time.sleep(pause)
    return ids


def _ran_once(path: Path, ids: list[int]) -> None:
    starts, _ends, _ = read_journal(path)
    runs: dict[int, list[int]] = {}
    for job_id, attempt in starts:
        runs.setdefault(job_id, []).append(attempt)
    twice = {j: a for j, a in runs.items() if len(a) > 1 or a != [1]}
    assert not twice, f"bodies run more than once (or past attempt 1): {twice}"
    missing = set(ids) - set(runs)
    assert not missing, f"{len(missing)} jobs never ran: {sorted(missing)[:10]}"


def test_the_listen_connection_killed_during_its_claims_loses_no_job(worker, tmp_path):
    """pg_terminate_backend on the listen connection while each NOTIFY is claimed on it:
    the worker lives, every job runs exactly once, and the listener comes back."""
    path = tmp_path / "journal"
    w = worker("--concurrency", "2", "--worker-id", "review-listen-kill")
    w.wait_for_log("worker started")
    killed = []

    def kill_some(i: int) -> None:
        if i % 3 == 0:
            killed.append(_terminate_listeners("review-listen-kill"))

    ids = _trickle(path, 150, 0.01, kill_some)
    wait_until(lambda: _settled(ids), timeout=60, interval=0.2, what="every job ends")
    assert w.proc.poll() is None, f"the worker died: {w.log()[-2000:]}"
    _ran_once(path, ids)
    assert sum(killed), "no listen connection was ever killed"
    # And it listens again: a job enqueued now starts long before the poll would find it.
    time.sleep(2.5)
    t0 = time.time()
    (last,) = _trickle(path, 1, 0)
    wait_until(
        lambda: read_journal(path)[0].get((last, 1)), timeout=10, interval=0.01, what="the last job starts"
    )
    assert read_journal(path)[0][(last, 1)] - t0 < 0.5


def test_a_stop_during_a_notify_flood_settles_every_job_once(worker, tmp_path):
    """SIGTERM lands while the listener's thread claims for a stream of NOTIFYs: the worker
    exits 0 within its grace, no job is left running, none runs twice."""
    path = tmp_path / "journal"
    w = worker("--concurrency", "2", "--grace", "5")
    w.wait_for_log("worker started")
    import signal as _signal

    ids = _trickle(path, 120, 0.002, lambda i: w.signal(_signal.SIGTERM) if i == 60 else None)
    assert w.wait(timeout=30) == 0, w.log()[-3000:]
    running = Job.objects.filter(id__in=ids, status="running").count()
    assert running == 0, f"{running} jobs left running (leases held) by a worker that stopped cleanly"
    starts, _, _ = read_journal(path)
    twice = [k for k in starts if k[1] != 1]
    assert not twice, twice


def test_the_listen_connection_killed_while_its_claim_waits_loses_no_job(worker, tmp_path):
    """The claim in the listener's thread is held on a lock of ``leasejobs_queue`` (which
    every CLAIM reads), and its connection is terminated right there: the job still runs,
    once, and the worker lives. (Held. Its precondition, a claim on the listen connection,
    exists only from b570e8c on: before it, the wait for the lock times out.)"""
    import psycopg
    from django.db import connection

    from leasejobs.db.connection import connection_params

    path = tmp_path / "journal"
    w = worker("--concurrency", "2", "--worker-id", "review-listen-wait")
    w.wait_for_log("worker started")
    time.sleep(1.5)
    with psycopg.connect(**connection_params()) as holder:
        holder.execute("LOCK TABLE leasejobs_queue IN ACCESS EXCLUSIVE MODE")
        job_id = step.enqueue(str(path), 0.0).id

        def waiting() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = %s AND wait_event_type = 'Lock'",
                    ["leasejobs listen review-listen-wait"],
                )
                return cursor.fetchone()[0] > 0

        wait_until(waiting, timeout=4, interval=0.02, what="the listener's claim waits on the lock")
        assert _terminate_listeners("review-listen-wait") == 1
        time.sleep(0.3)
        holder.rollback()
    wait_until(lambda: _settled([job_id]), timeout=20, interval=0.1, what="the job ends")
    assert w.proc.poll() is None, w.log()[-2000:]
    _ran_once(path, [job_id])
    assert Job.objects.get(id=job_id).status == "done"


# -- 4. $n placeholders -----------------------------------------------------------------------


def test_every_statement_converts_as_psycopg_itself_would():
    """c974d3c: ``positional`` against psycopg's own split of ``%(name)s`` placeholders, for
    every statement in ``leasejobs.db.sql`` (names used twice, ``%%``, casts): the same text
    and the same parameter order. (Held: no difference found.)"""
    import importlib
    import pkgutil

    from psycopg._queries import _split_query

    import leasejobs.db.sql as package
    from leasejobs.db.connection import positional

    checked, differ = 0, []
    for module in pkgutil.iter_modules(package.__path__):
        found = vars(importlib.import_module(f"leasejobs.db.sql.{module.name}"))
        for name, query in found.items():
            if not isinstance(query, str) or "%(" not in query:
                continue
            parts = _split_query(query.encode(), "utf-8")
            numbers: dict[str, int] = {}
            chunks = []
            for part in parts[:-1]:
                chunks.append(part.pre.decode())
                chunks.append(f"${numbers.setdefault(part.item, len(numbers) + 1)}")
            chunks.append(parts[-1].pre.decode())
            checked += 1
            if positional(query) != ("".join(chunks), tuple(numbers)):
                differ.append(f"{module.name}.{name}")
    assert checked > 50
    assert not differ, differ
