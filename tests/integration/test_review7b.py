"""Review 7b: jobs announced ``later`` (``DueSoon``), the payload grammar and walks asked
for by ``front`` (b765caf), attacked with real ``runworker`` processes.

Every worker here polls every 30 s (``tests.review7_settings``), so that only its
NOTIFYs and ``DueSoon`` wake it: a wake-up lost shows as a job claimed a poll late.
The promise under attack (docs/guarantees.md): a job due within 10 s of its INSERT,
"heard before [it is due], the claim loop's wait ends at its ``run_at``"; CHANGELOG
[Unreleased]: "claimed at once if it is due when heard, else when it falls due, not at
the next poll".
"""

import contextlib
import os
import signal
import time

from django.db import transaction

from leasejobs.models import Job
from leasejobs.queues import controls
from tests.helpers import wait_until
from tests.integration.test_claim_queues import _stop_while_idle
from tests.integration.test_review7 import LONG_POLL, _listening, _status
from tests.testapp.tasks import record

#: How late after its ``run_at`` a job heard of before it was due may be claimed: the
#: claim's own time on a loaded two-core machine, not a poll (30 s here).
SLACK = 3.0


def _idle_worker_with_keys(start_worker, queue: str, worker_id: str):
    """A worker of ``queue`` (30 s poll) that has claimed and run one job of priority 0
    (it has keys), idle and listening."""
    worker = start_worker("--worker-id", worker_id, "--queue", queue, "--concurrency", "2", env=LONG_POLL)
    first = record.using(queue=queue).enqueue(0)
    wait_until(lambda: _status(first) == "done", timeout=30, what="the first job done (keys)")
    _listening(worker_id)
    time.sleep(0.5)
    return worker


def _late_by(job: Job, enqueued: float, delay: float, timeout: float = 20.0) -> float:
    """Seconds after its due time (``delay`` after ``enqueued``, this clock) that ``job``
    left the queue (``timeout`` past it if it never did)."""
    with contextlib.suppress(AssertionError):
        wait_until(
            lambda: _status(job) != "queued",
            timeout=max(0.0, enqueued + delay + timeout - time.monotonic()),
            what=f"job {job.pk} claimed",
        )
    return time.monotonic() - enqueued - delay


def test_a_later_job_heard_after_an_earlier_one_of_its_queue_is_claimed_when_due(start_worker):
    """BREAKS. What I did: an idle worker of queue ``due7b-two`` (30 s poll, keys) hears
    two jobs enqueued one after the other, J1 due in 2 s and J2 due in 6 s (each
    announced ``later``, neither lies behind a key). ``DueSoon.heard`` keeps one
    deadline per queue, the earliest: J2's is dropped ("a wake-up claims every due job
    of the queue anyway", due_soon.py). At J1's run_at the loop wakes, takes it, and
    its queue's deadline is forgotten (``take``); J2 is not due yet, and nothing
    remembers it. What happened: J2 waits for the poll, not claimed within 20 s of its
    run_at, where J1 (and J2 alone, the test below) are claimed when due. The
    docs: a job heard before it is due is claimed when it falls due, not at the next
    poll."""
    queue = "due7b-two"
    worker = _idle_worker_with_keys(start_worker, queue, "two-later")
    enqueued = time.monotonic()
    j1 = record.using(queue=queue, delay=2).enqueue(1)
    j2 = record.using(queue=queue, delay=6).enqueue(2)
    late1 = _late_by(j1, enqueued, 2)
    late2 = _late_by(j2, enqueued, 6)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    assert late1 < SLACK, f"J1 was claimed {late1:.1f} s after its run_at"
    assert late2 < SLACK, f"J2 (the second delayed job heard) was claimed {late2:.1f} s after its run_at"


def test_a_later_job_heard_alone_is_claimed_when_due(start_worker):
    """HOLDS (the control of the tests here): an idle worker of ``due7b-one`` (30 s poll,
    keys) hears one job due in 4 s; the loop's wait ends at its run_at and it is
    claimed then."""
    queue = "due7b-one"
    worker = _idle_worker_with_keys(start_worker, queue, "one-later")
    enqueued = time.monotonic()
    job = record.using(queue=queue, delay=4).enqueue(1)
    late = _late_by(job, enqueued, 4)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    assert late < SLACK, f"the delayed job was claimed {late:.1f} s after its run_at"


def test_a_later_job_enqueued_with_a_due_one_is_claimed_when_due(start_worker):
    """BREAKS. What I did: an idle worker of ``due7b-pair`` (30 s poll, keys); a request
    enqueues, in one transaction, job A due now and job B due in 4 s (a common shape:
    send now, check later). Their two NOTIFYs come in one packet, and the listener
    hands the claimer one ``Heard`` with A's place in ``places`` and B's in ``later``.
    ``Claimer.notified`` gives B to ``DueSoon`` only when nothing else was heard
    (``if heard.later and not (due or heard.places or heard.front or heard.news)``):
    here A was, so B is treated as news now, claimed for (not due yet: nothing),
    and forgotten. What happened: A runs at once, B waits for the poll (not claimed within 20 s of
    its run_at). The same B enqueued alone is claimed when due (the test above).
    The same holds when B's NOTIFY shares a packet with a freed place of its queue
    (``news``) or a ``front``."""
    queue = "due7b-pair"
    worker = _idle_worker_with_keys(start_worker, queue, "pair-later")
    with transaction.atomic():
        a = record.using(queue=queue).enqueue(1)
        b = record.using(queue=queue, delay=4).enqueue(2)
    enqueued = time.monotonic()
    wait_until(lambda: _status(a) == "done", timeout=10, what="job A (due at once) done")
    late = _late_by(b, enqueued, 4)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    assert late < SLACK, (
        f"job B, enqueued due in 4 s beside a due job, was claimed {late:.1f} s after its run_at"
    )


