"""Durable steps, sleeps and waits under real ``runworker`` processes (issue 31).

Workers are killed with SIGKILL and paused with SIGSTOP, the body's process
and the worker's other children with them (``_family``): a worker paused
whole, as a stopped container or VM would be. The rules themselves, without
workers: ``test_durable_steps.py``.
"""

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest
from django.db import transaction

import leasejobs
from leasejobs.models import Job, Step
from tests.helpers import wait_until
from tests.testapp.models import BodyRun, Sent
from tests.testapp.step_tasks import back_to_back_steps, sleeper, three_steps, waiter

#: A short lease, so a killed or paused holder's job is taken over in seconds.
LEASE = ("--lease", "2")


def _family(pid: int) -> list[int]:
    """``pid`` and every process below it (the zygote, the children running bodies)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [c for c, parent in parents.items() if parent == p]
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signum)


def _job(job: Job) -> Job:
    job.refresh_from_db()
    return job


def _steps(job: Job) -> dict[str, int]:
    return dict(Step.objects.filter(job_id=job.id).values_list("name", "attempt"))


def test_a_step_done_by_a_killed_attempt_is_not_run_again(start_worker, tmp_path):
    pid_file = tmp_path / "body.pid"
    job = three_steps.enqueue(pause_after_first=60, pid_file=str(pid_file))
    a = start_worker(*LEASE, "--concurrency", "1", "--worker-id", "a")
    wait_until(pid_file.exists, what="attempt 1 past its first step")
    family = _family(a.pid)
    _signal_all(family, signal.SIGKILL)
    a.wait(timeout=10)
    start_worker(*LEASE, "--worker-id", "b")
    wait_until(lambda: _job(job).status == "done", timeout=40, what="job done by b")
    assert _steps(job) == {"first": 1, "second": 2, "third": 2}
    assert job.result == [1, 2, 2]
    for name in ("first", "second", "third"):  # each step's write once: with its checkpoint
        assert Sent.objects.filter(key=f"step:{name}").count() == 1
    assert BodyRun.objects.filter(job_id=job.id).count() == 2


def test_a_worker_paused_past_its_lease_writes_no_step_when_resumed(start_worker, tmp_path):
    """The whole worker is paused; the body's process resumes first, alone, and goes on to its
    second step holding attempt 1, while b's attempt 2 owns the job: the fence refuses it.

    (Resumed all at once, the zygote would kill the body first, its lease
    being past: that is the other guard, tested in test_supervised_bodies.)"""
    pid_file = tmp_path / "body.pid"
    job = three_steps.enqueue(pause_after_first=6, pid_file=str(pid_file))
    a = start_worker(*LEASE, "--concurrency", "1", "--worker-id", "a")
    wait_until(pid_file.exists, what="attempt 1 past its first step")
    family = _family(a.pid)
    body = int(pid_file.read_text())
    assert body in family
    _signal_all(family, signal.SIGSTOP)
    try:
        b = start_worker(*LEASE, "--worker-id", "b")
        wait_until(lambda: _job(job).status == "done", timeout=40, what="job done by b")
        os.kill(body, signal.SIGCONT)
        a.wait_for_log(rf"stale write rejected job={job.id} attempt=1 worker=a step='second'", timeout=30)
    finally:
        _signal_all(family, signal.SIGCONT)
    a.wait_for_log(rf"lease lost job={job.id} attempt=1", timeout=30)
    assert _steps(job) == {"first": 1, "second": 2, "third": 2}
    assert list(Sent.objects.filter(key="step:second").values_list("attempt", flat=True)) == [2]
    assert _job(job).result == [1, 2, 2]
    assert b.count(r"stale write rejected") == 0


def test_a_job_with_one_attempt_sleeping_three_times_completes(start_worker):
    job = sleeper.enqueue(times=3, seconds=0.5)  # max_attempts=1
    started = time.monotonic()
    w = start_worker("--worker-id", "s")
    wait_until(lambda: _job(job).status == "done", timeout=40, what="sleeper done")
    assert time.monotonic() - started > 1.5
    assert (job.result, job.runs, job.attempt, job.snoozes) == (4, 1, 4, 0)
    assert w.count(rf"suspended job={job.id} ") == 3
    for n in range(3):
        assert Sent.objects.filter(key=f"step:before-{n}").count() == 1


def test_wait_for_events_sent_before_and_after_and_rolled_back_and_timed_out(start_worker):
    leasejobs.send_event("early", {"n": 1})
    early = waiter.enqueue("early")
    late = waiter.enqueue("late")
    never = waiter.enqueue("rolled-back")
    timed = waiter.enqueue("nobody", timeout=1)
    w = start_worker("--worker-id", "e")
    wait_until(lambda: _job(early).status == "done", timeout=30, what="early done")
    assert early.result == {"payload": {"n": 1}}
    for job in (late, never):
        w.wait_for_log(rf"suspended job={job.id} attempt=1")
    with pytest.raises(RuntimeError), transaction.atomic():
        leasejobs.send_event("rolled-back", 1)
        raise RuntimeError("the sender's transaction fails")
    leasejobs.send_event("late", [2])
    wait_until(lambda: _job(late).status == "done", timeout=30, what="late done")
    assert late.result == {"payload": [2]}
    wait_until(lambda: _job(timed).status == "done", timeout=30, what="timed out")
    assert "timed out" in timed.result["timeout"]
    time.sleep(1)
    never = _job(never)
    assert (never.status, never.run_at.year, never.runs) == ("queued", 9999, 0)
    assert not Sent.objects.filter(job_id=never.id).exists()


def test_a_django_task_sleeps_durably_without_finishing_in_between(start_worker):
    """The suspended attempt sends no task_finished: the task is not finished, nor failed."""
    pytest.importorskip("django.tasks")
    from django.tasks import TaskResultStatus

    from tests.testapp import django_tasks

    result = django_tasks.steps_and_sleep.enqueue()
    w = start_worker("--worker-id", "d")
    wait_until(lambda: result.refresh() or result.status == TaskResultStatus.SUCCESSFUL, timeout=30)
    assert (result.return_value, result.errors) == ([1, 2], [])
    w.wait_for_log(rf"Task id={result.id} path=\S+ state=SUCCESSFUL")
    assert re.findall(rf"Task id={result.id} path=\S+ state=(\w+)", w.log()) == [
        "RUNNING",
        "RUNNING",
        "SUCCESSFUL",
    ]


def test_steps_back_to_back_for_three_leases_keep_their_job(start_worker):
    """Steps with no gap hold the job row nearly all the time, so the heartbeat skips it;
    a step renews the lease as it commits once less than half of it is left. A step
    that left it to run out would let the second worker take the job: a second attempt
    (max_attempts=1: the job would fail) and steps stored by two attempts."""
    job = back_to_back_steps.enqueue(150, 0.04)  # 6 s of steps under a 2 s lease
    start_worker(*LEASE, "--worker-id", "a")
    start_worker(*LEASE, "--worker-id", "b")
    wait_until(lambda: _job(job).status in ("done", "failed"), timeout=60, what="the job ends")
    job = _job(job)
    assert (job.status, job.attempt) == ("done", 1), (job.status, job.attempt, job.last_error)
    assert set(_steps(job).values()) == {1}
    assert BodyRun.objects.filter(job_id=job.id).count() == 1
