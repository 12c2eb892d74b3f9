"""The worker's statements at their seams, on real PostgreSQL, without a worker process.

Each test drives ``leasejobs.db.store.WorkerStore`` the way the worker does and
checks the rows: the fencing rule (attempt AND holder), two attempts of one
job in one finish batch, the claim's run counting and synchronous commit.
"""

import threading
import time

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import JSONField, Value
from django.db.models.functions import Now
from psycopg.types.json import Jsonb

from leasejobs.db import sql
from leasejobs.db.connection import WorkerConnection, connection_params
from leasejobs.db.store import Attempt, Outcome, WorkerStore, array_literal, claim_params
from leasejobs.models import Job
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store():
    stores: list[WorkerStore] = []

    def make(worker_id: str) -> WorkerStore:
        s = WorkerStore(worker_id, heartbeat_timeout=5)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def claim(s: WorkerStore, limit: int = 10, counted: int = 10):
    return s.claim(limit=limit, counted=counted, queues=None, lease_seconds=30, task_leases={})


def test_a_claim_counts_the_runs_of_the_first_rows_it_is_told_to(store):
    """A worker counts every row it claims (each goes to a child at once); the statement can count fewer."""
    jobs = [record.enqueue(i) for i in range(5)]
    rows = claim(store("w"), limit=5, counted=2)
    assert [r.id for r in rows] == [j.id for j in jobs]
    assert [r.counted for r in rows] == [True, True, False, False, False]
    assert [Job.objects.get(id=j.id).runs for j in jobs] == [1, 1, 0, 0, 0]


def test_a_finish_counts_the_run_of_a_buffered_job_and_a_release_refunds_an_unstarted_one(store):
    a, b = record.enqueue(1), record.enqueue(2)
    s = store("w")
    rows = claim(s, counted=1)  # a counted at the claim, b buffered
    s.finish([(Attempt(rows[1].id, rows[1].attempt), Outcome(status="done"), True)])
    s.release([(Attempt(rows[0].id, rows[0].attempt), True)])  # a never started
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.status, a.runs, b.status, b.runs) == ("queued", 0, "done", 1)


def test_a_release_of_an_unstarted_job_undoes_its_claim_and_fences_its_holder_off(store):
    """The attempt, the run and the holder are taken back; the old holder's
    writes with the token it was given match nothing, and the next claim issues it again."""
    job = record.enqueue(1)
    first = claim(store("a"))[0]
    assert first.attempt == 1
    Job.objects.filter(id=job.id).update(lease_until="2000-01-01T00:00:00Z")  # a was paused
    b = store("b")
    taken = claim(b)[0]
    assert taken.attempt == 2
    assert b.release([(Attempt(job.id, 2), True)]) == {Attempt(job.id, 2)}  # b never started it
    job.refresh_from_db()
    assert (job.status, job.attempt, job.runs, job.attempt_workers) == ("queued", 1, 1, ["a"])
    a = store("a")
    stale = Attempt(job.id, 1)
    assert [(r.held, r.renewed) for r in a.heartbeat([(stale, 30.0)])] == [(False, False)]
    assert a.finish([(stale, Outcome(status="done"), False)]) == []
    assert claim(store("c"))[0].attempt == 2
    job.refresh_from_db()
    assert (job.status, job.leased_by, job.attempt_workers) == ("running", "c", ["a", "c"])


def test_a_job_claimed_once_records_its_worker_once_and_every_claim_stays_on_record(store):
    """``leased_by`` holds the latest claim's worker and ``worker_ids`` only the ones
    before it (one copy of a worker id per row version: the WAL of a job); a re-claim
    moves the holder it replaces onto ``worker_ids``, and a row written in the old
    form (every claim's worker, the latest included) reads and continues the same."""
    once, twice, old = record.enqueue(1), record.enqueue(2), record.enqueue(3)
    Job.objects.filter(id=old.id).update(attempt=1, status="running", leased_by="a", worker_ids=["a"])
    rows = claim(store("a"))
    store("a").finish([(Attempt(once.id, 1), Outcome(status="done"), True)])
    assert {r.id for r in rows} == {once.id, twice.id}
    Job.objects.filter(id__in=[twice.id, old.id]).update(lease_until="2000-01-01T00:00:00Z")  # a was paused
    assert {r.id: r.attempt for r in claim(store("b"))} == {twice.id: 2, old.id: 2}
    stored = {j.id: (j.leased_by, j.worker_ids, j.attempt_workers) for j in Job.objects.all()}
    assert stored == {
        once.id: ("a", [], ["a"]),
        twice.id: ("b", ["a"], ["a", "b"]),
        old.id: ("b", ["a"], ["a", "b"]),
    }


