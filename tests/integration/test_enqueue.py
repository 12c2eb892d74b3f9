"""Enqueue: transactional, bulk, idempotent, JSON-only, validated, NOTIFY on commit."""

import contextlib
import datetime as dt
import functools
import math
import threading
import time

import psycopg
import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction
from django.db.models.signals import post_init, pre_init
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from leasejobs import RetryPolicy
from leasejobs.db.connection import connection_params
from leasejobs.models import Job
from leasejobs.worker.listener import parse_payload
from tests.testapp.tasks import add, kinds, record

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_returns_the_queued_job():
    job = add.enqueue(2, b=3)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.task_name, stored.args, stored.kwargs) == ("tests.testapp.tasks.add", [2], {"b": 3})
    assert (stored.status, stored.attempt, stored.queue, stored.priority) == ("queued", 0, "default", 0)
    assert stored.max_attempts == 5
    assert job.run_at == stored.run_at and job.created_at == stored.created_at


def test_empty_error_and_worker_lists_are_stored_as_null_and_read_as_lists():
    """``[]`` took 5 bytes of WAL in each of a job's row versions: every way a job
    is made stores NULL instead, and Django still reads a list."""
    jobs = [
        add.enqueue(1, 2),  # the plain enqueue
        add.using(delay=60).enqueue(1, 2),  # the full one
        *add.bulk_enqueue([((1, 2), {})]),
        Job.objects.create(task_name="t", run_at=timezone.now()),
    ]
    ids = [j.pk for j in jobs]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM leasejobs_job WHERE id = ANY(%s) AND errors IS NULL AND worker_ids IS NULL",
            [ids],
        )
        assert cursor.fetchone() == (len(ids),)
    assert {(tuple(j.errors), tuple(j.worker_ids)) for j in Job.objects.filter(pk__in=ids)} == {((), ())}
    Job.objects.filter(pk=ids[0]).update(errors=[{"attempt": 1}])  # an entry is stored as written
    assert Job.objects.get(pk=ids[0]).errors == [{"attempt": 1}]
    # Only the column reads as a list: a missing element is None, as in any JSONField.
    assert set(Job.objects.filter(pk__in=ids).values_list("errors__0__attempt", flat=True)) == {1, None}


def test_a_rolled_back_transaction_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(1, 1)
        assert Job.objects.count() == 1  # visible inside the transaction
        raise RuntimeError("business logic failed")
    assert Job.objects.count() == 0


def test_workers_are_notified_on_commit_only():
    listener = psycopg.connect(**connection_params(), autocommit=True)
    try:
        listener.execute("LISTEN leasejobs")
        with transaction.atomic():
            job = add.enqueue(1, 1)
            assert list(listener.notifies(timeout=0.3)) == []
        [notify] = list(listener.notifies(timeout=2, stop_after=1))
        # The queue, and where the job lies in claim order (workers' keys move back to it).
        queue, (priority, key), later, _ = parse_payload(notify.payload)
        assert (queue, priority, key.id, later) == ("default", job.priority, job.pk, False)
        assert dt.datetime.fromisoformat(str(key.run_at)) == job.run_at
        # A job due soon says it is not due yet: committed only once it is due, it may
        # lie behind the keys; committed before, it wakes no claim (the poll finds it).
        later_job = add.using(delay=5).enqueue(1, 1)
        [notify] = list(listener.notifies(timeout=2, stop_after=1))
        queue, (priority, key), later, _ = parse_payload(notify.payload)
        assert (queue, key.id, later) == ("default", later_job.pk, True)
        jobs = add.using(delay=5).bulk_enqueue([((1, 1), {}), ((2, 2), {})])
        [notify] = list(listener.notifies(timeout=2, stop_after=1))
        assert parse_payload(notify.payload).place[1].id == jobs[0].pk
        assert parse_payload(notify.payload).later
        # A job due in a minute wakes nobody: the poll finds it when due.
        add.using(delay=60).enqueue(1, 1)
        add.using(delay=60).bulk_enqueue([((1, 1), {})])
        assert list(listener.notifies(timeout=0.3)) == []
        # Nor does an idempotency key already used: no job was inserted.
        add.using(idempotency_key="once").enqueue(1, 1)
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1
        add.using(idempotency_key="once").enqueue(1, 1)
        assert list(listener.notifies(timeout=0.3)) == []
    finally:
        listener.close()


def fields(job: Job) -> dict[str, object]:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


