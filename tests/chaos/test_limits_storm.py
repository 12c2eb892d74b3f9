"""Limits storm: a queue limited to 3 running jobs, while workers are SIGKILLed
and SIGSTOPped past their lease.

The limit is held by numbered places taken inside the claim and tied to the
attempt's lease (docs/queue-controls.md). A killed or stopped worker's places
free up when its lease runs out, so the queue keeps moving; and at no instant
do more than 3 attempts that hold their lease run bodies. That count comes
from the jobs' own journal: a body runs from its start line until its end
line, or until its worker was killed or stopped (from then on its attempt
holds no lease: a stopped worker is stopped past its lease, and whatever its
body does after it resumes is fenced off). A body that begins after such a
stop (the worker was stopped between taking the job and starting it) holds
no lease from its first line: the journal asks the database at the start
and notes it ``X``. An ``X`` that no stop of its worker just before explains
(a claim that took no place, or a place taken twice) is a problem. Every job still ends done once,
with one side effect (``check``).
"""

import random
import signal
import time
from pathlib import Path

from django.db.models.functions import Now

from leasejobs.models import Slot
from leasejobs.queues import controls
from tests.chaos.helpers import Fleet, check, storm, unfinished, wait_finished
from tests.chaos.tasks import journaled_effect
from tests.helpers import WorkerProcess
from tests.journal import most_at_once, read, read_unbacked

JOBS = 180
WORKERS = 4
LIMIT = 3
LEASE = 1.0
#: A body that began without its lease and place is explained by a stop of its
#: worker at most this long before it began (a stop lasts 2.5 leases).
STOPPED_BEFORE = LEASE * 4


def _places_held() -> int:
    return Slot.objects.filter(kind="concurrency", held_until__gte=Now()).count()


@storm(40)
def test_limits_storm(start_worker, record_figures, tmp_path: Path):
    path = tmp_path / "journal"
    controls.set_limits("limited", concurrency=LIMIT)
    jobs = journaled_effect.using(queue="limited").bulk_enqueue([((str(path), 0.2), {}) for _ in range(JOBS)])
    job_ids = [j.id for j in jobs]
    fleet = Fleet(start_worker, "limits", ["--lease", str(LEASE), "--concurrency", "8", "--queue", "limited"])
    for _ in range(WORKERS):
        fleet.start()
    fleet.wait_started()
    cut: dict[str, list[float]] = {}  # worker id -> times it was killed or stopped
    stopped: dict[WorkerProcess, float] = {}  # worker -> when to resume it
    kills = stops = 0
    deadline = time.monotonic() + 120
    next_blow = time.monotonic() + 1.0
    while unfinished(job_ids) and time.monotonic() < deadline:
        now = time.monotonic()
        for w, resume_at in list(stopped.items()):
            if now >= resume_at:
                w.signal(signal.SIGCONT)
                del stopped[w]
        live = [w for w in fleet.live() if w not in stopped]
        if now >= next_blow and len(live) > 1:
            victim = random.choice(live)
            cut.setdefault(fleet.worker_id(victim), []).append(time.time())
            if random.random() < 0.5:
                victim.signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                fleet.start()
            else:
                fleet.pause(victim)
                stopped[victim] = now + LEASE * 2.5
                stops += 1
            next_blow = now + random.uniform(1.0, 2.0)
        time.sleep(0.05)
    for w in stopped:
        w.signal(signal.SIGCONT)
    wait_finished(job_ids, timeout=60)
    fleet.stop_all()

    starts, ends, workers = read(path)
    unbacked, unexplained = read_unbacked(path), []
    # A body with no end line was killed: by the test (its worker's cut), or by its zygote
    # when its worker could not renew the lease in time (a loaded machine, a 1 s lease).
    # Either way its attempt held nothing once the job's next attempt began: that
    # attempt's claim needed the lease run out and the place free.
    begun: dict[int, list[tuple[int, float]]] = {}
    for (job_id, attempt), start in [*starts.items(), *((k, v[0]) for k, v in unbacked.items())]:
        begun.setdefault(job_id, []).append((attempt, start))
    intervals = []
    for key, start in starts.items():
        later = [t for attempt, t in begun[key[0]] if attempt > key[1]]
        end = ends.get(key, min(later, default=float("inf")))
        cuts = [t for t in cut.get(workers[key], []) if t >= start]
        intervals.append((start, min([end, *cuts])))
    for key, (began, worker) in unbacked.items():
        cuts = cut.get(worker, [])
        if any(began - STOPPED_BEFORE <= t < began for t in cuts):
            continue  # stopped after taking the job, before its body began: fenced, holds nothing
        during = [t for t in cuts if began <= t < ends.get(key, float("inf"))]
        if during:  # stopped between the stamp and the question: it held its place until the stop
            intervals.append((began, min(during)))
        else:
            unexplained.append(key)
    most = most_at_once(intervals)
    figures = check(job_ids, fleet, kills=kills, stops=stops)
    figures["most bodies at once"] = most
    figures["bodies begun without their lease and place"] = len(unbacked)
    # A worker resumed from a stop near the end renews its stale attempt's own old place
    # once more (its body may still run), until its heartbeat finds the job gone: every
    # place must be free within a few leases of the last job's end.
    deadline = time.monotonic() + 4 * LEASE
    while time.monotonic() < deadline and _places_held():
        time.sleep(0.1)
    figures["places left held"] = _places_held()
    if not starts:
        figures["problems"].append("no body began holding its lease and place")
    if unexplained:
        figures["problems"].append(
            f"{len(unexplained)} bodies began without their lease or place, their worker not stopped "
            f"just before (first: job {unexplained[0][0]} attempt {unexplained[0][1]})"
        )
    if most > LIMIT:
        figures["problems"].append(f"{most} bodies holding a lease ran at once, over the limit of {LIMIT}")
    if figures["places left held"]:
        figures["problems"].append(f"{figures['places left held']} place(s) still held after every job ended")
    record_figures("limits storm", figures)