@pytest.mark.parametrize(
    "hand_written", [{"hand": "written"}, None, "w"], ids=["object", "json null", "string"]
)
def test_a_hand_written_non_array_worker_ids_neither_blocks_the_claim_nor_loses_the_holder(
    store, hand_written
):
    """Any JSON may be in the column (SQL, another producer): a re-claim of such a row
    reads it as no earlier workers, and the whole claim statement does not fail on it."""
    bad, good = record.enqueue(1), record.enqueue(2)
    Job.objects.filter(pk=bad.pk).update(
        attempt=1, runs=1, status="running", leased_by="a", worker_ids=Value(hand_written, JSONField())
    )
    Job.objects.filter(pk=bad.pk).update(lease_until="2000-01-01T00:00:00Z")  # a was paused
    assert {r.id for r in claim(store("b"))} == {bad.id, good.id}
    assert Job.objects.get(pk=bad.pk).leased_by == "b"


def test_every_claim_stays_on_record_through_retries_releases_takeovers_refunds_and_ends(store):
    """One worker per claim, whatever moved the job between claims."""

    def workers() -> list[str]:
        job = Job.objects.get(pk=j.pk)
        assert len(job.attempt_workers) == job.attempt, (job.attempt, job.leased_by, job.worker_ids)
        return job.attempt_workers

    def expire() -> None:
        Job.objects.filter(pk=j.pk).update(lease_until="2000-01-01T00:00:00Z")

    j = record.enqueue(1)
    a, b, c = store("a"), store("b"), store("c")
    claim(a)
    a.finish([(Attempt(j.id, 1), Outcome(status="queued", retry_delay=0, snoozed=True), True)])  # snoozed
    claim(b)
    assert workers() == ["a", "b"]
    with connection.cursor() as cursor:  # released from the admin
        cursor.execute(sql.ADMIN_RELEASE, {"ids": [j.id], "attempts": [2], "channel": "leasejobs"})
    claim(c)
    assert workers() == ["a", "b", "c"]
    expire()
    claim(a)  # taken over
    assert workers() == ["a", "b", "c", "a"]
    assert a.release([(Attempt(j.id, 4), True)]) == {Attempt(j.id, 4)}  # given back unstarted
    assert workers() == ["a", "b", "c"]
    assert Job.objects.get(pk=j.pk).leased_by == "c"
    claim(b)
    Job.objects.filter(pk=j.pk).update(max_attempts=1)
    expire()
    claim(c)  # the claim ends it: its runs are used up
    assert (Job.objects.get(pk=j.pk).status, workers()) == ("failed", ["a", "b", "c", "b"])
    with connection.cursor() as cursor:
        cursor.execute(
            sql.ADMIN_RETRY, {"ids": [j.id], "statuses": ["failed"], "attempts": [4], "channel": "leasejobs"}
        )
    claim(c)
    assert workers() == ["a", "b", "c", "b", "c"]


def test_a_release_waits_out_a_lock_another_claim_holds_for_a_moment(store):
    """Another worker's claim may hold a row it walked past until it commits; a give-back
    that skipped it would leave the job's lease (and run) to run out."""
    job = record.enqueue(1)
    s = store("w")
    row = claim(s)[0]
    with psycopg.connect(**connection_params()) as other:
        other.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [job.id])
        unlock = threading.Timer(0.05, other.rollback)
        unlock.start()
        released = s.release([(Attempt(row.id, row.attempt), True)])
        unlock.join()
    assert released == {Attempt(job.id, 1)}
    job.refresh_from_db()
    assert (job.status, job.attempt, job.runs) == ("queued", 0, 0)


def test_a_job_whose_last_run_was_given_back_counted_ends_at_the_next_claim(store):
    """A body stopped at the end of a stop's grace (or a lease released from the admin)
    gives the lease back with its run counted; with its runs used up, the job must not
    start another body."""
    job = record.enqueue(1)
    Job.objects.filter(id=job.id).update(max_attempts=1)
    s = store("w")
    row = claim(s)[0]
    s.release([(Attempt(row.id, row.attempt), False)])  # its body ran: the run stays counted
    job.refresh_from_db()
    assert (job.status, job.runs) == ("queued", 1)
    assert [(r.id, r.ended) for r in claim(store("x"))] == [(job.id, "failed")]
    job.refresh_from_db()
    assert job.status == "failed" and "given back unfinished by worker w" in job.last_error, job.last_error


