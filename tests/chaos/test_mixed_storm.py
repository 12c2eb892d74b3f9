"""Mixed storm: issue 10's ways to run a job twice or stall, all at once.

Three workers with a 5 s lease run five kinds of jobs (``tests.chaos.tasks``):
plain ones (``effect``), bodies longer than their task's own 1 s lease
(``short_lease``), slow calls inside the side-effect block, past the task's
1.5 s lease (``long_block``), bodies that stop when cancelled
(``cancellable``), and results PostgreSQL cannot store (``nul_result``, a
NUL in jsonb, one attempt allowed). Meanwhile, every ~1.2 s one of: a worker
SIGKILLed and replaced (the cancellable jobs it held, orphaned now, get a
cancel request), a worker SIGSTOPped for 2-3 s (past the short leases), or a
cancel request for a running cancellable job.

The shared ``check`` then holds: every job done, or failed only once its
allowed attempts had started, or cancelled only where a cancel was
requested; one delivery per side effect; no token under which two workers
ran the body. And, for this storm: only the NUL jobs fail (the others allow
twenty attempts, more than any run of kills and pauses ends), and a job
cancelled while its worker lay dead ends cancelled, delivered by no later
attempt.
"""

import random
import signal
import time

from django.db import connection

from leasejobs.models import Job
from tests.chaos import tasks
from tests.chaos.helpers import Fleet, check, resume_due, storm, unfinished, wait_finished
from tests.helpers import WorkerProcess
from tests.testapp.models import Sent

WORKERS = 3
ROUNDS = 4
#: (task, args, how many), each a multiple of ROUNDS
MIX = [
    (tasks.effect, (0.3,), 80),
    (tasks.short_lease, (2.5,), 32),
    (tasks.long_block, (2.5,), 16),
    (tasks.cancellable, (2.0,), 20),
    (tasks.nul_result, (), 8),
]

#: Ask running cancellable jobs to stop, as the admin's cancel action does;
#: returns each job asked with the attempt it was at.
CANCEL = """
UPDATE leasejobs_job SET cancel_requested = true
WHERE task_name = %(task)s AND status = 'running' AND NOT cancel_requested
  AND (%(worker)s::text IS NULL OR leased_by = %(worker)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
RETURNING id, attempt
"""


def _cancel(worker: str | None = None, ids: list[int] | None = None) -> dict[int, int]:
    with connection.cursor() as cursor:
        cursor.execute(CANCEL, {"task": tasks.cancellable.name, "worker": worker, "ids": ids})
        return dict(cursor.fetchall())


def _running_cancellable(n: int) -> list[int]:
    return list(
        Job.objects.filter(
            task_name=tasks.cancellable.name, status="running", cancel_requested=False
        ).values_list("id", flat=True)[:n]
    )


def _storm_problems(job_ids: list[int], orphans: dict[int, int]) -> list[str]:
    """This storm's own rules, on top of the shared check."""
    problems = [
        f"job {j.id} ({j.task_name}) failed at attempt {j.attempt}: {j.last_error}"
        for j in Job.objects.filter(id__in=job_ids, status="failed").exclude(task_name=tasks.nul_result.name)
    ]
    for j in Job.objects.filter(id__in=orphans):
        later = Sent.objects.filter(job_id=j.id, attempt__gt=orphans[j.id]).count()
        if j.status != "cancelled" or later:
            problems.append(
                f"job {j.id} cancelled while orphaned at attempt {orphans[j.id]}: ended {j.status} at "
                f"attempt {j.attempt}, delivered {later}x by a later attempt"
            )
    return problems


@storm(36)
def test_mixed_storm(start_worker, record_figures):
    fleet = Fleet(start_worker, "mixed", ["--lease", "5", "--concurrency", "4"])
    # In four rounds, so that every kind of job runs all through the storm.
    job_ids = [
        j.id
        for _round in range(ROUNDS)
        for t, args, n in MIX
        for j in t.bulk_enqueue([(args, {}) for _ in range(n // ROUNDS)])
    ]
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    paused: dict[WorkerProcess, float] = {}  # worker -> when to resume it
    kills = pauses = cancels = 0
    orphans: dict[int, int] = {}  # job cancelled while its worker lay dead -> its attempt then
    deadline = time.monotonic() + 45
    next_event = time.monotonic() + 1.0
    while unfinished(job_ids) and time.monotonic() < deadline:
        now = time.monotonic()
        resume_due(paused, now)
        if now >= next_event:
            next_event = now + random.uniform(1.0, 1.4)
            running = [w for w in fleet.live() if w not in paused]
            event = random.choice(["kill", "pause", "cancel"])
            if event == "kill" and running:
                victim = random.choice(running)
                victim.signal(signal.SIGKILL)
                fleet.killed.add(fleet.worker_id(victim))
                victim.wait()
                kills += 1
                orphans.update(_cancel(worker=fleet.worker_id(victim)))
                fleet.start()
            elif event == "pause" and len(running) > 1:  # someone must be there to take over
                victim = random.choice(running)
                fleet.pause(victim)
                paused[victim] = now + random.uniform(2.0, 3.0)
                pauses += 1
            else:
                cancels += len(_cancel(ids=_running_cancellable(2)))
        time.sleep(0.1)
    for w in paused:
        w.signal(signal.SIGCONT)
    try:
        wait_finished(job_ids, timeout=30)
    except AssertionError:
        pass  # the jobs left unfinished are among the problems ``check`` lists, with the figures
    else:
        fleet.stop_all()
    figures = check(
        job_ids,
        fleet,
        kills=kills,
        pauses=pauses,
        **{"cancels of running jobs": cancels, "cancels of orphaned jobs": len(orphans)},
    )
    figures["problems"] += _storm_problems(job_ids, orphans)
    record_figures("mixed storm", figures)