@pytest.mark.parametrize("listening", [False, True], ids=["no receivers", "a post_init receiver"])
def test_the_jobs_enqueue_returns_are_the_rows_as_django_reads_them(listening):
    """Built without reading back (and without Model.__init__ when no signal receiver listens)."""
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    if listening:
        post_init.connect(receiver, sender=Job)
    assert (pre_init.has_listeners(Job) or post_init.has_listeners(Job)) is listening  # which path runs
    try:
        returned = [
            add.using(priority=7, delay=30, retry=RetryPolicy(backoff="fixed", base_seconds=2)).enqueue(
                1, b=2
            ),
            *kinds.using(queue="bulk", priority=-3).bulk_enqueue([((i,), {"k": [i]}) for i in range(3)]),
        ]
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert len(seen) == (4 if listening else 0)
    for job in returned:
        assert not job.get_deferred_fields()  # every column set: fields() reads nothing back
        stored = Job.objects.get(pk=job.pk)
        assert fields(job) == fields(stored)
        assert set(vars(job)) == set(vars(stored))
        assert (job._state.adding, job._state.db) == (False, stored._state.db)
    returned[1].errors.append("only this job's")
    assert returned[2].errors == []  # no list shared between jobs


def test_the_plain_and_the_full_enqueue_statements_store_the_same_row(settings):
    """A common job takes ENQUEUE_PLAIN, one with an option ENQUEUE: the rows must not drift apart."""
    # No spans: a tracer provider another test set for this process would give the job a trace context.
    settings.LEASEJOBS = {**settings.LEASEJOBS, "OPENTELEMETRY": False}
    with CaptureQueriesContext(connection) as queries:
        plain = add.enqueue(1, b=2)
        full = add.using(idempotency_key="full").enqueue(1, b=2)
    assert "ON CONFLICT" not in queries[0]["sql"] and "ON CONFLICT" in queries[1]["sql"]
    differ = {"id", "idempotency_key", "run_at", "created_at"}
    rows = [
        {k: v for k, v in fields(Job.objects.get(pk=job.pk)).items() if k not in differ}
        for job in (plain, full)
    ]
    assert rows[0] == rows[1]
    assert fields(plain) == fields(Job.objects.get(pk=plain.pk))


def test_with_server_side_binding_and_a_prepare_threshold_enqueue_is_prepared_and_still_correct():
    """The README's opt-in: psycopg prepares the INSERT, the jobs are the same."""
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["OPTIONS"] = {
        **saved.get("OPTIONS", {}),
        "server_side_binding": True,
        "prepare_threshold": 2,
    }
    try:
        jobs = [add.using(priority=p, delay=p % 2).enqueue(p, b=p) for p in range(4)]
        first = add.using(idempotency_key="prepared").enqueue(9, 9)
        again = add.using(idempotency_key="prepared").enqueue(1, 1)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%INSERT INTO leasejobs_job%"],
            )
            assert cursor.fetchone()[0] >= 1
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
    assert again.id == first.id
    assert [(j.args, j.kwargs, j.priority) for j in Job.objects.exclude(id=first.id).order_by("id")] == [
        ([p], {"b": p}, p) for p in range(4)
    ]
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)


def test_bulk_enqueue_inserts_many_jobs_in_one_statement():
    with CaptureQueriesContext(connection) as queries:
        jobs = record.using(queue="bulk", priority=3).bulk_enqueue([((i,), {}) for i in range(500)])
    assert len(queries) == 1
    assert [j.args for j in jobs] == [[i] for i in range(500)]
    assert Job.objects.filter(queue="bulk", priority=3).count() == 500
    assert sorted(j.id for j in jobs) == [j.id for j in jobs]


def test_an_idempotency_key_returns_the_existing_job():
    first = add.using(idempotency_key="order-42").enqueue(1, 2)
    again = add.using(idempotency_key="order-42").enqueue(5, 5)
    assert again.id == first.id and again.args == [1, 2]
    assert Job.objects.count() == 1


def test_bulk_enqueue_stores_each_calls_own_arguments_as_returned():
    """Awkward JSON (quotes, brackets, unicode, nesting) comes back per job as given, in input order."""
    calls = [
        ((), {}),
        (('a "quoted" ], [text', "ünï\u2028code", None), {"k": [1, {"x": [2.5, True]}]}),
        ((1,), {"n": -(2**53)}),
    ]
    jobs = kinds.using(queue="bulk-json", delay=30).bulk_enqueue(calls)
    stored = {j.id: (j.args, j.kwargs) for j in Job.objects.filter(queue="bulk-json")}
    assert [(j.args, j.kwargs) for j in jobs] == [(list(a), k) for a, k in calls]
    assert [stored[j.id] for j in jobs] == [(list(a), k) for a, k in calls]
    assert all(j.run_at > j.created_at for j in jobs)