def test_two_attempts_of_one_job_in_one_finish_batch_write_only_the_current_one(store):
    job = record.enqueue(1)
    s = store("w")
    first = claim(s)[0]
    Job.objects.filter(id=job.id).update(lease_until="2000-01-01T00:00:00Z")  # its lease ran out
    second = claim(s)[0]  # the same worker re-claims it
    assert (first.attempt, second.attempt) == (1, 2)
    rows = s.finish(
        [
            (Attempt(job.id, 1), Outcome(status="done", result='"stale"'), True),
            (Attempt(job.id, 2), Outcome(status="done", result='"current"'), False),
        ]
    )
    assert [(r.attempt, r.written) for r in rows] == [(2, True)]
    job.refresh_from_db()
    assert (job.status, job.result, job.attempt) == ("done", "current", 2)


def test_a_cancel_pending_on_a_job_given_back_ends_it_without_blaming_a_live_worker(store):
    """A cancel asked for while the job ran, then the lease given back unstarted (a stop's
    refund): the next claim ends it cancelled, and says so without naming a worker that
    stopped (worker a is alive, and after the refund the row names no holder at all)."""
    job = record.enqueue(1)
    a, b = store("a"), store("b")
    row = claim(a)[0]
    Job.objects.filter(id=job.id).update(cancel_requested=True)
    assert a.release([(Attempt(row.id, row.attempt), True)]) == {Attempt(row.id, row.attempt)}
    ended = claim(b)
    assert [(r.id, r.ended) for r in ended] == [(job.id, "cancelled")]
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert job.last_error == (
        "cancelled: the cancel asked for while it ran took effect once it was given back unfinished"
    )


def test_a_cancel_pending_on_a_job_whose_lease_ran_out_names_the_lease_not_a_stop(store):
    """The worker may be alive (its release skipped a locked row): the message says what is
    known, that its lease ran out."""
    job = record.enqueue(1)
    claim(store("a"))
    Job.objects.filter(id=job.id).update(cancel_requested=True, lease_until="2000-01-01T00:00:00Z")
    assert [(r.id, r.ended) for r in claim(store("b"))] == [(job.id, "cancelled")]
    job.refresh_from_db()
    assert (job.status, job.last_error) == (
        "cancelled",
        "cancelled: the lease of worker a ran out before the job ended",
    )


def test_every_fenced_write_also_matches_the_holder(store):
    """A lost claim commit re-made by another worker with the same token: nothing of ours passes."""
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    Job.objects.filter(id=job.id).update(leased_by="b")  # b holds the same attempt now
    key = Attempt(row.id, row.attempt)
    beat = s.heartbeat([(key, 30.0)])
    assert [(b.held, b.renewed) for b in beat] == [(False, False)]
    assert s.finish([(key, Outcome(status="done"), False)]) == []
    assert s.release([(key, False)]) == set()
    job.refresh_from_db()
    assert (job.status, job.leased_by, job.attempt) == ("running", "b", 1)


def _lock_row(job_id: int) -> psycopg.Connection:
    """Another transaction holding the job row locked (as a body's side-effect block does)."""
    conn = psycopg.connect(**connection_params())
    conn.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR SHARE", [job_id])
    return conn


def test_one_heartbeat_tells_renewed_locked_and_lost_rows_apart(store):
    """Each held row gets its own answer, the locked and the lost ones among many renewed."""
    jobs = [record.enqueue(i) for i in range(6)]
    s = store("a")
    rows = claim(s)
    keys = [Attempt(r.id, r.attempt) for r in rows]
    assert set(Job.objects.values_list("heartbeat_at", flat=True)) == {None}  # none yet: see started_at
    Job.objects.filter(id=jobs[4].id).update(leased_by="b")  # lost: another worker holds it
    Job.objects.filter(id=jobs[2].id).update(cancel_requested=True)
    locker = _lock_row(jobs[1].id)
    try:
        beat = {b.id: (b.renewed, b.held, b.cancel_requested) for b in s.heartbeat([(k, 30.0) for k in keys])}
    finally:
        locker.close()
    assert beat == {
        jobs[0].id: (True, True, False),
        jobs[1].id: (False, True, False),
        jobs[2].id: (True, True, True),
        jobs[3].id: (True, True, False),
        jobs[4].id: (False, False, False),
        jobs[5].id: (True, True, False),
    }
    beaten = {j.id: j.heartbeat_at is not None for j in Job.objects.all()}
    assert beaten == {j.id: j.id not in (jobs[1].id, jobs[4].id) for j in jobs}


