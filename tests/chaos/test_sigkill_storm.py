"""SIGKILL storm: a random worker is killed and replaced every ~1.5 s while jobs run.

A killed worker leaves its jobs running under a lease nobody renews; after the
lease (1 s here) another worker takes each over with a new attempt. Whatever
attempt a job's body was in when its worker died, the job ends done once,
with one side effect, written by the attempt that finished it.
"""

import random
import signal
import time

from tests.chaos.helpers import Fleet, check, enqueue_effects, storm, unfinished, wait_finished

JOBS = 300
WORKERS = 3


@storm(36)
def test_sigkill_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "kill", ["--lease", "1", "--concurrency", "4"])
    job_ids = enqueue_effects(JOBS, seconds=0.3)
    for _ in range(WORKERS):
        fleet.start()
    kills = 0
    deadline = time.monotonic() + 90
    while unfinished(job_ids) and time.monotonic() < deadline:
        time.sleep(random.uniform(1.2, 1.8))
        victim = random.choice(fleet.live())
        victim.signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        fleet.start()
    wait_finished(job_ids, timeout=30)
    fleet.stop_all()
    record_figures("SIGKILL storm", check(job_ids, fleet, kills=kills))
