"""Review 52 (d): durable steps, sleeps, waits and workflows, broken with real processes.

Every test starts real ``runworker`` processes (settings ``tests.review52d_settings``,
which add the bodies of ``tests.review52d_tasks``) against PostgreSQL and reads what
the bodies did from their journal and the job, step and edge rows. Each one fails on
the branch it was written on; what it found is in its docstring.
"""

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import DataError

import leasejobs
from leasejobs.jobs import registry
from leasejobs.models import Job, Step
from leasejobs.operations import bulk
from tests import review52d_tasks
from tests.helpers import WorkerProcess, wait_until
from tests.review52d_tasks import after_both, always_fails, fails_first_time

# The workers import tests.review52d_tasks (tests.review52d_settings names it in TASK_MODULES).
registry.found_by_workers(*(v for v in vars(review52d_tasks).values() if isinstance(v, registry.Task)))

FINAL = ("done", "failed", "cancelled")
SETTINGS = {"DJANGO_SETTINGS_MODULE": "tests.review52d_settings"}


@pytest.fixture
def worker(start_worker: Callable[..., WorkerProcess]) -> Callable[..., WorkerProcess]:
    """``runworker`` with the review's bodies registered."""

    def start(*args: str) -> WorkerProcess:
        return start_worker(*args, env=SETTINGS)

    return start


def now(job: Job) -> Job:
    job.refresh_from_db()
    return job


