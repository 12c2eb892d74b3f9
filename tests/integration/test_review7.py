"""Review 7: ``later`` NOTIFYs, walks from the front asked by a NOTIFY, places of jobs
queued again and the one-day lease (5ae08d2 and the four commits before it), attacked
with real ``runworker`` processes."""

import contextlib
import signal
import time
from pathlib import Path

from django.db import transaction

from leasejobs.models import Job
from leasejobs.queues import controls
from tests.helpers import wait_until
from tests.integration.test_claim_queues import _backend
from tests.testapp.tasks import record, sleeper, until_file

#: A worker whose only wake-ups are its NOTIFYs: it polls every 30 s.
LONG_POLL = {"DJANGO_SETTINGS_MODULE": "tests.review7_settings"}


def _status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def _listening(worker_id: str) -> None:
    """Wait until the worker's LISTEN connection is up and idle (it hears NOTIFYs)."""
    wait_until(
        lambda: _backend(f"leasejobs listen {worker_id}") is not None,
        timeout=30,
        what=f"{worker_id} listening",
    )


def _limited_queue_after_a_pause(
    start_worker, tmp_path: Path, queue: str, worker_id: str, *, later: bool
) -> float:
    """Queue ``queue`` runs one job at a time. Worker W1 (``--max-jobs 1``) runs job A
    (until the test creates its file); job B waits for A's place. Worker W2 (a 30 s
    poll) serves the queue and is stopped (SIGSTOP, as a paused or swapped-out worker)
    while A finishes, which frees the place and NOTIFYs the bare queue name; if
    ``later``, a job C due in 8 s is enqueued in the queue meanwhile (its NOTIFY marked
    ``later``). W2 is resumed (SIGCONT): the seconds until B runs. (A ran 2 s at first:
    on a loaded machine W2's start-up outlasted it, and B ran before the pause.)"""
    go = tmp_path / f"{worker_id}.go"
    controls.set_limits(queue, concurrency=1)
    w1 = start_worker("--worker-id", f"{worker_id}-1", "--queue", queue, "--max-jobs", "1")
    a = until_file.using(queue=queue).enqueue(str(go))
    wait_until(lambda: _status(a) == "running", timeout=30, what="job A running in W1")
    w2 = start_worker("--worker-id", f"{worker_id}-2", "--queue", queue, env=LONG_POLL)
    w2.wait_for_log("worker started", timeout=30)
    _listening(f"{worker_id}-2")
    b = record.using(queue=queue).enqueue(1)
    time.sleep(0.5)
    assert _status(b) == "queued"
    w2.signal(signal.SIGSTOP)
    try:
        go.touch()
        wait_until(lambda: _status(a) == "done", timeout=30, what="job A done (its place freed)")
        if later:
            record.using(queue=queue, delay=8).enqueue(2)
        time.sleep(0.5)
        assert _status(b) == "queued"
    finally:
        w2.signal(signal.SIGCONT)
    resumed = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _status(b) != "queued", timeout=12, what="job B claimed")
    took = time.monotonic() - resumed
    assert w2.proc.poll() is None, w2.log()[-3000:]
    w1.wait(timeout=30)
    return took


def test_a_freed_place_heard_with_a_later_job_of_its_queue_wakes_the_worker(start_worker, tmp_path):
    """BREAKS. What I did: ``_limited_queue_after_a_pause(later=True)``: while W2 is
    stopped, its queue's freed place (a bare ``lim7a`` NOTIFY, from W1's finish) and a job
    due in 8 s (``lim7a<US>0<US>...<US>later``) reach its listen socket; resumed, the
    listener reads both in one batch and hands the claimer one ``Heard`` for the queue:
    no place of a due job, one ``later`` place, no front. ``Claimer.notified`` returns
    early when the later places moved no key (``elif not heard.front and heard.later
    and not moved: return``), before ``self.limits.notified(queue)``: the freed place's
    wake-up is dropped with it. What happened: job B waits for the poll (30 s here),
    not run within 12 s of the resume. The same two NOTIFYs coalesce without a pause
    whenever they arrive in one packet, or while the listener's thread claims on its
    connection (psycopg's backlog). docs/queue-controls.md: "Freed places send a
    NOTIFY with the queue's name, so workers waiting on a limit claim at once instead
    of at their next poll"; docs/guarantees.md: a ``later`` job "wakes a claim only
    when it lies behind a key" (it must not also unwake what else was heard)."""
    took = _limited_queue_after_a_pause(start_worker, tmp_path, "lim7a", "freed-later", later=True)
    assert took < 6, f"the job waiting for the freed place was claimed {took:.1f} s after the resume"


