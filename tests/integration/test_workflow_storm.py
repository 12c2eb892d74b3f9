"""Workflow edges under SIGKILL and SIGSTOP of workers, and batched settlings that share children.

The fan-in: 1,000 parents on three workers that are killed and paused
while the parents run; the callback, on a queue of its own served by a
worker left alone, must start exactly once, after the last parent, and see
all 1,000 results.
"""

import random
import signal
import threading
import time

import psycopg
import pytest

import leasejobs
from leasejobs.models import Job
from localworkers import database_url
from tests.connection_budget import many_connections
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import BodyRun
from tests.testapp.workflow_tasks import gather, storm_leaf

pytestmark = pytest.mark.django_db(transaction=True)

PARENTS = 1000
STORM = ("--queue", "storm", "--concurrency", "4", "--lease", "2", "--heartbeat", "0.3")


@many_connections(42)
def test_a_fan_in_of_1000_parents_under_kills_and_pauses_fires_its_callback_once(start_worker):
    with leasejobs.workflow("fan-in 1000") as wf:
        parents = [wf.add(storm_leaf, args=(i, 0.1), queue="storm") for i in range(PARENTS)]
        callback = wf.add(gather, after=parents, queue="callbacks")
        # A second fan-in over the same parents, in reverse order of creation: every
        # batch of finishes settles both children (the lock order is what keeps them apart).
        second = wf.add(gather, after=list(reversed(parents)), queue="callbacks")
    assert Job.objects.get(id=callback.id).pending_parents == PARENTS
    calm = start_worker("--queue", "callbacks", "--concurrency", "2", "--worker-id", "calm")
    stormed: list[WorkerProcess] = [start_worker(*STORM, "--worker-id", f"s{n}") for n in range(3)]
    rng = random.Random(31)
    kills = pauses = 0
    deadline = time.monotonic() + 240

    def parents_left() -> int:
        return Job.objects.filter(id__in=[p.id for p in parents]).exclude(status="done").count()

    while (parents_left() > 100 or not (kills and pauses)) and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.5, 1.5))
        n = rng.randrange(len(stormed))
        if rng.random() < 0.5:
            stormed[n].signal(signal.SIGKILL)
            stormed[n].wait()
            stormed[n] = start_worker(*STORM, "--worker-id", f"s{n}-{kills}")
            kills += 1
        else:
            stormed[n].signal(signal.SIGSTOP)
            time.sleep(3)  # past its lease: its jobs are taken over, its finishes fenced off
            stormed[n].signal(signal.SIGCONT)
            pauses += 1
    assert kills >= 1 and pauses >= 1, (kills, pauses)

    def ended() -> bool:
        return Job.objects.filter(id__in=[callback.id, second.id], status__in=["done", "failed"]).count() == 2

    wait_until(ended, 240, interval=0.5, what="both callbacks to end")
    rows = {j.id: j for j in Job.objects.filter(workflow_id=wf.id)}
    assert all(rows[p.id].status == "done" for p in parents)
    taken_over = sum(1 for p in parents if rows[p.id].attempt > 1)
    assert taken_over > 0  # the storm hit parents while they ran
    last = max(rows[p.id].finished_at for p in parents)
    for cb in (callback, second):
        row = rows[cb.id]
        assert row.status == "done", row.last_error
        assert row.result == {"n": PARENTS, "sum": sum(range(PARENTS)), "missing": []}
        assert row.started_at >= last  # not due before the last parent's finish
        assert (row.attempt, row.pending_parents) == (1, 0)  # claimed once: due once
        assert BodyRun.objects.filter(job_id=cb.id).count() == 1
    for worker in [calm, *stormed]:
        assert worker.count("deadlock detected") == 0


def test_two_settlings_sharing_children_wait_in_one_order_instead_of_deadlocking():
    """Two batches settle parents of the same two children, each listing them in the other
    order, while a third transaction holds the second child: both finish once it lets go."""
    with leasejobs.workflow("shared children") as wf:
        p1, p2 = wf.add(storm_leaf, args=(1,)), wf.add(storm_leaf, args=(2,))
        c1 = wf.add(gather, after=[p1, p2])
        c2 = wf.add(gather, after=[p2, p1])
    url = database_url()
    errors: list[BaseException] = []
    with psycopg.connect(url) as holder:
        holder.execute("SELECT 1 FROM leasejobs_job WHERE id = %s FOR UPDATE", [c2.id])

        def settle(parent: int) -> None:
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("SET lock_timeout = '20s'")
                    conn.execute("SELECT leasejobs_settle_parents(%s, %s, NULL)", [[parent], ["done"]])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=settle, args=(p,)) for p in (p1.id, p2.id)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # one holds c1 and waits on c2, the other waits on c1
        holder.rollback()
        for t in threads:
            t.join(30)
    assert not errors, errors
    rows = {j.id: j for j in Job.objects.filter(id__in=[c1.id, c2.id])}
    assert all(r.pending_parents == 0 and r.run_at.year < 9999 for r in rows.values())