def test_one_finish_tells_written_locked_and_stale_rows_apart(store):
    """Only written rows and rows still ours but locked come back; a stale attempt's row does not."""
    jobs = [record.enqueue(i) for i in range(5)]
    s = store("a")
    rows = claim(s)
    batch = [(Attempt(r.id, r.attempt), Outcome(status="done"), False) for r in rows]
    batch[3] = (Attempt(rows[3].id, rows[3].attempt + 1), Outcome(status="done"), False)  # stale token
    locker = _lock_row(jobs[2].id)
    try:
        written = {(r.id, r.written) for r in s.finish(batch)}
    finally:
        locker.close()
    assert written == {(jobs[0].id, True), (jobs[1].id, True), (jobs[2].id, False), (jobs[4].id, True)}
    assert list(Job.objects.order_by("id").values_list("status", flat=True)) == [
        "done",
        "done",
        "running",
        "running",
        "done",
    ]


def test_a_finish_waits_a_moment_for_a_row_held_elsewhere_then_writes_around_it(store):
    """A row locked for long holds its batch up ``FINISH_WAIT_MS``, not the connection's 5 s
    lock timeout: then the batch is written without it, and the row is reported locked."""
    jobs = [record.enqueue(i) for i in range(3)]
    s = store("a")
    rows = claim(s)
    batch = [(Attempt(r.id, r.attempt), Outcome(status="done"), False) for r in rows]
    locker = _lock_row(jobs[1].id)
    try:
        began = time.monotonic()
        written = {(r.id, r.written) for r in s.finish(batch)}
        took = time.monotonic() - began
    finally:
        locker.close()
    assert written == {(jobs[0].id, True), (jobs[1].id, False), (jobs[2].id, True)}
    assert sql.leases.FINISH_WAIT_MS / 1000 <= took < 3.0


def test_a_finish_writes_a_row_whose_lock_ends_within_its_wait(store):
    """A row held for a moment (an admin action, a claim walking past) is waited for and written."""
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    locker = _lock_row(job.id)
    releaser = threading.Timer(0.05, locker.close)
    releaser.start()
    try:
        rows = s.finish([(Attempt(row.id, row.attempt), Outcome(status="done"), False)])
    finally:
        releaser.join()
    assert [(r.id, r.written) for r in rows] == [(job.id, True)]
    assert Job.objects.get(id=job.id).status == "done"