def test_a_freed_place_heard_alone_after_a_pause_wakes_the_worker(start_worker, tmp_path):
    """HOLDS (the control of the test above): the same without job C; the bare NOTIFY
    alone wakes W2 and job B is claimed within seconds of the resume."""
    took = _limited_queue_after_a_pause(start_worker, tmp_path, "lim7b", "freed-alone", later=False)
    assert took < 6, f"the job waiting for the freed place was claimed {took:.1f} s after the resume"


def test_a_limited_queue_named_with_a_front_tail_hears_its_freed_places(start_worker):
    """BREAKS. Queue names may hold any character (``validate_queue``; the listener's
    docstring: "the fields are taken from the right, so a queue name may hold anything").
    What I did: queue ``lim7c<US>front`` (US: the unit separator) runs one job at a time;
    a worker (30 s poll, ``--queue`` that name) is given jobs A (1 s) and B. A's finish
    frees its place and NOTIFYs the bare queue name, which ``parse_payload`` now reads as
    ``FRONT`` for the queue ``lim7c``: the worker drops it (not its queue), and any worker
    of ``lim7c`` walks from the front for it. What happened: B waits for the poll (30 s),
    not run within 12 s of A's end. docs/queue-controls.md: "Freed places send a NOTIFY
    with the queue's name, so workers waiting on a limit claim at once instead of at their
    next poll". (The same name's ``pause_queue`` NOTIFY asks ``lim7c``'s workers for a
    walk.)"""
    took = _freed_place_wait(start_worker, "lim7c\x1ffront", "front-tail")
    assert took < 6, f"the job waiting for the freed place was claimed {took:.1f} s after it was freed"


def test_a_limited_queue_hears_its_freed_places(start_worker):
    """HOLDS (the control of the test above): the same with the queue ``lim7d``; B is
    claimed within seconds of A's end."""
    took = _freed_place_wait(start_worker, "lim7d", "plain-name")
    assert took < 6, f"the job waiting for the freed place was claimed {took:.1f} s after it was freed"


def _freed_place_wait(start_worker, queue: str, worker_id: str) -> float:
    """``queue`` runs one job at a time; a worker of it (30 s poll) runs job A (1 s) while
    B waits: the seconds from A's end until B is claimed."""
    controls.set_limits(queue, concurrency=1)
    worker = start_worker("--worker-id", worker_id, "--queue", queue, "--concurrency", "2", env=LONG_POLL)
    worker.wait_for_log("worker started", timeout=30)
    _listening(worker_id)
    a = sleeper.using(queue=queue).enqueue(1.0)
    wait_until(lambda: _status(a) == "running", timeout=15, what="job A running")
    b = record.using(queue=queue).enqueue(1)
    wait_until(lambda: _status(a) == "done", timeout=15, what="job A done (its place freed)")
    ended = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _status(b) != "queued", timeout=12, what="job B claimed")
    took = time.monotonic() - ended
    assert worker.proc.poll() is None, worker.log()[-3000:]
    return took


def _late_commit_wait(
    start_worker, queue: str, worker_id: str, delay: float, *, limited: bool = False
) -> float:
    """A worker of ``queue`` (30 s poll) with keys (its first job done) sits idle; a
    request enqueues a job due in ``delay`` seconds in its transaction and commits 1.5 s
    later (the job is due at its commit): the seconds from the commit until it runs.
    ``limited``: the queue has a concurrency limit of 5."""
    if limited:
        controls.set_limits(queue, concurrency=5)
    worker = start_worker("--worker-id", worker_id, "--queue", queue, "--concurrency", "2", env=LONG_POLL)
    first = record.using(queue=queue).enqueue(0)
    wait_until(lambda: _status(first) == "done", timeout=30, what="the first job done (keys)")
    _listening(worker_id)
    time.sleep(0.5)
    with transaction.atomic():
        late = record.using(queue=queue, delay=delay).enqueue(1)
        time.sleep(1.5)
    committed = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: _status(late) == "done", timeout=12, what="the job committed late done")
    took = time.monotonic() - committed
    assert worker.proc.poll() is None, worker.log()[-3000:]
    return took