def test_a_later_job_of_a_priority_without_a_key_is_claimed_when_due(start_worker):
    """BREAKS. What I did: an idle worker of ``due7b-prio`` (30 s poll) has claimed jobs
    of priority 0 only (its keys: {0: ...}); a job of priority 5 due in 4 s is enqueued
    (announced ``later``). ``ClaimStart.heard`` makes a key for a priority that has
    none and says a key moved, which ``Claimer.notified`` reads as "the job lies behind
    a key, so it is due" (``due = ... self.start.heard(heard.later)``): it claims at
    once (nothing: the job is 4 s from due) and never gives the job to ``DueSoon``.
    What happened: the job waits for the poll, not claimed within 20 s of its run_at; the
    same job at priority 0 is claimed when due (the control above). Priorities are
    the Tasks API's own (``task.using(priority=...)``), so a worker meeting a priority
    for the first time is ordinary."""
    queue = "due7b-prio"
    worker = _idle_worker_with_keys(start_worker, queue, "prio-later")
    enqueued = time.monotonic()
    job = record.using(queue=queue, priority=5, delay=4).enqueue(1)
    late = _late_by(job, enqueued, 4)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    assert late < SLACK, f"the delayed job of a new priority was claimed {late:.1f} s after its run_at"


def _resumed_after_another(start_worker, worker_id: str, gap: float) -> float:
    """A worker (30 s poll) whose walks from the front all go to the front look's thread
    (as under a pinned horizon, where walks are costly), with keys; the look's backend is
    stopped (SIGSTOP), so its next look hangs. Queue ``rb7b-b`` is paused with job B in
    it; job C of the default queue, enqueued after B, is claimed from the keys (which
    move past B). An operator then resumes queue ``rb7b-a`` and, ``gap`` seconds later,
    ``rb7b-b`` (a script resuming every queue after maintenance): the seconds from the
    second resume until B runs."""
    env = {**LONG_POLL, "LEASEJOBS_TEST_FRONT_WALK_INLINE_MS": "0"}
    worker = start_worker("--worker-id", worker_id, "--concurrency", "2", env=env)
    first = record.enqueue(0)
    wait_until(lambda: _status(first) == "done", timeout=30, what="the first job done (keys)")
    _listening(worker_id)
    time.sleep(0.5)
    second = record.enqueue(0)  # claimed from the keys, it asks for the first look
    wait_until(lambda: _status(second) == "done", timeout=30, what="the second job done (a look)")
    pid = _stop_while_idle(f"leasejobs front {worker_id}")
    try:
        controls.pause_queue("rb7b-b")
        b = record.using(queue="rb7b-b").enqueue(1)
        c = record.enqueue(2)
        wait_until(lambda: _status(c) == "done", timeout=10, what="job C (after B) done from the keys")
        time.sleep(0.3)
        assert _status(b) == "queued"
        controls.resume_queue("rb7b-a")
        time.sleep(gap)
        controls.resume_queue("rb7b-b")
        resumed = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_until(lambda: _status(b) == "done", timeout=12, what="job B of the resumed queue done")
        took = time.monotonic() - resumed
    finally:
        os.kill(pid, signal.SIGCONT)
    assert worker.proc.poll() is None, worker.log()[-3000:]
    return took


def test_a_queue_resumed_within_a_second_of_another_runs_its_jobs_at_once(start_worker):
    """BREAKS. What I did: ``_resumed_after_another(gap=0.3)``. Each resume sends
    ``<queue><US>front``; the first makes its walk from the front at once (it finds
    nothing: ``rb7b-b`` is still paused). The second, 0.3 s later, is within
    ``ASKED_WALK_GAP_SECONDS`` of it: ``walk_front`` only marks the walk as asked, the
    listener's claim goes from the keys (past B) and finds nothing, and nothing wakes
    the worker when the second is over; the mark waits for the next claim, which is
    the poll's (30 s; an idle worker asks for no look). What happened: B not run within
    12 s of its queue's resume. docs/guarantees.md: "A queue resumed, or its limits set,
    asks its workers for a walk from the front, made at once whatever walks cost (one a
    second at most)"; docs/queue-controls.md likewise ("at its next claim")."""
    took = _resumed_after_another(start_worker, "resume-two", 0.3)
    assert took < 4, f"the job of the queue resumed second ran {took:.1f} s after its resume"


def test_a_queue_resumed_seconds_after_another_runs_its_jobs_at_once(start_worker):
    """HOLDS (the control of the test above): the same with the two resumes 1.5 s apart;
    B runs within a second or two of its queue's resume."""
    took = _resumed_after_another(start_worker, "resume-apart", 1.5)
    assert took < 4, f"the job of the queue resumed second ran {took:.1f} s after its resume"
