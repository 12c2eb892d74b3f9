"""Steps storm: durable steps, sleeps and waits while workers are SIGKILLed and SIGSTOPped.

Every ~1.3 s a random worker is killed (and replaced) or paused for 2-3
leases; the test sends each job's event, half of them before the job waits
and half while the storm runs. Each job (``chaos_steps``) runs two steps,
sleeps durably, waits for its event and runs a last step, each step writing
one ``Sent`` row with its checkpoint. At the end every job is done, each of
its steps stored once with exactly one write, by the attempt that stored it;
its result names the steps' attempts and its event's payload; no token ran
under two workers; every "done" line belongs to the job's final attempt.
"""

import random
import signal
import time

import leasejobs
from tests.chaos.helpers import Fleet, check_steps, resume_due, storm, unfinished, wait_finished
from tests.helpers import WorkerProcess
from tests.testapp.step_tasks import chaos_key, chaos_steps

JOBS = 150
WORKERS = 3
LEASE = 1.0


@storm(36)
def test_steps_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "steps", ["--lease", str(LEASE), "--concurrency", "4"])
    job_ids = [chaos_steps.enqueue(0.2).id for _ in range(JOBS)]
    random.shuffle(late := list(job_ids))
    early, late = late[: JOBS // 2], late[JOBS // 2 :]
    for job_id in early:
        leasejobs.send_event(chaos_key(job_id), {"job": job_id})
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    paused: dict[WorkerProcess, float] = {}
    kills = pauses = 0
    deadline = time.monotonic() + 120
    while unfinished(job_ids) and time.monotonic() < deadline:
        time.sleep(random.uniform(1.0, 1.6))
        now = time.monotonic()
        resume_due(paused, now)
        for _ in range(min(len(late), 12)):
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
    wait_finished(job_ids, timeout=60)
    fleet.stop_all()
    record_figures("steps storm", check_steps(job_ids, fleet, kills=kills, pauses=pauses))
