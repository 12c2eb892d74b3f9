"""The integration half of tests/unit/test_testing.py: its tests that start workers or commit."""

from django.db import connection, transaction

from tests.testapp.tasks import (
    add,
)


def test_the_helpers_work_outside_a_transaction_too(transactional_db, job_queue):
    job = add.enqueue(20, 22)  # committed at once: autocommit, as in production
    [ran] = job_queue.run_jobs()
    assert (ran.outcome, ran.result) == ("done", 42)
    job.refresh_from_db()
    assert (job.status, job.result) == ("done", 42)


def test_the_claims_turn_jit_off_and_leave_the_session_as_it_was(transactional_db, job_queue):
    """JIT off for the claim (it compiled for seconds on a large table); the session's setting kept."""
    with connection.cursor() as cursor:
        cursor.execute("SET jit = on")
        add.enqueue(1, 2)
        [ran] = job_queue.run_jobs()
        assert ran.outcome == "done"
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "on"
        with transaction.atomic():
            add.enqueue(3, 4)
            [ran] = job_queue.run_jobs()
            cursor.execute("SHOW jit")
            assert cursor.fetchone()[0] == "off"  # until this transaction ends
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "on"
