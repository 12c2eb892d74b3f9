"""Workflow storm: diamonds of chaos jobs while workers are SIGKILLed and SIGSTOPped.

24 diamonds (a root, 5 jobs after it, a callback after those: 168 jobs of
``tests.chaos.tasks.effect``) on 3 workers with a 1 s lease; every ~1.5 s a
random worker is killed and replaced, or paused for 2-3 leases. Besides the
scenario's usual ``check`` (each job done once, one side effect and one
delivery by the attempt that held it, no finish by a stale attempt): every
edge fired once and in order, that is no body of a child started before its
last parent's finish, and no child is left waiting.
"""

import random
import signal
import time

import leasejobs
from leasejobs.models import Job, WorkflowEdge
from tests.chaos.helpers import Fleet, check, early_children, resume_due, storm, unfinished, wait_finished
from tests.chaos.tasks import effect
from tests.helpers import WorkerProcess

DIAMONDS = 24
WIDTH = 5
WORKERS = 3
LEASE = 1.0


@storm(36)
def test_workflow_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "workflow", ["--lease", str(LEASE), "--concurrency", "4"])
    job_ids: list[int] = []
    with leasejobs.workflow("chaos diamonds") as wf:
        for _ in range(DIAMONDS):
            root = wf.add(effect, args=(0.2,))
            middle = [wf.add(effect, args=(0.3,), after=[root]) for _ in range(WIDTH)]
            callback = wf.add(effect, args=(0.2,), after=middle)
            job_ids += [root.id, *(m.id for m in middle), callback.id]
    workers: list[WorkerProcess] = [fleet.start() for _ in range(WORKERS)]
    fleet.wait_started()
    paused: dict[WorkerProcess, float] = {}
    kills = pauses = 0
    deadline = time.monotonic() + 120
    next_blow = time.monotonic() + 1.0
    while unfinished(job_ids) and time.monotonic() < deadline:
        now = time.monotonic()
        resume_due(paused, now)
        running = [w for w in workers if w not in paused and w.proc.poll() is None]
        if now >= next_blow and len(running) > 1:
            victim = random.choice(running)
            if random.random() < 0.5:
                victim.signal(signal.SIGKILL)
                victim.wait()
                workers[workers.index(victim)] = fleet.start()
                kills += 1
            else:
                fleet.pause(victim)
                paused[victim] = now + random.uniform(2 * LEASE, 3 * LEASE)
                pauses += 1
            next_blow = now + random.uniform(1.2, 1.8)
        time.sleep(0.1)
    for w in paused:
        w.signal(signal.SIGCONT)
    wait_finished(job_ids, timeout=60)
    fleet.stop_all()
    figures = check(job_ids, fleet, kills=kills, pauses=pauses)
    rows = {j.id: j for j in Job.objects.filter(id__in=job_ids)}
    early = early_children(job_ids)
    figures.update(edges=WorkflowEdge.objects.filter(child_id__in=job_ids).count(), early_children=len(early))
    record_figures("workflow storm", figures)
    assert not early, early
    assert all(r.status == "done" and r.pending_parents == 0 for r in rows.values())
