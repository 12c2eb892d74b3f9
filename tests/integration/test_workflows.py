"""Workflows with real runworker processes: chain, fan-out, fan-in, diamond,
failure cascades, the run-anyway option, cancel_workflow and the admin's retry."""

import datetime as dt
from importlib.util import find_spec

import pytest
from django.db import transaction

import leasejobs
from leasejobs.db import facade, sql
from leasejobs.models import Job, WorkflowEdge
from leasejobs.models import Workflow as WorkflowRow
from tests.helpers import wait_until
from tests.testapp import tasks
from tests.testapp.models import BodyRun
from tests.testapp.workflow_tasks import boom, gather, leaf, node

pytestmark = pytest.mark.django_db(transaction=True)

HAS_DJANGO_TASKS = find_spec("django.tasks") is not None
FINISHED = {Job.Status.DONE, Job.Status.FAILED, Job.Status.CANCELLED}


def _settled(jobs: list[Job], timeout: float = 60.0) -> dict[int, Job]:
    """Wait until every job has ended; the rows as they ended."""

    def ended() -> dict[int, Job] | None:
        rows = {j.id: j for j in Job.objects.filter(id__in=[j.id for j in jobs])}
        return rows if all(r.status in FINISHED for r in rows.values()) else None

    return wait_until(ended, timeout, what="every job of the workflow to end")


def _after_parents(rows: dict[int, Job]) -> None:
    """Each child started after each of its parents finished (database clock), and ran once."""
    for edge in WorkflowEdge.objects.filter(child_id__in=list(rows)):
        child, parent = rows[edge.child_id], rows[edge.parent_id]
        if child.status == Job.Status.DONE and parent.status == Job.Status.DONE:
            assert child.started_at >= parent.finished_at, (edge.parent_id, edge.child_id)
    for job_id, row in rows.items():
        if row.status == Job.Status.DONE:
            assert BodyRun.objects.filter(job_id=job_id).count() == 1, job_id


def test_chain_runs_in_order_and_each_sees_its_parent(start_worker):
    with leasejobs.workflow("chain") as wf:
        a = wf.add(node, args=("a",))
        b = wf.add(node, args=("b",), after=[a])
        c = wf.add(node, args=("c",), after=[b])
    assert Job.objects.get(id=b.id).run_at.year == 9999  # never due before its parent
    start_worker("--concurrency", "2")
    rows = _settled([a, b, c])
    assert all(r.status == Job.Status.DONE for r in rows.values())
    _after_parents(rows)
    assert rows[c.id].result["parents"] == {str(b.id): rows[b.id].result}
    assert rows[a.id].result["parents"] == {}
    assert {r.workflow_id for r in rows.values()} == {wf.id}
    assert all(r.pending_parents == 0 for r in rows.values())


def test_fan_out_fan_in_and_diamond(start_worker):
    with leasejobs.workflow("diamond") as wf:
        top = wf.add(node, args=("top",))
        middle = [wf.add(node, args=(f"m{i}",), after=[top]) for i in range(5)]
        bottom = wf.add(node, args=("bottom",), after=middle)
        # A second diamond sharing the top: top -> (x, y) -> z
        x = wf.add(node, args=("x",), after=[top])
        y = wf.add(node, args=("y",), after=[top])
        z = wf.add(node, args=("z",), after=[x, y, x])  # a repeated parent counts once
    start_worker("--concurrency", "3")
    start_worker("--concurrency", "3")
    rows = _settled([top, *middle, bottom, x, y, z])
    assert all(r.status == Job.Status.DONE for r in rows.values())
    _after_parents(rows)
    assert set(rows[bottom.id].result["parents"]) == {str(m.id) for m in middle}
    assert set(rows[z.id].result["parents"]) == {str(x.id), str(y.id)}