def starts(path: Path, job: Job) -> int:
    """How many times the body of ``job`` started (its ``S`` lines)."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.split()[:2] == ["S", str(job.id)])


def ended(*jobs: Job, timeout: float = 60) -> None:
    wait_until(lambda: all(now(j).status in FINAL for j in jobs), timeout=timeout, what="the jobs end")


# -- workflows: a retried parent and the failure of its sibling ------------------------------------


def test_a_retried_parent_leaves_no_child_waiting_on_a_sibling_that_failed(worker, tmp_path):
    """docs/workflows.md: "Retrying a failed job from the admin continues the workflow ...
    When the job is done, the workflow goes on as if it had never failed", and "a parent
    that fails ... leaves its waiting descendants cancelled".

    A child after two parents, both failing. The first failure cancels the child; the
    second finds it cancelled already and settles nothing. The operator retries the
    first parent (a passing outage), which is done this time. Had it never failed, the
    child would be cancelled by its sibling's failure. Instead the retry's restore puts
    the child back to waiting (queued, due in 9999) for a parent that has failed and will
    never settle again: the workflow never ends.
    """
    path = tmp_path / "journal"
    with leasejobs.workflow("two failing parents") as wf:
        flaky = wf.add(fails_first_time, args=(str(path),))
        broken = wf.add(always_fails, args=(str(path),))
        child = wf.add(after_both, args=(str(path),), after=[flaky, broken])
    worker("--concurrency", "2")
    ended(flaky, broken, child)
    assert (now(flaky).status, now(broken).status, now(child).status) == ("failed", "failed", "cancelled")
    bulk.apply("retry", Job.objects.filter(pk=flaky.id), by="operator")
    wait_until(lambda: now(flaky).status == "done", timeout=60, what="the retried parent is done")
    time.sleep(1.0)
    c = now(child)
    assert starts(path, child) == 0
    assert c.status == "cancelled", (
        f"the child is {c.status} (run_at {c.run_at:%Y}, pending_parents {c.pending_parents}) "
        f"after parent {flaky.id} was retried and done while parent {broken.id} stays "
        f"{now(broken).status}: it waits forever"
    )


# -- durable steps: the stored result --------------------------------------------------------------


def values(path: Path, job: Job) -> dict[int, str]:
    """The ``V`` lines of ``job``: attempt -> the value its body saw."""
    found: dict[int, str] = {}
    for line in path.read_text().splitlines():
        kind, job_id, attempt, _, detail = line.split(maxsplit=4)
        if kind == "V" and int(job_id) == job.id:
            found[int(attempt)] = detail
    return found


def test_a_step_result_is_the_same_value_in_the_attempt_that_ran_it_and_in_a_resumed_one(worker, tmp_path):
    """docs/workflows.md: "The result is what JSON reads back, in the attempt that ran
    ``fn`` too: a tuple comes back as a list, so the first run and every resumed run see
    the same value."

    The attempt that ran ``fn`` reads back Python's JSON text (``1.7e+18``, ``-0.0``); a
    resumed attempt reads back what ``jsonb`` made of it (``numeric``: no exponent, no
    signed zero). A step returning ``{"at_ns": 1.7e18, "drift": -0.0}`` is a float and a
    negative zero in the first attempt, and the int ``1700000000000000000`` and ``0.0``
    after a ``ctx.sleep``: ``json.dumps``, ``str``, ``isinstance`` and ``math.copysign``
    of the result change between the run and its replay.
    """
    path = tmp_path / "journal"
    job = review52d_tasks.measures_then_naps.enqueue(str(path))
    worker("--concurrency", "1")
    ended(job)
    seen = values(path, job)
    assert len(seen) == 2, (now(job).status, now(job).last_error, seen)
    first, resumed = (seen[a] for a in sorted(seen))
    assert first == resumed, f"the attempt that ran the step saw {first}, the resumed one {resumed}"


def at(path: Path, kind: str, job: Job) -> float | None:
    """The wall time of the first ``kind`` line of ``job`` in the journal."""
    for line in path.read_text().splitlines():
        fields = line.split()
        if fields[0] == kind and int(fields[1]) == job.id:
            return float(fields[3])
    return None


def test_a_run_anyway_child_waits_for_a_parent_the_operator_retried(worker, tmp_path):
    """docs/workflows.md: "Retrying a failed job from the admin continues the workflow ...
    When the job is done, the workflow goes on as if it had never failed", and
    ``on_parent_failure="run"``: the child "runs anyway once every parent has ended".

    A clean-up job (run anyway) after two parents. The first fails (an outage); while
    the second still runs, the operator retries the first, whose retry takes a while.
    The second is done: the clean-up starts at once, while the retried parent is still
    running, and sees ``None`` for it; the parent is done afterwards, and nothing ever
    hands its result to the child. Had it never failed, the child would have run after
    it, with its result.
    """
    path, first_marker, second_marker = tmp_path / "journal", tmp_path / "first", tmp_path / "second"
    with leasejobs.workflow("clean-up after a retried parent") as wf:
        flaky = wf.add(review52d_tasks.fails_first_then_waits, args=(str(path), str(first_marker)))
        slow = wf.add(review52d_tasks.waits_then_done, args=(str(path), str(second_marker)))
        child = wf.add(
            review52d_tasks.cleanup, args=(str(path),), after=[flaky, slow], on_parent_failure="run"
        )
    worker("--concurrency", "3")
    wait_until(lambda: now(flaky).status == "failed", timeout=60, what="the first parent fails")
    bulk.apply("retry", Job.objects.filter(pk=flaky.id), by="operator")
    wait_until(lambda: starts(path, flaky) == 2, timeout=60, what="the retried parent runs again")
    second_marker.touch()
    wait_until(lambda: now(slow).status == "done", timeout=60, what="the second parent is done")
    time.sleep(1.0)
    first_marker.touch()
    ended(flaky, child)
    flaky_done, child_start = at(path, "E", flaky), at(path, "S", child)
    assert child_start is not None and flaky_done is not None
    assert child_start >= flaky_done, (
        f"the run-anyway child started {flaky_done - child_start:.1f} s before its retried parent "
        f"was done, and saw {now(child).result}"
    )


# -- waits: the deadline ---------------------------------------------------------------------------


def test_an_event_sent_after_the_deadline_does_not_beat_the_timeout(worker, tmp_path):
    """docs/workflows.md, "Waiting for events": "Past the deadline with no event,
    ``leasejobs.WaitTimeout`` is raised in the body. The timeout is counted from the first
    attempt that waited ... every later attempt gets ``WaitTimeout`` again at once, even if
    the event comes later."

    A wait with a timeout of 2 s; the deadline passes with no event and no worker running
    (a deploy). 3 s past the deadline the event is sent; then a worker starts. The wait
    looks for the event before it looks at its deadline: the body receives the late event
    as if it had come in time, instead of ``WaitTimeout``. Whether a job takes its other
    path depends on how soon a worker got to it, not on when the event came.
    """
    path = tmp_path / "journal"
    key = f"order:{tmp_path.name}:packed"
    job = review52d_tasks.waits_for_packing.enqueue(str(path), key, 2)
    first = worker("--concurrency", "1")
    wait_until(
        lambda: (
            Step.objects.filter(job_id=job.id, name="packed", done=False).exists()
            and now(job).status == "queued"
        ),
        timeout=60,
        what="the job waits",
    )
    first.stop()
    deadline = Step.objects.get(job_id=job.id, name="packed").wake_at
    time.sleep(max(0.0, deadline.timestamp() - time.time()) + 3.0)
    leasejobs.send_event(key, {"box": 7})
    worker("--concurrency", "1")
    ended(job)
    assert now(job).result == {"timed_out": True}, (
        f"the event sent 3 s after the wait's deadline was received: {now(job).result}"
    )


# -- sleeps: how long --------------------------------------------------------------------------------


def test_a_durable_sleep_too_long_for_python_is_refused_where_it_is_asked(worker, tmp_path):
    """docs/workflows.md: a waiting job's ``run_at`` is 9999-01-01, not ``infinity``, because
    "PostgreSQL's ``infinity`` cannot be read by Python's ``datetime``"; docs/guarantees.md,
    "Bad input is refused with a clear error, or fails its own job only" (a rate window
    PostgreSQL's timestamps cannot hold is "refused where it is set, in one sentence").

    ``ctx.sleep`` checks only that its seconds are finite and not negative. A sleep of
    10**12 s ("park it until an operator retries it") is recorded: the job is queued with
    a ``run_at`` in the year 33,000-odd, which PostgreSQL holds and Python cannot. From
    then on, the job's row cannot be read through the ORM (``Job.objects.get`` raises
    ``DataError: timestamp too large (after year 10K)``), nor by the admin's pages that
    list it or any query of the application that loads it.
    """
    path = tmp_path / "journal"
    job = review52d_tasks.parks.enqueue(str(path), 10**12)
    worker("--concurrency", "1")
    wait_until(
        lambda: Job.objects.filter(pk=job.id, status__in=["queued", *FINAL], attempt=1).exists(),
        timeout=60,
        what="the job's first attempt ends",
    )
    time.sleep(0.5)
    try:
        row = Job.objects.get(pk=job.id)
    except (ValueError, OverflowError, DataError) as exc:
        pytest.fail(f"the job's row cannot be read after the sleep was recorded: {exc!r}")
    assert row.status == "failed" or row.run_at.year <= 9999, (row.status, row.run_at)


# -- workflows: cancel_workflow beside busy workers ------------------------------------------------


def test_cancel_workflow_leaves_no_job_of_it_running_without_a_cancel_request(worker, tmp_path):
    """docs/workflows.md: "``leasejobs.cancel_workflow(wf)`` ... cancels every job of the
    workflow not yet finished: queued and waiting jobs at once, running ones through the
    same cancel request as the admin's".

    ``cancel_workflow`` reads the workflow's unfinished jobs (id, status, attempt), then
    cancels each only while it still has that status, in one UPDATE. One job of the
    workflow is inside a durable step (a 3 s payment call): its step's transaction holds
    its row, and the UPDATE waits for it. Meanwhile the workers go on claiming the
    workflow's queued jobs; when the UPDATE reaches them they are running, not queued as
    read, and are skipped: left running with no cancel request, they run to their end as
    if the workflow had never been cancelled, and so do the jobs claimed after them.
    """
    path = tmp_path / "journal"
    with leasejobs.workflow("wide") as wf:
        slow = wf.add(review52d_tasks.charges_slowly, args=(str(path), 3.0))
        rest = [wf.add(review52d_tasks.works, args=(str(path), 0.3)) for _ in range(200)]
    worker("--concurrency", "3")
    worker("--concurrency", "3")
    wait_until(
        lambda: path.exists() and at(path, "I", slow), timeout=60, what="the slow job is inside its step"
    )
    began = time.time()
    leasejobs.cancel_workflow(wf)
    took = time.time() - began
    left = list(
        Job.objects.filter(workflow_id=wf.id, finished_at__isnull=True, cancel_requested=False).values_list(
            "id", "status"
        )
    )
    ended(slow, *rest, timeout=120)
    done = Job.objects.filter(id__in=[i for i, _ in left], status="done").count()
    assert left == [], (
        f"{len(left)} jobs left unfinished and uncancelled after cancel_workflow returned "
        f"(it took {took:.1f} s): {left[:5]}; {done} of them then ended done"
    )