def test_a_short_delayed_job_of_a_limited_queue_committed_late_wakes_its_worker(start_worker):
    """BREAKS. What I did: queue ``lim7e`` has a concurrency limit of 5 (room to spare);
    its idle worker (30 s poll) has keys. A request enqueues ``record.using(delay=0.2)``
    and commits 1.5 s later: due at its commit, announced ``lim7e<US>0<US>...<US>later``.
    The key does not move (the job lies after it: nothing was claimed meanwhile), so
    ``Claimer.notified`` returns before ``self.limits.notified(queue)``; a job under
    limits is only claimed by the limited claim, which nothing now makes due. What
    happened: the job waits for the poll (30 s), not run within 12 s of its commit; the
    same job enqueued due (``delay=0``, the test below) runs at once.
    docs/guarantees.md / CHANGELOG [Unreleased] Fixed: a job due within 10 s of its
    INSERT whose transaction committed after it fell due "now sends its keyed NOTIFY";
    docs/queue-controls.md: a NOTIFY naming a limited queue makes its claim due."""
    took = _late_commit_wait(start_worker, "lim7e", "late-limited", 0.2, limited=True)
    assert took < 6, f"the short-delayed job committed late ran {took:.1f} s after its commit"


def test_a_due_job_of_a_limited_queue_committed_late_wakes_its_worker(start_worker):
    """HOLDS (the control of the test above): the same job enqueued due (no delay) runs
    within seconds of its commit."""
    took = _late_commit_wait(start_worker, "lim7f", "due-limited", 0, limited=True)
    assert took < 6, f"the due job committed late ran {took:.1f} s after its commit"


def test_a_short_delayed_job_committed_late_wakes_an_idle_worker(start_worker):
    """BREAKS (a gap the docs word around: a ``later`` job "wakes a claim only when it lies
    behind a key"). What I did: an idle worker of queue ``plain7`` (30 s poll) has keys;
    a request enqueues ``record.using(delay=0.2)`` and commits 1.5 s later, due at its
    commit. Nothing was claimed meanwhile, so the job lies after the key: no key moves,
    ``Claimer.notified`` returns, nothing claims. What happened: the job waits for the
    poll (30 s), not run within 12 s of its commit, where the same job with no delay,
    committed as late, runs at once (``test_a_due_job_committed_late_wakes_an_idle_worker``).
    The NOTIFY that would wake the worker is delivered; whether the job is due when heard
    (its ``run_at`` against the clock) is never asked. CHANGELOG [Unreleased]: the job
    "due within 10 s of its INSERT whose transaction committed after it fell due" was
    the hole fixed."""
    took = _late_commit_wait(start_worker, "plain7", "late-plain", 0.2)
    assert took < 6, f"the short-delayed job committed late ran {took:.1f} s after its commit"


def test_a_due_job_committed_late_wakes_an_idle_worker(start_worker):
    """HOLDS (the control of the test above)."""
    took = _late_commit_wait(start_worker, "plain7b", "due-plain", 0)
    assert took < 6, f"the due job committed late ran {took:.1f} s after its commit"


def test_a_day_long_lease_runs_jobs_and_a_longer_one_is_refused(start_worker):
    """HOLDS. ``runworker --lease 86400`` (a day, the most: ``MAX_LEASE_SECONDS``) starts,
    claims and runs a job whose lease runs a day from its claim (its statements' timeout,
    a third of it, is one PostgreSQL takes); ``--lease 86401`` exits at once with the
    rule in one sentence, no traceback."""
    day = start_worker("--worker-id", "day-lease", "--lease", "86400")
    job = sleeper.enqueue(1.0)
    wait_until(lambda: _status(job) == "running", timeout=30, what="the job running under a day's lease")
    until = Job.objects.get(pk=job.pk).lease_until
    left = (until - Job.objects.get(pk=job.pk).created_at).total_seconds()
    assert 86000 < left < 86500, left
    wait_until(lambda: _status(job) == "done", timeout=30, what="the job done under a day's lease")
    assert day.proc.poll() is None
    longer = start_worker("--worker-id", "longer-lease", "--lease", "86401")
    assert longer.wait(timeout=60) != 0
    assert "not a lease of at least 1 second and a day at most" in longer.log(), longer.log()[-2000:]
    assert "Traceback" not in longer.log()