def test_a_failed_parent_cancels_its_descendants_and_run_anyway_runs(start_worker):
    with leasejobs.workflow("cascade") as wf:
        ok = wf.add(node, args=("ok",))
        bad = wf.add(boom)
        child = wf.add(node, args=("child",), after=[ok, bad])
        grandchild = wf.add(node, args=("grandchild",), after=[child])
        cleanup = wf.add(node, args=("cleanup",), after=[bad, child], on_parent_failure="run")
        after_cleanup = wf.add(node, args=("after cleanup",), after=[cleanup])
    start_worker("--concurrency", "2")
    rows = _settled([ok, bad, child, grandchild, cleanup, after_cleanup])
    assert rows[bad.id].status == Job.Status.FAILED
    assert rows[child.id].status == Job.Status.CANCELLED
    assert rows[child.id].last_error == f"cancelled: job {bad.id} of its workflow failed"
    assert rows[grandchild.id].status == Job.Status.CANCELLED
    assert rows[grandchild.id].last_error == f"cancelled: job {bad.id} of its workflow failed"
    assert not BodyRun.objects.filter(job_id__in=[child.id, grandchild.id]).exists()
    # Run anyway: after both parents ended (one failed, one cancelled); failed ones show None.
    assert rows[cleanup.id].status == Job.Status.DONE
    assert rows[cleanup.id].result["parents"] == {str(bad.id): None, str(child.id): None}
    assert rows[after_cleanup.id].status == Job.Status.DONE
    assert rows[cleanup.id].started_at >= rows[bad.id].finished_at


def test_retrying_the_failed_node_continues_the_workflow(start_worker):
    with leasejobs.workflow("retry") as wf:
        bad = wf.add(boom)
        child = wf.add(node, args=("child",), after=[bad])
        grandchild = wf.add(node, args=("grandchild",), after=[child])
    worker = start_worker("--concurrency", "1")
    rows = _settled([bad, child, grandchild])
    assert [rows[j.id].status for j in (bad, child, grandchild)] == ["failed", "cancelled", "cancelled"]
    # The admin's retry (the same statement as its action and `leasejobs_jobs retry`):
    # boom fails again, and its descendants are cancelled again, once more.
    row = rows[bad.id]
    retried = facade.admin_change(
        sql.ADMIN_RETRY,
        {"ids": [row.id], "statuses": [row.status], "attempts": [row.attempt], "channel": "leasejobs"},
    )
    assert [r[0] for r in retried] == [bad.id]
    back = {j.id: j for j in Job.objects.filter(id__in=[child.id, grandchild.id])}
    assert all(j.status == Job.Status.QUEUED and j.run_at.year == 9999 for j in back.values())
    assert all(j.last_error == "" for j in back.values())
    wait_until(lambda: BodyRun.objects.filter(job_id=bad.id).count() == 2, 30, what="boom's second run")
    rows = _settled([bad, child, grandchild])
    assert [rows[j.id].status for j in (bad, child, grandchild)] == ["failed", "cancelled", "cancelled"]
    worker.stop()


def test_retry_of_a_cancelled_parent_runs_the_rest(start_worker):
    with leasejobs.workflow("hold") as wf:
        gate = wf.add(node, args=("gate",), delay=3600)  # due in an hour: cancelled before it runs
        child = wf.add(node, args=("child",), after=[gate])
    row = Job.objects.get(id=gate.id)
    facade.admin_change(
        sql.ADMIN_CANCEL,
        {"ids": [row.id], "statuses": [row.status], "attempts": [row.attempt], "channel": "leasejobs"},
    )
    assert Job.objects.get(id=child.id).status == Job.Status.CANCELLED  # at once, by the cascade
    row = Job.objects.get(id=gate.id)
    facade.admin_change(
        sql.ADMIN_RETRY,
        {"ids": [row.id], "statuses": [row.status], "attempts": [row.attempt], "channel": "leasejobs"},
    )
    # An operator's cancel is not a cascade: the gate's own cancel is undone by its retry;
    # its child, cancelled by the cascade, waits for it again.
    assert Job.objects.get(id=child.id).status == Job.Status.QUEUED
    start_worker("--concurrency", "1")
    rows = _settled([gate, child])
    assert rows[child.id].status == Job.Status.DONE
    _after_parents(rows)


def test_cancel_workflow_cancels_waiting_and_running_nodes(start_worker):
    with leasejobs.workflow("cancel me") as wf:
        running = wf.add(tasks.until_cancelled, args=(60,))
        other = wf.add(node, args=("other",))
        waiting = wf.add(node, args=("waiting",), after=[running, other])
    worker = start_worker("--concurrency", "2", "--heartbeat", "0.2")
    wait_until(lambda: Job.objects.get(id=running.id).status == Job.Status.RUNNING, 20, what="a running node")
    wait_until(lambda: Job.objects.get(id=other.id).status == Job.Status.DONE, 20, what="the other node")
    changed = leasejobs.cancel_workflow(wf)
    assert changed.matched == 2  # running asked to stop, waiting cancelled at once
    assert Job.objects.get(id=waiting.id).status == Job.Status.CANCELLED
    rows = _settled([running, other, waiting], 30)
    assert rows[running.id].status == Job.Status.CANCELLED
    assert rows[waiting.id].status == Job.Status.CANCELLED
    assert not BodyRun.objects.filter(job_id=waiting.id).exists()
    worker.stop()


