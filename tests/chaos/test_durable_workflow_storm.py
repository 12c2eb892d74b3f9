"""Durable workflow storm: workflows whose jobs run steps, sleep and wait for events, under kills and pauses.

Sixteen order pipelines, each a workflow: a charge (``tests.chaos.tasks.effect``),
then three jobs after it that each run two durable steps, sleep durably,
wait for their event and run a last step (``chaos_steps``), then a shipment
after those three (``effect``). Half the events are sent before the workers
start, the rest while every ~1.3 s a random worker of three is SIGKILLed and
replaced or SIGSTOPped for 2-3 leases. At the end the checks of both storms
hold together: each charge and shipment done once with one side effect and
one delivery by the attempt that held it; each step stored once with one
write, by the attempt that stored it, its event received; no token ran under
two workers; every edge fired once and in order (no body of a job started
before its last parent's finish), and no job is left waiting.
"""

import random
import signal
import time

import leasejobs
from leasejobs.models import Job
from tests.chaos.helpers import (
    Fleet,
    check,
    check_steps,
    early_children,
    resume_due,
    storm,
    unfinished,
    wait_finished,
)
from tests.chaos.tasks import effect
from tests.helpers import WorkerProcess
from tests.testapp.step_tasks import chaos_key, chaos_steps

PIPELINES = 16
WIDTH = 3
WORKERS = 3
LEASE = 1.0


@storm(36)
def test_durable_workflow_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "durable-workflow", ["--lease", str(LEASE), "--concurrency", "4"])
    ends: list[int] = []  # the charges and shipments
    steps: list[int] = []  # the jobs of steps, sleeps and events between them
    for n in range(PIPELINES):
        with leasejobs.workflow(f"order {n}") as wf:
            charge = wf.add(effect, args=(0.2,))
            middle = [wf.add(chaos_steps, args=(0.15,), after=[charge]) for _ in range(WIDTH)]
            ship = wf.add(effect, args=(0.2,), after=middle)
        ends += [charge.id, ship.id]
        steps += [m.id for m in middle]
    late = random.sample(steps, len(steps))
    for job_id in late[: len(late) // 2]:
        leasejobs.send_event(chaos_key(job_id), {"job": job_id})
    late = late[len(late) // 2 :]
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    job_ids = ends + steps
    paused: dict[WorkerProcess, float] = {}
    kills = pauses = 0
    deadline = time.monotonic() + 120
    while unfinished(job_ids) and time.monotonic() < deadline:
        time.sleep(random.uniform(1.0, 1.6))
        now = time.monotonic()
        resume_due(paused, now)
        for _ in range(min(len(late), 4)):
            job_id = late.pop()
            leasejobs.send_event(chaos_key(job_id), {"job": job_id})
        running = [w for w in fleet.live() if w not in paused]
        if len(running) < 2:
            continue
        victim = random.choice(running)
        if random.random() < 0.5:
            victim.signal(signal.SIGKILL)
            victim.wait()
            fleet.killed.add(fleet.worker_id(victim))
            kills += 1
            fleet.start()
        else:
            fleet.pause(victim)
            paused[victim] = now + random.uniform(2 * LEASE, 3 * LEASE)
            pauses += 1
    for w in paused:
        w.signal(signal.SIGCONT)
    for job_id in late:
        leasejobs.send_event(chaos_key(job_id), {"job": job_id})
    wait_finished(job_ids, timeout=90)
    fleet.stop_all()
    figures = check(ends, fleet, kills=kills, pauses=pauses)
    of_steps = check_steps(steps, fleet)
    early = early_children(job_ids)
    waiting = list(Job.objects.filter(id__in=job_ids, pending_parents__gt=0).values_list("id", flat=True))
    figures.update(
        {
            "jobs": len(job_ids),
            "done": figures["done"] + of_steps["done"],
            "body runs": figures["body runs"] + of_steps["body runs"],
            "tokens held by two workers": figures["tokens held by two workers"]
            + of_steps["tokens held by two workers"],
            "steps stored": of_steps["steps stored"],
            "suspends": of_steps["suspends"],
            "early children": len(early),
            "problems": figures["problems"]
            + of_steps["problems"]
            + [f"child {c} started before parent {p} finished" for p, c in early]
            + [f"job {j} still waits for a parent" for j in waiting],
        }
    )
    record_figures("durable workflow storm", figures)