def test_a_finish_that_waited_for_a_row_checks_its_fence_on_the_newest_version(store):
    """While the finish waits, the transaction holding the row takes the job over (a new
    attempt, as another worker's claim of an expired lease does) and commits: the waiting
    UPDATE re-reads the row and writes nothing, though its snapshot saw the old attempt."""
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    other = psycopg.connect(**connection_params())
    other.execute("UPDATE leasejobs_job SET attempt = attempt + 1, leased_by = 'b' WHERE id = %s", [job.id])
    result: list[list] = []
    finishing = threading.Thread(
        target=lambda: result.append(
            s.finish([(Attempt(row.id, row.attempt), Outcome(status="done", result='"stale"'), False)])
        )
    )
    finishing.start()
    try:
        waited = False
        deadline = time.monotonic() + 5
        with psycopg.connect(**connection_params(), autocommit=True) as watcher:
            while not waited and time.monotonic() < deadline:
                waited = watcher.execute(
                    "SELECT count(*) > 0 FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    ["%waiting AS (%"],
                ).fetchone()[0]
                time.sleep(0.005)
        other.commit()
    finally:
        other.close()
        finishing.join(10)
    assert waited, "the finish never waited for the row"
    assert not [r for r in result[0] if r.written]
    job.refresh_from_db()
    assert (job.status, job.attempt, job.leased_by, job.result) == ("running", 2, "b", None)


def test_a_finish_that_waited_for_a_row_writes_it_when_its_fence_still_holds(store):
    """While the finish waits, the transaction holding the row changes it without taking the
    job (an operator's cancel request) and commits: the outcome is written all the same.
    The finish writes the row version it found, which is gone by then; the newest one is
    written by ``FINISH``, which the store runs for every outcome left unwritten."""
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    other = psycopg.connect(**connection_params())
    other.execute("UPDATE leasejobs_job SET cancel_requested = true WHERE id = %s", [job.id])
    result: list[list] = []
    finishing = threading.Thread(
        target=lambda: result.append(
            s.finish([(Attempt(row.id, row.attempt), Outcome(status="done", result='"kept"'), False)])
        )
    )
    finishing.start()
    try:
        waited = False
        deadline = time.monotonic() + 5
        with psycopg.connect(**connection_params(), autocommit=True) as watcher:
            while not waited and time.monotonic() < deadline:
                waited = watcher.execute(
                    "SELECT count(*) > 0 FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    ["%waiting AS (%"],
                ).fetchone()[0]
                time.sleep(0.005)
        other.commit()
    finally:
        other.close()
        finishing.join(10)
    assert waited, "the finish never waited for the row"
    assert [(r.id, r.written, r.status) for r in result[0]] == [(job.id, True, "done")]
    job.refresh_from_db()
    assert (job.status, job.result, job.cancel_requested) == ("done", "kept", True)


def test_array_literals_read_back_as_the_values_given():
    """The finish's arrays of numbers, booleans and statuses, cast by PostgreSQL as the statement does."""
    with psycopg.connect(**connection_params()) as conn:
        row = conn.execute(
            "SELECT %s::bigint[], %s::int[], %s::boolean[], %s::float8[], %s::text[], %s::int[]",
            [
                array_literal([1, 2**40]),
                array_literal([True, False, -1]),
                array_literal([True, False]),
                array_literal([0.0, 1e-05, 2.5, None]),
                array_literal(["done", "queued"]),
                array_literal([]),
            ],
        ).fetchone()
    assert row == ([1, 2**40], [1, 0, -1], [True, False], [0.0, 1e-05, 2.5, None], ["done", "queued"], [])


def test_the_worker_reads_json_back_as_stored():
    """The worker's connections read jsonb without ``json.loads`` (``connection._json_loads``)."""
    values = [
        [],
        {},
        [1, "x", {"a": 2}],
        {"nested": {"list": [[], {}], "ünïcode": 'line\u2028sep \\ "q"'}, "n": -1.5e-7},
        "a string",
        2**70,
        True,
        None,
        [" ", "{}", "[]"],
    ]
    conn = WorkerConnection("test", "w")
    try:
        rows = conn.execute(
            "SELECT v FROM unnest(%(values)s::jsonb[]) WITH ORDINALITY AS t(v, i) ORDER BY i",
            {"values": [Jsonb(v) for v in values]},
        )
    finally:
        conn.close()
    assert [r[0] for r in rows] == values


def test_a_claim_of_a_job_with_a_pending_cancel_ends_it_cancelled(store):
    job = record.enqueue(1)
    s = store("a")
    claim(s)
    Job.objects.filter(id=job.id).update(cancel_requested=True, lease_until="2000-01-01T00:00:00Z")
    rows = claim(store("b"))
    assert [(r.id, r.ended) for r in rows] == [(job.id, "cancelled")]
    job.refresh_from_db()
    assert (job.status, job.attempt) == ("cancelled", 1)


def test_a_retry_written_while_a_cancel_is_pending_ends_cancelled(store):
    job = record.enqueue(1)
    s = store("a")
    row = claim(s)[0]
    Job.objects.filter(id=job.id).update(cancel_requested=True)
    s.finish([(Attempt(row.id, row.attempt), Outcome(status="queued", retry_delay=0.1), False)])
    job.refresh_from_db()
    assert job.status == "cancelled" and job.finished_at is not None


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (
            sql.CLAIM,
            claim_params(limit=1, counted=1, queues=None, lease_seconds=30, task_leases={}, worker_id="w"),
        ),
        (sql.FENCE_CHECK, {}),
    ],
)
def test_claims_and_side_effects_commit_synchronously_whatever_the_default(store, statement, params):
    """A claim acknowledged and then lost in a crash could give one token to two workers."""
    job = record.enqueue(1)
    if statement is not sql.CLAIM:
        claim(store("w"))
        params = {**params, "id": job.id, "job_id": job.id}
    with psycopg.connect(**connection_params(), options="-c synchronous_commit=off") as conn:
        with conn.transaction():
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
            assert conn.execute(statement, params).fetchall()
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)  # this transaction only


