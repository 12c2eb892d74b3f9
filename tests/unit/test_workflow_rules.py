"""The edge rules of workflows, on the database without workers: a job's finish is
played by ``leasejobs_settle_parents`` (what FINISH calls for the rows it wrote),
and the admin page draws what the rows say.

A Hypothesis state machine plays random graphs and random outcomes against a
model: a child is due exactly when every parent is done (or ended, for a child
that runs anyway), and a failure cancels exactly the waiting descendants that
do not run anyway.
"""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import leasejobs
from leasejobs.db import facade, sql
from leasejobs.models import Job
from tests.testapp.workflow_tasks import gather, leaf, node

pytestmark = pytest.mark.django_db


def end(job_id: int, status: str) -> None:
    """End a job as a worker's finish would, then settle its edges (FINISH does both in one statement)."""
    Job.objects.filter(id=job_id).update(status=status, finished_at=Now())
    with connection.cursor() as cursor:
        cursor.execute("SELECT leasejobs_settle_parents(%s, %s, NULL)", [[job_id], [status]])


def due(job_id: int) -> bool:
    job = Job.objects.get(id=job_id)
    return job.status == "queued" and job.run_at.year < 9999


def test_a_child_is_due_only_after_its_last_parent():
    with leasejobs.workflow("rule") as wf:
        a, b = wf.add(leaf, args=(1,)), wf.add(leaf, args=(2,))
        c = wf.add(gather, after=[a, b])
    assert due(a.id) and due(b.id) and not due(c.id)
    assert Job.objects.get(id=c.id).pending_parents == 2
    end(a.id, "done")
    assert not due(c.id) and Job.objects.get(id=c.id).pending_parents == 1
    end(b.id, "done")
    assert due(c.id)
    assert Job.objects.get(id=c.id).pending_parents == 0


def test_a_run_anyway_edge_counts_once_when_its_failed_parent_is_retried_and_done():
    with leasejobs.workflow("rule") as wf:
        a, b = wf.add(leaf, args=(1,)), wf.add(leaf, args=(2,))
        c = wf.add(gather, after=[a, b], on_parent_failure="run")
    end(a.id, "failed")
    assert Job.objects.get(id=c.id).pending_parents == 1
    row = Job.objects.get(id=a.id)
    params = {"ids": [a.id], "statuses": ["failed"], "attempts": [row.attempt], "channel": "x"}
    facade.admin_change(sql.ADMIN_RETRY, params)
    end(a.id, "done")  # the retried parent is done: its edge already fired
    assert Job.objects.get(id=c.id).pending_parents == 1 and not due(c.id)
    end(b.id, "done")
    assert due(c.id) and Job.objects.get(id=c.id).pending_parents == 0


def test_a_failure_cancels_waiting_descendants_but_not_run_anyway_ones():
    with leasejobs.workflow("rule") as wf:
        a = wf.add(leaf, args=(1,))
        b = wf.add(node, args=("b",), after=[a])
        c = wf.add(node, args=("c",), after=[b])
        d = wf.add(node, args=("d",), after=[b], on_parent_failure="run")
        e = wf.add(node, args=("e",), after=[d])
    end(a.id, "failed")
    rows = {j.id: j for j in Job.objects.all()}
    assert rows[b.id].status == rows[c.id].status == "cancelled"
    assert rows[c.id].last_error == f"cancelled: job {a.id} of its workflow failed"
    assert due(d.id)  # its parent b was cancelled: it runs anyway
    assert not due(e.id) and rows[e.id].status == "queued"
    end(d.id, "done")
    assert due(e.id)


def test_the_admin_retry_restores_what_a_failure_cancelled_and_keeps_a_waiting_job_waiting():
    with leasejobs.workflow("rule") as wf:
        a = wf.add(leaf, args=(1,))
        b = wf.add(node, args=("b",), after=[a])
        c = wf.add(node, args=("c",), after=[b])
    end(a.id, "failed")
    row = Job.objects.get(id=a.id)
    params = {"ids": [a.id], "statuses": ["failed"], "attempts": [row.attempt], "channel": "x"}
    facade.admin_change(sql.ADMIN_RETRY, params)
    assert due(a.id)
    assert [Job.objects.get(id=j.id).status for j in (b, c)] == ["queued", "queued"]
    assert not due(b.id) and not due(c.id)
    # "Retry now" of a job still waiting for its parents does not make it due.
    facade.admin_change(sql.ADMIN_RETRY, {**params, "ids": [c.id], "statuses": ["queued"], "attempts": [0]})
    assert not due(c.id)
    end(a.id, "done")
    assert due(b.id) and not due(c.id)


