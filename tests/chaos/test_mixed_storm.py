"""Mixed storm: issue 10's ways to run a job twice or stall, all at once.

Three workers with a 5 s lease run five kinds of jobs: plain ones
(``effect``), bodies longer than their task's own 1 s lease
(``short_lease``), slow calls inside the side-effect block, past the task's
1.5 s lease (``long_block``), bodies that stop when cancelled
(``cancellable``), and results PostgreSQL cannot store (``nul_result``, a
NUL in jsonb, one attempt allowed). Meanwhile, every ~1.2 s one of: a worker
SIGKILLed and replaced (the cancellable jobs it held, orphaned now, get a
cancel request), a worker SIGSTOPped for 2-3 s (past the short leases), or a
cancel request for a running cancellable job.

The shared ``check`` then holds: every job done, or failed only once its
allowed attempts had started (the NUL jobs: one), or cancelled only where a
cancel was requested; one delivery per side effect; no token under which two
workers ran the body; and the workers still alive stop cleanly.
"""

import random
import signal
import time

from leasejobs.models import Job
from tests.chaos import tasks
from tests.chaos.helpers import Fleet, check, unfinished, wait_finished
from tests.helpers import WorkerProcess

WORKERS = 3
#: (task, args, how many)
MIX = [
    (tasks.effect, (0.3,), 100),
    (tasks.short_lease, (2.5,), 40),
    (tasks.long_block, (2.5,), 24),
    (tasks.cancellable, (2.0,), 24),
    (tasks.nul_result, (), 12),
]


def _cancel(**filters: object) -> int:
    """Ask running cancellable jobs to stop, as the admin's cancel action does."""
    return Job.objects.filter(task_name=tasks.cancellable.name, status="running", **filters).update(
        cancel_requested=True
    )


def test_mixed_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "mixed", ["--lease", "5", "--concurrency", "4"])
    job_ids = [j.id for t, args, n in MIX for j in t.bulk_enqueue([(args, {}) for _ in range(n)])]
    random.shuffle(job_ids)
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    paused: dict[WorkerProcess, float] = {}  # worker -> when to resume it
    kills = pauses = cancels = orphan_cancels = 0
    deadline = time.monotonic() + 45
    next_event = time.monotonic() + 1.0
    while unfinished(job_ids) and time.monotonic() < deadline:
        now = time.monotonic()
        for w, resume_at in list(paused.items()):
            if now >= resume_at:
                w.signal(signal.SIGCONT)
                del paused[w]
        if now >= next_event:
            next_event = now + random.uniform(1.0, 1.4)
            running = [w for w in fleet.live() if w not in paused]
            event = random.choice(["kill", "pause", "cancel"])
            if event == "kill" and running:
                victim = random.choice(running)
                victim.signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                orphan_cancels += _cancel(leased_by=fleet.worker_id(victim), cancel_requested=False)
                fleet.start()
            elif event == "pause" and len(running) > 1:  # someone must be there to take over
                victim = random.choice(running)
                victim.signal(signal.SIGSTOP)
                paused[victim] = now + random.uniform(2.0, 3.0)
                pauses += 1
            else:
                ids = list(
                    Job.objects.filter(
                        task_name=tasks.cancellable.name, status="running", cancel_requested=False
                    ).values_list("id", flat=True)[:2]
                )
                cancels += _cancel(id__in=ids)
        time.sleep(0.1)
    for w in paused:
        w.signal(signal.SIGCONT)
    wait_finished(job_ids, timeout=30)
    fleet.stop_all()
    record_figures(
        "mixed storm",
        check(
            job_ids,
            fleet,
            kills=kills,
            pauses=pauses,
            **{"cancels of running jobs": cancels, "cancels of orphaned jobs": orphan_cancels},
        ),
    )