def _updates(conn: psycopg.Connection) -> tuple[int, int]:
    """The job table's updates and HOT updates so far, with ``conn``'s own counts flushed."""
    with psycopg.connect(**connection_params(), autocommit=True) as reader:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.commit()
        reader.execute("SELECT pg_stat_clear_snapshot()")
        row = reader.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'leasejobs_job'"
        ).fetchone()
        assert row is not None
        return row[0], row[1]


def test_a_claim_is_a_hot_update_that_writes_no_index_entry():
    """docs/performance.md: a claim changes no indexed column and no column an index's
    predicate names, so each claimed row whose page has room is a HOT update (its version
    stays in its page and no index gets an entry): the WAL a claim costs is the row's."""
    with psycopg.connect(**connection_params(), autocommit=True) as empty:
        # A fresh table: rows earlier tests left (dead or not) take no room from the pages.
        empty.execute("TRUNCATE leasejobs_job CASCADE")
    jobs = [record.enqueue(i) for i in range(5)]  # five rows and their new versions fit a page
    with psycopg.connect(**connection_params()) as conn:
        before = _updates(conn)
        params = claim_params(
            limit=5, counted=5, queues=None, lease_seconds=30, task_leases={}, worker_id="w"
        )
        rows = conn.execute(sql.CLAIM, params).fetchall()
        conn.commit()
        assert len(rows) == len(jobs)
        updated, hot = (a - b for a, b in zip(_updates(conn), before, strict=True))
    assert (updated, hot) == (5, 5)


def test_a_job_is_unfinished_exactly_while_it_has_no_finish_time():
    """The claim index holds the rows with no ``finished_at``: a write that would leave a
    queued job with a finish time (hidden from every claim) or a finished one without is
    refused by the database, naming the rule."""
    job = record.enqueue(1)
    with pytest.raises(IntegrityError, match="leasejobs_job_finished_iff_ended"), transaction.atomic():
        Job.objects.filter(id=job.id).update(finished_at=Now())
    with pytest.raises(IntegrityError, match="leasejobs_job_finished_iff_ended"), transaction.atomic():
        Job.objects.filter(id=job.id).update(status=Job.Status.DONE)
    Job.objects.filter(id=job.id).update(status=Job.Status.DONE, finished_at=Now())


def _seq_scans() -> int:
    """Sequential scans of the job table so far, as every exited backend reported them."""
    with psycopg.connect(**connection_params(), autocommit=True) as reader:
        reader.execute("SELECT pg_stat_clear_snapshot()")
        row = reader.execute(
            "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'leasejobs_job'"
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_statements_planned_on_an_empty_table_never_scan_it_once_jobs_pour_in(store):
    """Claims, heartbeats and finishes are prepared on the worker's connections, and a
    statement planned generically keeps its plan until the next VACUUM or ANALYZE. Planned
    while the statistics said "empty", a finish once read the whole table per outcome
    (seconds per batch in a steady flow, docs/performance.md): each must find its rows
    through an index however few rows the statistics say there are."""
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        conn.execute("TRUNCATE leasejobs_job CASCADE")
        conn.execute("ANALYZE leasejobs_job")  # the statistics say: no rows
    before = _seq_scans()
    s = store("plans")
    for i in range(8):  # past the 5 custom plans after which PostgreSQL may keep a generic one
        record.enqueue(i)
        (row,) = claim(s, limit=1, counted=1)
        key = Attempt(row.id, row.attempt)
        s.heartbeat([(key, 30.0)], [0])
        s.finish([(key, Outcome(status="done"), False)])
    record.bulk_enqueue_ids([((i,), {}) for i in range(3000)])
    rows = claim(s, limit=500, counted=500)
    keys = [Attempt(r.id, r.attempt) for r in rows]
    s.heartbeat([(k, 30.0) for k in keys], [0] * len(keys))
    assert all(r.written for r in s.finish([(k, Outcome(status="done"), False) for k in keys]))
    s.close()  # a backend reports its counts as it exits
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        for _ in range(100):
            if not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'leasejobs % plans'"
            ).fetchone():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the store's connections did not end within 5 s")
    assert _seq_scans() == before