def ran_and_ended(job_id: int, status: str) -> None:
    """``end``, for a job whose body ran: claimed once (attempt 1), as a worker's job is."""
    Job.objects.filter(id=job_id).update(attempt=1)
    end(job_id, status)


def retry(*job_ids: int) -> None:
    """The admin's "Retry now" of ``job_ids``, as they are now."""
    rows = list(Job.objects.filter(id__in=job_ids).order_by("id"))
    params = {
        "ids": [r.id for r in rows],
        "statuses": [r.status for r in rows],
        "attempts": [r.attempt for r in rows],
        "channel": "x",
    }
    facade.admin_change(sql.ADMIN_RETRY, params)


def test_a_retry_leaves_cancelled_what_another_failed_parent_would_cancel():
    with leasejobs.workflow("rule") as wf:
        a, b = wf.add(leaf, args=(1,)), wf.add(leaf, args=(2,))
        c = wf.add(gather, after=[a, b])
        d = wf.add(node, args=("d",), after=[c])
        e = wf.add(node, args=("e",), after=[a])
    ran_and_ended(a.id, "failed")
    ran_and_ended(b.id, "failed")  # c was cancelled already: it settles nothing
    retry(a.id)
    rows = {j.id: j for j in Job.objects.all()}
    assert rows[e.id].status == "queued" and not due(e.id)  # a's alone: it waits for a again
    assert rows[c.id].status == rows[d.id].status == "cancelled"  # b's failure still holds
    assert rows[c.id].last_error == rows[d.id].last_error == f"cancelled: job {b.id} of its workflow failed"
    retry(b.id)  # both retried: nothing is left to cancel them
    assert [Job.objects.get(id=j.id).status for j in (c, d)] == ["queued", "queued"]
    end(a.id, "done")
    end(b.id, "done")
    assert due(c.id) and not due(d.id)


def test_retrying_every_failed_parent_at_once_restores_their_child():
    with leasejobs.workflow("rule") as wf:
        a, b = wf.add(leaf, args=(1,)), wf.add(leaf, args=(2,))
        c = wf.add(gather, after=[a, b])
    ran_and_ended(a.id, "failed")
    ran_and_ended(b.id, "cancelled")
    retry(a.id, b.id)
    assert Job.objects.get(id=c.id).status == "queued" and not due(c.id)


def test_a_run_anyway_child_not_started_waits_again_for_a_retried_parent():
    with leasejobs.workflow("rule") as wf:
        a, b = wf.add(leaf, args=(1,)), wf.add(leaf, args=(2,))
        c = wf.add(gather, after=[a, b], on_parent_failure="run")
        m = wf.add(node, args=("m",), after=[a])
        r = wf.add(node, args=("r",), after=[m], on_parent_failure="run")
    ran_and_ended(a.id, "failed")  # m cancelled; r's edge from m fires: r is due
    ran_and_ended(b.id, "done")
    assert due(c.id) and due(r.id)
    retry(a.id)  # a, and m it restores, are not ended any more: c and r wait for them
    assert Job.objects.get(id=c.id).pending_parents == 1 and not due(c.id)
    assert Job.objects.get(id=r.id).pending_parents == 1 and not due(r.id)
    ran_and_ended(a.id, "done")
    assert due(c.id) and due(m.id) and not due(r.id)
    ran_and_ended(m.id, "done")
    assert due(r.id)


def test_a_run_anyway_child_that_started_keeps_what_it_saw_when_its_parent_is_retried():
    with leasejobs.workflow("rule") as wf:
        a = wf.add(leaf, args=(1,))
        c = wf.add(gather, after=[a], on_parent_failure="run")
    ran_and_ended(a.id, "failed")
    Job.objects.filter(id=c.id).update(status="running", attempt=1, leased_by="w")
    retry(a.id)
    row = Job.objects.get(id=c.id)
    assert (row.status, row.pending_parents) == ("running", 0)
    ran_and_ended(a.id, "done")  # its edge fired when it failed: it does not count again
    assert Job.objects.get(id=c.id).pending_parents == 0


