"""The worker through PgBouncer in transaction mode, as many production sites run it.

The core worker tests of ``test_worker`` run a second time here, each
worker reaching the database through a real PgBouncer (``tests.pgbouncer``)
with LISTEN on a direct connection; the test process itself enqueues and
checks directly. The tests below them cover what only a pooler brings:
the mode the worker detects, polling without a direct connection, and the
settings that cannot work through a pooler.
"""

import contextlib
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, transaction
from django.test import Client

from leasejobs.db import pooling
from leasejobs.models import Job
from tests.adminpages import act
from tests.helpers import WorkerProcess, database_url, wait_until
from tests.integration.test_worker import (  # noqa: F401 (collected here a second time, through PgBouncer)
    job_now,
    test_a_job_of_a_killed_worker_is_taken_over_after_its_lease,
    test_a_paused_worker_is_fenced_off_and_lives_on,
    test_a_stale_finish_never_overwrites_the_newer_attempt,
    test_fencing_and_idempotency_make_the_second_run_harmless,
    test_heartbeats_keep_the_lease_so_the_slow_job_runs_once,
    test_no_job_is_claimed_twice_by_three_workers_of_four_threads,
    test_sigterm_lets_a_running_job_finish_within_the_grace,
    test_sigterm_past_the_grace_gives_the_lease_back,
    test_without_heartbeat_or_fencing_the_slow_job_runs_twice_and_sends_twice,
)
from tests.pgbouncer import PgBouncer, django_through
from tests.testapp.models import Sent
from tests.testapp.tasks import receipt, record, until_cancelled


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[PgBouncer]:
    s = connection.settings_dict
    bouncer = PgBouncer(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432), pool_size=8)
    yield bouncer
    bouncer.remove()


def through(bouncer: PgBouncer, **env: str) -> dict[str, str]:
    """A worker's environment: its Django connections and its own through PgBouncer."""
    return {
        "DATABASE_URL": bouncer.url(connection.settings_dict["NAME"]),
        "DJANGO_DISABLE_SERVER_SIDE_CURSORS": "1",
        **env,
    }


@pytest.fixture
def start_worker(
    start_worker: Callable[..., WorkerProcess], pgbouncer: PgBouncer
) -> Callable[..., WorkerProcess]:
    """Workers through PgBouncer, LISTENing on the direct URL (the production shape)."""

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        return start_worker(
            *args, env=through(pgbouncer, **{"LEASEJOBS_LISTEN_URL": database_url(), **(env or {})})
        )

    return start


def test_the_worker_says_it_found_a_transaction_pooler_and_listens_directly(start_worker):
    worker = start_worker("--worker-id", "a")
    worker.wait_for_log(
        r"worker started worker=a .* pooler=transaction wakeups=LISTEN on LEASEJOBS\['LISTEN_URL'\]"
    )
    job = record.enqueue("woken by NOTIFY")
    wait_until(lambda: job_now(job).status == "done", what="job done")


def test_without_a_direct_connection_the_worker_polls_and_still_runs_jobs(start_worker):
    worker = start_worker("--worker-id", "a", env={"LEASEJOBS_LISTEN_URL": ""})
    worker.wait_for_log(r"pooler=transaction wakeups=polling every 1s")
    jobs = record.bulk_enqueue([((i,), {}) for i in range(20)])
    wait_until(lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 20)
    assert "listener" not in worker.log()


def test_a_direct_worker_says_so(start_worker):
    worker = start_worker("--worker-id", "a", env={"DATABASE_URL": database_url()})
    worker.wait_for_log(r"worker started worker=a .* pooler=none wakeups=LISTEN")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DJANGO_DISABLE_SERVER_SIDE_CURSORS": "0"},
            "goes through a transaction pooler: set DISABLE_SERVER_SIDE_CURSORS to True there",
        ),
        ({"LEASEJOBS_LISTEN_URL": "pooled"}, "LEASEJOBS['LISTEN_URL'] goes through a transaction pooler too"),
        (
            {"LEASEJOBS_LISTEN_URL": "postgres://postgres@127.0.0.1:1/nowhere"},
            "Cannot reach the LISTEN database",
        ),
    ],
)
def test_a_setting_that_cannot_work_through_the_pooler_stops_the_worker_in_one_sentence(
    start_worker, pgbouncer, env, message
):
    if env.get("LEASEJOBS_LISTEN_URL") == "pooled":
        env = {"LEASEJOBS_LISTEN_URL": pgbouncer.url(connection.settings_dict["NAME"])}
    worker = start_worker(env=env)
    assert worker.wait(timeout=30) == 1
    assert message in worker.log()
    assert "Traceback" not in worker.log()


@pytest.fixture
def via_pgbouncer(pgbouncer: PgBouncer) -> Iterator[Callable[[], None]]:
    """This test process's own Django connection through PgBouncer too (after its workers started)."""
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(django_through(pgbouncer))


def test_enqueue_side_effects_and_admin_actions_through_pgbouncer(start_worker, via_pgbouncer, admin_user):
    worker = start_worker("--lease", "5", "--worker-id", "a")
    worker.wait_for_log(r"worker started worker=a")
    via_pgbouncer()
    assert pooling.detect(connection.get_connection_params()) is True  # this process goes through it too
    with pytest.raises(RuntimeError), transaction.atomic():
        record.enqueue("rolled back")
        raise RuntimeError
    first = receipt.using(idempotency_key="order-11").enqueue(11)
    again = receipt.using(idempotency_key="order-11").enqueue(11)
    jobs = [first, *record.bulk_enqueue([((i,), {}) for i in range(5)])]
    wait_until(lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 6)
    assert again.id == first.id and not Job.objects.filter(args=["rolled back"]).exists()
    assert list(Sent.objects.values_list("key", "attempt")) == [("receipt:11", 1)]
    long = until_cancelled.enqueue(60)
    wait_until(lambda: job_now(long).status == "running", what="the long job runs")
    client = Client()
    client.force_login(admin_user)
    messages = act(client, "cancel", [long])
    assert messages, messages
    wait_until(lambda: job_now(long).status == "cancelled", timeout=30, what="cancelled through the admin")


def test_the_django_tasks_backend_through_pgbouncer(start_worker, via_pgbouncer):
    pytest.importorskip("django.tasks")  # Django 6+
    from tests.testapp import django_tasks as dtasks

    start_worker("--worker-id", "a").wait_for_log(r"worker started worker=a")
    via_pgbouncer()
    result = dtasks.meaning_of_life.enqueue()
    wait_until(lambda: dtasks.meaning_of_life.get_result(result.id).is_finished, what="task finished")
    assert dtasks.meaning_of_life.get_result(result.id).return_value == 42


def test_the_worker_vacuums_through_the_pooler(start_worker):
    """VACUUM cannot run in a transaction: through a pooler it goes without the session settings."""
    jobs = record.bulk_enqueue([((i,), {}) for i in range(300)])
    worker = start_worker("--worker-id", "a", env={"LEASEJOBS_TEST_VACUUM_THRESHOLD": "200"})
    wait_until(lambda: Job.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 300)
    worker.wait_for_log(
        r"INFO leasejobs\.worker vacuumed leasejobs_job worker=a: \d+ dead row versions", timeout=30
    )
    assert worker.count(r"vacuum failed|cannot read the job table's statistics|does not vacuum") == 0, (
        worker.log()
    )