def test_a_failed_block_leaves_nothing_and_after_refuses_strangers():
    stranger = tasks.add.enqueue(1, 2)
    refused = "after= takes only jobs returned by this workflow's add"
    with pytest.raises(ValueError, match=refused), leasejobs.workflow("strangers") as wf:
        a = wf.add(node, args=("a",))
        wf.add(node, args=("b",), after=[a, stranger])
    assert not WorkflowRow.objects.filter(name="strangers").exists()
    assert Job.objects.count() == 1  # the stranger alone: the block's jobs were rolled back
    with pytest.raises(ValueError, match="after= takes only"):
        with leasejobs.workflow("other") as first:
            x = first.add(node, args=("x",))
        with leasejobs.workflow("other 2") as second:
            second.add(node, args=("y",), after=[x])
    # enqueue's own refusal: arguments that do not fit
    with pytest.raises(TypeError), leasejobs.workflow("bad args") as wf:
        wf.add(node, args=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="idempotency_key"), leasejobs.workflow("keys") as wf:
        wf.add(node, args=("k",), idempotency_key="k1")
    with pytest.raises(RuntimeError, match="not open"):
        first.add(node, args=("late",))


def test_the_callers_transaction_holds_the_workflow():
    with pytest.raises(RuntimeError), transaction.atomic():
        with leasejobs.workflow("inner") as wf:
            wf.add(node, args=("a",))
        assert Job.objects.filter(workflow_id=wf.id).count() == 1
        raise RuntimeError("the caller's block fails after the workflow's")
    assert not Job.objects.exists()
    assert not WorkflowRow.objects.exists()


def test_a_stale_finish_fires_no_edge(start_worker):
    """A paused worker's parent is re-run by another; the paused one's finish is fenced off."""
    import signal

    with leasejobs.workflow("stale") as wf:
        parent = wf.add(leaf, args=(1, 2.5))
        child = wf.add(gather, after=[parent])
    a = start_worker("--concurrency", "1", "--lease", "1", "--heartbeat", "0.2", "--worker-id", "a")
    wait_until(lambda: Job.objects.get(id=parent.id).status == Job.Status.RUNNING, 20, what="a claim")
    a.signal(signal.SIGSTOP)
    start_worker("--concurrency", "1", "--lease", "5", "--worker-id", "b")
    rows = _settled([parent, child], 40)
    a.signal(signal.SIGCONT)
    assert rows[parent.id].attempt == 2
    assert rows[child.id].result == {"n": 1, "sum": 1, "missing": []}
    assert BodyRun.objects.filter(job_id=child.id).count() == 1
    a.stop()
    assert Job.objects.get(id=child.id).runs == 1


def test_many_parents_on_many_workers_fire_the_callback_once(start_worker):
    with leasejobs.workflow("fan-in 200") as wf:
        parents = [wf.add(leaf, args=(i,)) for i in range(200)]
        callback = wf.add(gather, after=parents)
    for _ in range(3):
        start_worker("--concurrency", "4")
    rows = _settled([*parents, callback], 90)
    assert rows[callback.id].result == {"n": 200, "sum": sum(range(200)), "missing": []}
    last = max(rows[p.id].finished_at for p in parents)
    assert rows[callback.id].started_at >= last
    assert BodyRun.objects.filter(job_id=callback.id).count() == 1
    assert isinstance(last, dt.datetime)


@pytest.mark.skipif(not HAS_DJANGO_TASKS, reason="Django Tasks need Django 6")
def test_a_workflow_mixes_django_tasks_of_the_leasejobs_backend(start_worker):
    from tests.testapp import django_tasks

    with leasejobs.workflow("mixed") as wf:
        answer = wf.add(django_tasks.meaning_of_life, priority=3)
        after = wf.add(node, args=("after a Django Task",), after=[answer])
    assert isinstance(answer, Job) and answer.workflow_id == wf.id
    assert Job.objects.get(id=answer.id).priority == 3
    start_worker("--concurrency", "2")
    rows = _settled([answer, after])
    assert rows[after.id].status == Job.Status.DONE
    assert rows[after.id].result["parents"] == {str(answer.id): 42}
    assert rows[after.id].started_at >= rows[answer.id].finished_at