def test_the_workflow_page_draws_the_graph_and_the_path_that_failed():
    with leasejobs.workflow("page") as wf:
        a = wf.add(leaf, args=(1,))
        many = [wf.add(leaf, args=(i,), after=[a]) for i in range(30)]
        b = wf.add(gather, after=many)
    end(a.id, "failed")
    user = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(user)
    response = client.get(reverse("admin:leasejobs_workflow_change", args=[wf.id]))
    assert response.status_code == 200
    text = response.content.decode()
    assert "<svg" in text and "leasejobs-failed-edge" in text
    assert "+18 jobs" in text  # a level of 30 is drawn as 12 boxes and one group
    assert "The path that failed" in text and f"#{b.id}" in text
    assert "32 jobs" in text and "1 failed" in text and "31 cancelled" in text
    job_page = client.get(reverse("admin:leasejobs_job_change", args=[b.id])).content.decode()
    assert reverse("admin:leasejobs_workflow_change", args=[wf.id]) in job_page
    client.post(reverse("admin:leasejobs_workflow_cancel", args=[wf.id]))  # nothing left to cancel
    assert Job.objects.filter(status="queued").count() == 0


class EdgeMachine(RuleBasedStateMachine):
    """Random DAGs, random outcomes in random order, against the model of the edge rule."""

    @initialize(
        shape=st.lists(
            st.tuples(st.sets(st.integers(0, 30), max_size=3), st.booleans()), min_size=1, max_size=12
        )
    )
    def build(self, shape):
        Job.objects.all().delete()
        self.parents: dict[int, list[int]] = {}
        self.run_anyway: dict[int, bool] = {}
        self.ids: list[int] = []
        with leasejobs.workflow("model") as wf:
            for picks, run in shape:
                after = sorted({self.ids[p % len(self.ids)] for p in picks}) if self.ids else []
                job = wf.add(
                    leaf,
                    args=(len(self.ids),),
                    after=[wf._nodes[i] for i in after],
                    on_parent_failure="run" if run else "cancel",
                )
                self.ids.append(job.id)
                self.parents[job.id] = after
                self.run_anyway[job.id] = run
        self.status = {i: "queued" for i in self.ids}

    def _ready(self, job_id: int) -> bool:
        ok = ("done", "failed", "cancelled") if self.run_anyway[job_id] else ("done",)
        return all(self.status[p] in ok for p in self.parents[job_id])

    def _cascade(self) -> None:
        changed = True
        while changed:
            changed = False
            for i in self.ids:
                ended = any(self.status[p] in ("failed", "cancelled") for p in self.parents[i])
                if self.status[i] == "queued" and not self.run_anyway[i] and ended:
                    self.status[i] = "cancelled"
                    changed = True

    def runnable(self) -> list[int]:
        return [i for i in self.ids if self.status[i] == "queued" and self._ready(i)]

    @precondition(lambda self: bool(self.runnable()))
    @rule(data=st.data(), outcome=st.sampled_from(["done", "done", "failed", "cancelled"]))
    def finish(self, data, outcome):
        job_id = data.draw(st.sampled_from(self.runnable()))
        end(job_id, outcome)
        self.status[job_id] = outcome
        self._cascade()

    @rule()
    def look(self):
        """Nothing to run (every job ended): the invariant is checked again."""

    @invariant()
    def matches_the_model(self):
        rows = {j.id: j for j in Job.objects.filter(id__in=self.ids)}
        for i in self.ids:
            assert rows[i].status == self.status[i], (i, rows[i].status, self.status[i])
            if self.status[i] == "queued":
                assert (rows[i].run_at.year < 9999) == self._ready(i), i


EdgeMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.django_db
def test_the_edge_rule_matches_its_model():
    EdgeMachine.TestCase("runTest").runTest()


def test_leasejobs_jobs_cancels_a_workflow_and_lists_its_jobs():
    from io import StringIO

    from django.core.management import call_command

    with leasejobs.workflow("command") as wf:
        a = wf.add(leaf, args=(1,))
        b = wf.add(gather, after=[a])
    other = leaf.enqueue(2)
    Job.objects.filter(id=a.id).update(status="running", attempt=1, leased_by="w")
    out = StringIO()
    call_command("leasejobs_jobs", "cancel", "--workflow", str(wf.id), stdout=out)
    assert "2 job(s) cancelled of 2 matched" in out.getvalue()
    rows = {j.id: j for j in Job.objects.all()}
    assert rows[a.id].status == "running" and rows[a.id].cancel_requested  # asked to stop
    assert rows[b.id].status == "cancelled"
    assert rows[other.id].status == "queued"
    out = StringIO()
    call_command("leasejobs_jobs", "list", "--workflow", str(wf.id), stdout=out)
    listed = [line.split("\t")[0] for line in out.getvalue().splitlines()[1:-1]]
    assert sorted(listed) == sorted([str(a.id), str(b.id)])