def test_bulk_enqueue_ids_inserts_the_same_jobs_and_returns_their_ids_in_input_order():
    with CaptureQueriesContext(connection) as queries:
        ids = kinds.using(queue="bulk-ids", priority=2).bulk_enqueue_ids(
            [((i,), {"n": i}) for i in range(300)]
        )
    assert len(queries) == 1
    stored = {j.id: j for j in Job.objects.filter(queue="bulk-ids")}
    assert [(stored[i].args, stored[i].kwargs, stored[i].priority) for i in ids] == [
        ([n], {"n": n}, 2) for n in range(300)
    ]
    assert record.bulk_enqueue_ids([]) == []


def test_bulk_enqueue_ids_refuses_what_bulk_enqueue_refuses():
    with pytest.raises(ValueError, match="cannot share one idempotency_key"):
        add.using(idempotency_key="one").bulk_enqueue_ids([((1, 1), {})])
    with pytest.raises(TypeError, match="must be JSON"):
        add.bulk_enqueue_ids([((1, 1), {}), ((object(), 1), {})])
    assert Job.objects.count() == 0


def test_bulk_enqueue_refuses_an_idempotency_key():
    with pytest.raises(ValueError, match="cannot share one idempotency_key"):
        add.using(idempotency_key="one").bulk_enqueue([((1, 1), {}), ((2, 2), {})])
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "bad",
    [dt.datetime(2026, 1, 1, tzinfo=dt.UTC), {1, 2}, object(), b"bytes", math.nan],
    ids=["datetime", "set", "object", "bytes", "nan"],
)
def test_arguments_that_are_not_json_are_refused_with_a_type_error(bad):
    with pytest.raises(TypeError, match="must be JSON"):
        add.enqueue(bad, 1)
    assert Job.objects.count() == 0


