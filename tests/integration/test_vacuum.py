"""The worker VACUUMs the job table when dead row versions pile up, and never at a job's cost.

Real worker processes with a threshold of a few hundred dead rows
(``LEASEJOBS_TEST_VACUUM_THRESHOLD``, scale factor 0), against the real
server's statistics: ``pg_stat_get_vacuum_count`` counts manual VACUUMs only
(autovacuum, on for the embedded PostgreSQL 18, has its own count). The
seams: another session holding the table's vacuum lock (SKIP_LOCKED must
not wedge the thread, nor count as a VACUUM), an old snapshot that keeps
the dead rows alive (one VACUUM in vain, not one a second), a killed vacuum
connection, and a role that may not vacuum.
"""

import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from django.core.checks import Error
from django.db import connection
from django.test import override_settings

from leasejobs.checks import check_vacuum
from leasejobs.db.sql import vacuum as vacuum_sql
from leasejobs.models import Job
from leasejobs.worker.events import Events
from leasejobs.worker.vacuum import Vacuumer
from tests.chaos.helpers import SETTINGS
from tests.chaos.tasks import side_effect_only
from tests.helpers import database_url, wait_until
from tests.integration import test_least_privilege
from tests.testapp.tasks import add

worker_role = test_least_privilege.worker_role

#: Dead row versions that make the test workers vacuum (each job leaves two).
THRESHOLD = "200"
VACUUMED = r"INFO leasejobs\.worker vacuumed leasejobs_job worker=\S+: \d+ dead row versions before"


