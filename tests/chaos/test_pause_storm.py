"""Pause storm: workers SIGSTOPped past their lease and resumed, beside live ones.

This is the process pause of Kleppmann's "How to do distributed locking"
(https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html):
a paused holder does not know its lease ran out. While it is stopped the live
workers take its jobs over; when it resumes, its side effects and finishes
carry a token that is no longer the job's, and are rejected.
"""

import random
import signal
import time

from tests.chaos.helpers import Fleet, check, enqueue_effects, resume_due, storm, unfinished, wait_finished
from tests.helpers import WorkerProcess

JOBS = 180
WORKERS = 3
LEASE = 1.0


@storm(36)
def test_pause_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "pause", ["--lease", str(LEASE), "--concurrency", "4"])
    job_ids = enqueue_effects(JOBS, seconds=0.4)
    workers = [fleet.start() for _ in range(WORKERS)]
    fleet.wait_started()
    paused: dict[WorkerProcess, float] = {}  # worker -> when to resume it
    pauses = 0
    deadline = time.monotonic() + 90
    next_pause = time.monotonic() + 1.0
    while unfinished(job_ids) and time.monotonic() < deadline:
        now = time.monotonic()
        resume_due(paused, now)
        running = [w for w in workers if w not in paused]
        # At most two of three stopped at once: someone must be there to take over.
        if now >= next_pause and len(running) > 1:
            victim = random.choice(running)
            fleet.pause(victim)
            paused[victim] = now + random.uniform(2 * LEASE, 3 * LEASE)  # well past its lease
            pauses += 1
            next_pause = now + random.uniform(1.2, 1.8)
        time.sleep(0.1)
    for w in paused:
        w.signal(signal.SIGCONT)
    wait_finished(job_ids, timeout=30)
    # The paused workers carried on: every one of them is alive and stops cleanly.
    assert len(fleet.live()) == WORKERS
    fleet.stop_all()
    record_figures("pause storm", check(job_ids, fleet, pauses=pauses))