def test_arguments_given_as_iterators_are_read_once_refused_or_stored_and_returned_whole():
    with pytest.raises(TypeError, match="must be JSON"):
        kinds.bulk_enqueue([(iter([object()]), {})])
    with pytest.raises(TypeError, match="must be JSON"):
        kinds.bulk_enqueue([((), iter([("k", object())]))])
    assert Job.objects.count() == 0
    [job] = kinds.bulk_enqueue([(iter([1, 2]), iter([("k", "v")]))])
    assert (job.args, job.kwargs) == ([1, 2], {"k": "v"})
    assert Job.objects.get(pk=job.pk).args == [1, 2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_at": dt.datetime(2030, 1, 1)}, "aware datetime"),
        ({"queue": ""}, "queue must be"),
        ({"queue": "q" * 101}, "queue must be"),
        ({"priority": 101}, "priority must be"),
        ({"priority": 1.5}, "priority must be"),
        ({"delay": -1}, "delay must be"),
        ({"idempotency_key": "k" * 256}, "idempotency_key must be"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        add.using(**options).enqueue(1, 1)


def test_oversized_payload_is_refused(settings):
    settings.LEASEJOBS = {"MAX_PAYLOAD_BYTES": 1000}
    with pytest.raises(ValueError, match="MAX_PAYLOAD_BYTES"):
        add.enqueue("x" * 2000, 1)


def _database_clock() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("bulk", [False, True])
def test_delay_counts_from_the_enqueue_statement_not_the_transaction_start(bulk):
    """A job enqueued late in a long transaction with delay=1 still waits a second."""
    delayed = add.using(delay=1)
    with transaction.atomic():
        _database_clock()  # the transaction has started
        time.sleep(2)
        before = _database_clock()
        job = delayed.bulk_enqueue([((1, 1), {})])[0] if bulk else delayed.enqueue(1, 1)
    stored = Job.objects.get(pk=job.pk)
    assert stored.run_at == job.run_at
    assert stored.run_at >= before + dt.timedelta(seconds=1), (stored.run_at, before)
    assert stored.created_at >= before
    assert stored.run_at - stored.created_at == dt.timedelta(seconds=1)


def test_run_at_and_delay_schedule_the_job():
    later = timezone.now() + dt.timedelta(hours=1)
    assert add.using(run_at=later).enqueue(1, 1).run_at == later
    delayed = add.using(delay=dt.timedelta(minutes=10)).enqueue(1, 1)
    assert dt.timedelta(minutes=9) < delayed.run_at - timezone.now() < dt.timedelta(minutes=11)


# -- enqueue() on Django's connection: every statement through connection.cursor(), as the ORM's.
# A psycopg cursor kept between calls was measured about a tenth faster
# (docs/performance-history.md) and broke the guards below, so each enqueue opens one.


def test_enqueue_goes_on_after_the_connection_is_closed_or_its_backend_killed():
    first = add.enqueue(1, 1)
    connection.close()
    second = add.enqueue(2, 2)  # a new connection, and a cursor on it
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(**connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError):  # Django's error, as from any cursor of its own
        add.enqueue(3, 3)
    connection.close()  # what Django does at the end of the request
    third = add.enqueue(4, 4)
    assert [(j.id, j.args) for j in Job.objects.order_by("id")] == [
        (first.id, [1, 1]),
        (second.id, [2, 2]),
        (third.id, [4, 4]),
    ]


def test_every_enqueue_is_seen_by_captured_queries_and_execute_wrappers():
    wrapped = []

    def wrapper(execute, sql, params, many, context):
        wrapped.append(sql)
        return execute(sql, params, many, context)

    add.enqueue(0, 0)  # the connection open before the capture starts
    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(wrapper):
        for i in range(3):
            add.enqueue(i, i)
    assert ["INSERT INTO leasejobs_job" in q["sql"] for q in queries] == [True] * 3
    assert len(wrapped) == 3
    add.enqueue(9, 9)
    assert len(wrapped) == 3  # the wrapper is gone with its block


def test_an_aborted_transaction_fails_its_enqueue_and_the_next_one_works():
    with pytest.raises(DatabaseError), transaction.atomic():
        with connection.cursor() as cursor, pytest.raises(DatabaseError):
            cursor.execute("SELECT 1/0")
        add.enqueue(1, 1)  # current transaction is aborted
    job = add.enqueue(2, 2)
    assert list(Job.objects.values_list("id", "args")) == [(job.id, [2, 2])]


def test_threads_enqueueing_at_once_each_get_their_own_jobs_back_even_on_a_shared_connection():
    """One connection per thread; and a connection shared by threads, as Django's test servers share it.

    An execute wrapper sleeps between each statement and its fetch (as an
    instrumentation's I/O would), so other threads run in between.
    """

    def yielding(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        time.sleep(0.0005)
        return result

    def enqueue_many(tag: int, out: dict[int, list[tuple[int, list[int]]]]) -> None:
        own = not connection.allow_thread_sharing
        try:
            with connection.execute_wrapper(yielding) if own else contextlib.nullcontext():
                out[tag] = [(job.id, job.args) for job in (kinds.enqueue(tag, i) for i in range(150))]
        finally:
            if own:
                connection.close()

    for shared in (False, True):
        returned: dict[int, list[tuple[int, list[int]]]] = {}
        threads = [threading.Thread(target=enqueue_many, args=(tag, returned)) for tag in range(4)]
        if shared:
            connection.inc_thread_sharing()
            for thread in threads:  # every thread uses this thread's connection
                thread.run = functools.partial(_with_connection, connections["default"], thread.run)
        try:
            with connection.execute_wrapper(yielding) if shared else contextlib.nullcontext():
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(timeout=60)
                    assert not thread.is_alive()
        finally:
            if shared:
                connection.dec_thread_sharing()
        stored = dict(Job.objects.values_list("id", "args"))
        assert sorted(returned) == [0, 1, 2, 3]
        for tag, jobs in returned.items():
            assert [args for _, args in jobs] == [[tag, i] for i in range(150)]
            assert all(stored[job_id] == args for job_id, args in jobs), "a thread got another's job"
        Job.objects.all().delete()


def _with_connection(shared, run):
    """Run ``run`` with ``shared`` as this thread's default connection (as LiveServerThread does)."""
    connections["default"] = shared
    try:
        run()
    finally:
        del connections["default"]


def test_a_changed_time_zone_returns_the_enqueued_job_as_django_reads_it(settings):
    add.enqueue(0, 0)  # the connection open under the first time zone
    settings.USE_TZ = False
    settings.TIME_ZONE = "Asia/Tokyo"
    job = add.enqueue(1, 1)
    stored = Job.objects.get(pk=job.pk)
    assert (job.created_at, job.run_at) == (stored.created_at, stored.created_at)
    assert job.created_at.tzinfo is None


def test_a_cursor_method_patched_on_the_connection_sees_every_enqueue(monkeypatch):
    """What django-debug-toolbar's SQL panel, ddtrace and Django's SimpleTestCase guard patch."""
    add.enqueue(0, 0)
    seen = []
    opened = connection.cursor

    def cursor():
        seen.append("cursor")
        return opened()

    monkeypatch.setattr(connection, "cursor", cursor)
    add.enqueue(1, 1)
    assert seen == ["cursor"]


def test_an_enqueue_made_while_another_enqueues_returns_each_its_own_job():
    """An execute wrapper (or a django.db.backends handler) may enqueue between a statement and its fetch."""
    inner = []

    def enqueue_once_more(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not inner:
            inner.append(None)  # the inner enqueue passes here too
            inner[0] = add.enqueue(100, 100)
        return result

    with connection.execute_wrapper(enqueue_once_more):
        outer = add.enqueue(1, 1)
    assert (outer.args, inner[0].args) == ([1, 1], [100, 100])
    assert Job.objects.get(pk=outer.pk).args == [1, 1]