def _stat(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_stat_get_{name}(to_regclass('leasejobs_job'))")
        return int(cursor.fetchone()[0])


def _vacuums() -> int:
    return _stat("vacuum_count")


def _drained(n: int, timeout: float = 60.0) -> None:
    wait_until(lambda: Job.objects.filter(status="done").count() >= n, timeout, what=f"{n} jobs done")


def _dead_reported(n: int) -> None:
    """The statistics show ``n`` dead row versions (an idle backend reports them up to 10 s late)."""
    wait_until(lambda: _stat("dead_tuples") >= n, 30, interval=0.2, what=f"{n} dead rows reported")


def _enqueue(n: int) -> None:
    add.bulk_enqueue([((i, i), {}) for i in range(n)])


@pytest.fixture
def vacuum_env() -> dict[str, str]:
    return {"LEASEJOBS_TEST_VACUUM_THRESHOLD": THRESHOLD}


@pytest.fixture(autouse=True)
def no_autovacuum(transactional_db: None) -> Iterator[None]:
    """Autovacuum (on for the embedded PostgreSQL 18) must not take the dead rows a test counts on."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job SET (autovacuum_enabled = false)")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE leasejobs_job RESET (autovacuum_enabled)")


def test_a_worker_vacuums_once_dead_rows_pile_up_and_they_are_gone(start_worker, vacuum_env):
    before = _vacuums()
    _enqueue(500)
    worker = start_worker("--concurrency", "4", env=vacuum_env)
    _drained(500)
    worker.wait_for_log(VACUUMED, timeout=30)
    assert _vacuums() > before
    # The last of the 1,000 dead versions go at the next VACUUM past the threshold, or stay below it.
    wait_until(lambda: _stat("dead_tuples") <= int(THRESHOLD) + 100, 30, what="dead rows removed")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert "vacuum failed" not in worker.log()


def test_no_vacuum_with_no_vacuum_nor_below_the_threshold(start_worker, vacuum_env):
    """``--no-vacuum`` (the worker above, with it) and a default threshold leave the table to autovacuum."""
    before = _vacuums()
    _enqueue(500)
    off = start_worker("--no-vacuum", env=vacuum_env)
    default = start_worker()  # VACUUM_THRESHOLD 50,000: far away
    _drained(500)
    _dead_reported(2 * int(THRESHOLD))  # claims are HOT: pruning in passing takes some back
    time.sleep(3)  # three looks of the vacuum thread
    for worker in (off, default):
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert worker.count(r"vacuumed|vacuum failed|does not vacuum") == 0, worker.log()
    assert _vacuums() == before


@pytest.fixture
def vacuum_lock_held(transactional_db: None) -> Iterator[psycopg.Connection]:
    """Another session holds the lock every VACUUM takes (SHARE UPDATE EXCLUSIVE), as a VACUUM would."""
    with psycopg.connect(database_url()) as other:
        other.execute("LOCK TABLE leasejobs_job IN SHARE UPDATE EXCLUSIVE MODE")
        yield other


def test_a_vacuum_lock_held_elsewhere_is_skipped_not_waited_for(start_worker, vacuum_env, vacuum_lock_held):
    before = _vacuums()
    _enqueue(500)
    worker = start_worker(env={**vacuum_env, "LEASEJOBS_LOG_LEVEL": "DEBUG"})
    _drained(500)  # claims and finishes never wait for the vacuum lock
    worker.wait_for_log(r"DEBUG leasejobs\.worker vacuum skipped worker=", timeout=30)
    assert worker.count(VACUUMED) == 0, worker.log()  # a skipped VACUUM is not one
    assert _vacuums() == before
    vacuum_lock_held.rollback()  # the VACUUM that was due runs at the next try (5 s), no new dead rows needed
    worker.wait_for_log(VACUUMED, timeout=20)
    assert _vacuums() > before


@pytest.fixture
def old_snapshot(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A REPEATABLE READ transaction whose snapshot keeps every row version made after it."""
    with psycopg.connect(database_url()) as reader:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM leasejobs_job")
        yield reader


def test_dead_rows_an_old_snapshot_still_sees_get_one_vacuum_not_one_a_second(
    start_worker, vacuum_env, old_snapshot
):
    """A VACUUM cannot remove what an open transaction may still read; trying again each second is waste."""
    before = _vacuums()
    _enqueue(500)
    drainer = start_worker("--no-vacuum", "--burst")
    assert drainer.wait(timeout=60) == 0
    _dead_reported(1000)  # all reported before the vacuuming worker looks: no late count to come
    worker = start_worker(env=vacuum_env)
    worker.wait_for_log(VACUUMED, timeout=30)
    time.sleep(4)
    assert _vacuums() - before == 1, worker.log()
    assert _stat("dead_tuples") >= 1000  # all of them are still there
    old_snapshot.rollback()
    # Past the threshold counted from what was left: each finish leaves a dead version only
    # a VACUUM removes (a HOT claim's may be pruned in passing, and uncounted): 500 at least.
    _enqueue(500)
    wait_until(lambda: _vacuums() - before == 2, 40, what="a second VACUUM, 15 s after one in vain")
    wait_until(lambda: _stat("dead_tuples") <= int(THRESHOLD) + 100, 30, what="dead rows removed")


def test_a_vacuum_in_vain_under_load_is_followed_by_none_for_15_s(start_worker, vacuum_env, old_snapshot):
    """New dead rows past the threshold every second, none removable: one VACUUM, then it waits."""
    worker = start_worker(env=vacuum_env)
    worker.wait_for_log(r"worker started", timeout=60)  # a loaded machine takes seconds to start one
    began = _vacuums()
    _enqueue(200)  # 400 dead versions once drained, twice the threshold
    wait_until(lambda: _vacuums() > began, 40, what="the first VACUUM (in vain)")
    first = time.monotonic()
    for _ in range(5):
        _enqueue(200)  # 400 dead versions a second
        time.sleep(1)
    _drained(1200)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert time.monotonic() - first < 15, "too slow to tell: the 15 s of backoff are over"
    assert _vacuums() - began == 1, worker.log()
    assert worker.count(VACUUMED) == 1, worker.log()


def test_an_xid_of_another_database_ending_brings_no_vacuum_forward(start_worker, vacuum_env, old_snapshot):
    """Another database's transaction does not hold this table's rows: when it ends, the
    snapshot that kept the VACUUM in vain still holds, and the back-off stands (seen in CI:
    the cluster's oldest xid, another test's, ended and a second VACUUM came 4 s after the
    first, in vain)."""
    with psycopg.connect(database_url(), dbname="postgres") as elsewhere:
        elsewhere.execute("SELECT txid_current()")  # older than any xid of this test's database
        worker = start_worker(env=vacuum_env)
        worker.wait_for_log(r"worker started", timeout=60)
        time.sleep(2.5)  # two looks: the xid is held a second at least
        began = _vacuums()
        _enqueue(500)
        _drained(500)
        wait_until(lambda: _vacuums() > began, 40, what="the first VACUUM (in vain)")
        first = time.monotonic()
        elsewhere.rollback()
    _enqueue(500)  # due again at once, were the back-off cut short
    _drained(1000)
    time.sleep(max(0.0, first + 6 - time.monotonic()))
    assert time.monotonic() - first < 15, "too slow to tell: the 15 s of backoff are over"
    assert _vacuums() - began == 1, worker.log()


@pytest.fixture
def held_xid(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A transaction that holds an xid and sits idle: it keeps every row version that dies after it."""
    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT txid_current()")
        yield holder


def test_rows_a_held_xid_kept_are_vacuumed_as_soon_as_it_ends(start_worker, vacuum_env, held_xid):
    """A transaction idle with its xid keeps a VACUUM in vain; the worker then waits exactly
    as long as that transaction runs (the oldest running xid, which any role may read), and
    VACUUMs at its next look after it ends, not after the 15 s back-off."""
    worker = start_worker(env=vacuum_env)
    worker.wait_for_log(r"worker started", timeout=60)
    time.sleep(2.5)  # two looks: the held xid is the oldest running one for a second at least
    before = _vacuums()
    _enqueue(500)
    _drained(500)
    wait_until(lambda: _vacuums() > before, 40, what="the first VACUUM (in vain)")
    time.sleep(2)
    assert _vacuums() == before + 1, worker.log()
    assert _stat("dead_tuples") >= 400  # the held xid kept them
    held_xid.rollback()
    ended = time.monotonic()
    wait_until(lambda: _vacuums() > before + 1, 20, what="a VACUUM after the xid's transaction ended")
    assert time.monotonic() - ended < 8, "waited for the back-off, not for the transaction"
    wait_until(lambda: _stat("dead_tuples") <= int(THRESHOLD), 10, what="dead rows removed")


def test_two_workers_vacuum_in_vain_once_between_them(start_worker, old_snapshot):
    """The second worker's look sees the first one's VACUUM end, and counts from what it left."""
    a, b = (
        Vacuumer(f"test-{name}", Events(f"test-{name}"), threshold=200, scale_factor=0.0, pooled=False)
        for name in "ab"
    )
    try:
        assert a.check() and b.check()  # both have looked: nothing due
        _enqueue(500)
        drainer = start_worker("--no-vacuum", "--burst")
        assert drainer.wait(timeout=60) == 0
        _dead_reported(2 * int(THRESHOLD))  # claims are HOT: pruning in passing takes some back
        before = _vacuums()
        assert a.check()  # due: a VACUUM in vain (the snapshot holds every row)
        assert _vacuums() == before + 1
        assert b.check()  # the VACUUM count moved: what it left is b's floor, nothing is due
        assert _vacuums() == before + 1
    finally:
        a.close()
        b.close()


def test_a_stopping_worker_cancels_its_vacuum(transactional_db, monkeypatch):
    """A VACUUM must not outlive its worker: a deploy's migrate would wait for it."""
    monkeypatch.setattr(vacuum_sql, "VACUUM", "SELECT pg_sleep(60)")  # a VACUUM that takes a minute
    vacuumer = Vacuumer("test-stop", Events("test-stop"), threshold=0, scale_factor=0.0, pooled=False)
    _enqueue(10)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM leasejobs_job")  # dead rows: the VACUUM is due at the first look
    _dead_reported(10)
    thread = threading.Thread(target=vacuumer.run)
    thread.start()
    try:
        wait_until(lambda: _active("leasejobs vacuum test-stop"), 20, what="the VACUUM running")
        began = time.monotonic()
        vacuumer.stop()
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert time.monotonic() - began < 2
        wait_until(lambda: not _active("leasejobs vacuum test-stop"), 5, what="the VACUUM cancelled")
    finally:
        vacuumer.stop()
        thread.join(timeout=5)


def _active(application_name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'",
            [application_name],
        )
        return bool(cursor.fetchone()[0])


def test_a_killed_vacuum_connection_is_a_warning_and_the_worker_goes_on(start_worker, vacuum_env):
    _enqueue(500)
    worker = start_worker(env=vacuum_env)
    worker.wait_for_log(VACUUMED, timeout=60)
    worker_id = worker.log().split("worker started worker=")[1].split()[0]
    with psycopg.connect(database_url(), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [f"leasejobs vacuum {worker_id}"[:63]],
        ).fetchall()
    assert killed == [(True,)]
    worker.wait_for_log(
        r"WARNING leasejobs\.worker vacuum thread cannot read the job table's statistics worker=\S+: \w+",
        timeout=10,
    )
    vacuums = worker.count(VACUUMED)
    _enqueue(500)
    _drained(1000)
    wait_until(lambda: worker.count(VACUUMED) > vacuums, 30, what="a VACUUM on the new connection")
    assert worker.proc.poll() is None


def test_a_role_that_may_not_vacuum_says_so_once_and_runs_its_jobs(start_worker, worker_role, vacuum_env):
    before = _vacuums()
    jobs = side_effect_only.bulk_enqueue([((f"no-vacuum:{i}",), {}) for i in range(300)])
    worker = start_worker(env={**vacuum_env, "DATABASE_URL": worker_role, "DJANGO_SETTINGS_MODULE": SETTINGS})
    _drained(len(jobs))
    worker.wait_for_log(r"INFO leasejobs\.worker this worker does not vacuum leasejobs_job", timeout=20)
    _enqueue(300)
    _drained(len(jobs) + 300)
    time.sleep(2)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert worker.count("does not vacuum") == 1, worker.log()
    assert worker.count(r"vacuumed|vacuum failed|permission denied") == 0, worker.log()
    assert _vacuums() == before


@pytest.mark.parametrize(
    ("threshold", "scale", "wrong"),
    [
        ("many", 0.1, "VACUUM_THRESHOLD"),
        (-1, 0.1, "VACUUM_THRESHOLD"),
        (1.5, 0.1, "VACUUM_THRESHOLD"),
        (True, 0.1, "VACUUM_THRESHOLD"),
        (1000, "0.1", "VACUUM_SCALE_FACTOR"),
        (1000, -0.5, "VACUUM_SCALE_FACTOR"),
        (1000, float("nan"), "VACUUM_SCALE_FACTOR"),
        (1000, float("inf"), "VACUUM_SCALE_FACTOR"),
    ],
)
def test_bad_thresholds_are_one_clear_error(threshold, scale, wrong):
    with override_settings(LEASEJOBS={"VACUUM_THRESHOLD": threshold, "VACUUM_SCALE_FACTOR": scale}):
        found = check_vacuum()
    assert [(e.id, wrong in e.msg) for e in found] == [("leasejobs.E004", True)]
    assert all(isinstance(e, Error) for e in found)


@pytest.mark.parametrize(("threshold", "scale"), [(None, 0.1), (0, 0), (50_000, 0.2)])
def test_good_thresholds_pass(threshold, scale):
    with override_settings(LEASEJOBS={"VACUUM_THRESHOLD": threshold, "VACUUM_SCALE_FACTOR": scale}):
        assert check_vacuum() == []


@pytest.fixture
def database_statement_timeout(transactional_db: None) -> Iterator[None]:
    """New sessions of the test database get a statement_timeout of 50 ms (as a DBA might set)."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET statement_timeout = 50')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET statement_timeout')


def test_a_statement_timeout_of_the_database_does_not_cut_the_vacuum(
    database_statement_timeout, monkeypatch, caplog
):
    monkeypatch.setattr(vacuum_sql, "VACUUM", "SELECT pg_sleep(0.3)")  # a VACUUM longer than the timeout
    vacuumer = Vacuumer("test-timeout", Events("test-timeout"), threshold=0, scale_factor=0.0, pooled=False)
    _enqueue(10)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM leasejobs_job")
    _dead_reported(10)
    try:
        with caplog.at_level("INFO", logger="leasejobs.worker"):
            assert vacuumer.check()
        lines = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "leasejobs.worker"]
        assert lines == ["vacuumed leasejobs_job worker=test-timeout"]
    finally:
        vacuumer.close()
