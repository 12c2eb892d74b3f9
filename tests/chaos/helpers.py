"""What every chaos scenario shares: a fleet of workers, the final check, the figures.

A scenario enqueues ``tests.chaos.tasks.effect`` jobs (or the mixed storm's
tasks of the same shape), runs real ``runworker`` processes while it breaks
things, waits until no job is queued or running, and then calls ``check``:
it reads the jobs, side effects, deliveries (``Sent``), body runs
(``BodyRun``) and the workers' logs, returns the figures and asserts the
guarantees (docs/guarantees.md): every job done, or failed only once as many
attempts as it allows had started their body, or cancelled only where a
cancel was requested; one delivery per side effect; no token (job, attempt)
under which two workers ran the body.
"""

import os
import re
import secrets
import signal
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
import pytest
from django.db import connection

from leasejobs.models import Job, SideEffect, Step, WorkflowEdge
from tests.chaos.tasks import effect, effect_key
from tests.connection_budget import many_connections
from tests.helpers import WorkerProcess, wait_until
from tests.testapp.models import BodyRun, Sent

#: The worker processes of the chaos scenarios load tests.chaos.tasks.
SETTINGS = "tests.chaos.settings"

T = TypeVar("T")


def storm(need: int) -> Callable[[T], T]:
    """Mark a storm: a scenario that kills and pauses its own workers and checks only what
    ``check`` checks (no clock read against a bound, no server touched, deadlines of a
    minute or more), so it may share the machine: make test runs it in the parallel phase,
    where load is one more adversity, not a reason to fail. ``need``: its peak of
    connections, measured alone, plus a margin (tests/connection_budget.py).
    """

    def mark(test: T) -> T:
        marked: T = pytest.mark.storm(test)
        return many_connections(need)(marked)

    return mark


def cannot_run_here(reason: str) -> None:
    """Skip a scenario this machine cannot stage, saying why; under CI, fail instead.

    CI runs on a machine that can make network namespaces and restart its own
    PostgreSQL, so there a "cannot" is a defect to see, not a skip to hide.
    """
    if os.environ.get("CI"):
        pytest.fail(f"CI must run this scenario, but: {reason}")
    pytest.skip(reason)


def database_call(read: Callable[[], Any], default: Any = None) -> Any:
    """Run ``read`` on the test's own connection; ``default`` while the server is away.

    A restarted server breaks this process's connection too; closing it makes
    Django open a fresh one on the next query.
    """
    try:
        return read()
    except (psycopg.OperationalError, psycopg.InterfaceError, *_django_errors()):
        connection.close()
        return default


def _django_errors() -> tuple[type[Exception], ...]:
    from django.db import InterfaceError, OperationalError

    return (OperationalError, InterfaceError)


def enqueue_effects(count: int, seconds: float, queue: str = "default") -> list[int]:
    """Enqueue ``count`` chaos jobs in one statement; return their ids."""
    return [j.id for j in effect.using(queue=queue).bulk_enqueue([((seconds,), {}) for _ in range(count)])]


def unfinished(job_ids: Sequence[int]) -> int:
    """How many of these jobs are still queued or running (-1 while the server is away)."""
    return database_call(
        lambda: Job.objects.filter(id__in=job_ids, status__in=["queued", "running"]).count(), default=-1
    )


def wait_finished(job_ids: Sequence[int], timeout: float, what: str = "every job finished") -> None:
    wait_until(lambda: unfinished(job_ids) == 0, timeout=timeout, interval=0.2, what=what)


@dataclass
class Fleet:
    """The worker processes of one scenario, each with a known worker id.

    Every worker the scenario ever started stays in ``started`` (its log is
    read at the end, also after it was killed).
    """

    start_worker: Callable[..., WorkerProcess]
    name: str
    args: Sequence[str] = ()
    started: list[WorkerProcess] = field(default_factory=list)
    ids: dict[int, str] = field(default_factory=dict)  # pid -> worker id
    killed: set[str] = field(default_factory=set)  # ids of the workers SIGKILLed
    paused: set[str] = field(default_factory=set)  # ids of the workers SIGSTOPped at least once

    def start(
        self, *extra: str, env: dict[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> WorkerProcess:
        worker_id = f"{self.name}-{len(self.started) + 1}-{secrets.token_hex(2)}"
        worker = self.start_worker(
            *self.args,
            *extra,
            "--worker-id",
            worker_id,
            "-v",
            "2",  # the per-job "done" lines that check() reads
            env={"DJANGO_SETTINGS_MODULE": SETTINGS, "CHAOS_WORKER_ID": worker_id, **(env or {})},
            prefix=prefix,
        )
        self.started.append(worker)
        self.ids[worker.pid] = worker_id
        return worker

    def worker_id(self, worker: WorkerProcess) -> str:
        return self.ids[worker.pid]

    def pause(self, worker: WorkerProcess) -> None:
        """SIGSTOP ``worker`` (the scenario SIGCONTs it later), and remember it was paused."""
        worker.signal(signal.SIGSTOP)
        self.paused.add(self.worker_id(worker))

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.started if w.proc.poll() is None]

    def wait_started(self, workers: Iterable[WorkerProcess] | None = None, timeout: float = 30) -> None:
        for w in workers if workers is not None else self.live():
            w.wait_for_log(r"worker started", timeout=timeout)

    def stop_all(self, grace: float = 20) -> None:
        """SIGCONT then SIGTERM every live worker; each must exit 0 (it carried on).

        A worker still starting up is waited for first: before its handlers
        are installed SIGTERM would simply end it.
        """
        live = self.live()
        self.wait_started(live)
        for w in live:
            w.signal(signal.SIGCONT)
            w.signal(signal.SIGTERM)
        for w in live:
            assert w.wait(timeout=grace) == 0, w.log()[-3000:]

    def logs(self) -> str:
        return "\n".join(w.log() for w in self.started)


def resume_due(paused: dict[WorkerProcess, float], now: float) -> None:
    """SIGCONT each paused worker whose resume time (monotonic) has come; it leaves ``paused``."""
    for w, resume_at in list(paused.items()):
        if now >= resume_at:
            w.signal(signal.SIGCONT)
            del paused[w]


def check(job_ids: Sequence[int], fleet: Fleet, **scenario_figures: Any) -> dict[str, Any]:
    """Figures of a finished scenario, then its guarantees asserted.

    The figures are returned (and recorded by the caller) before the
    assertions fail, so a failing run still shows what happened.
    """
    jobs = {j.id: j for j in Job.objects.filter(id__in=job_ids)}
    keys = {effect_key(i): i for i in job_ids}
    effects = dict(SideEffect.objects.filter(key__in=keys).values_list("key", "fencing_token"))
    deliveries = Counter(Sent.objects.filter(key__in=keys).values_list("key", "attempt"))
    delivered = Counter(key for key, _attempt in deliveries.elements())
    logs = fleet.logs()
    error_retries = sum(1 for j in jobs.values() for e in j.errors if e["attempt"] < j.attempt)
    # (job, attempt) -> the workers whose body ran under that token: one, or the token was shared.
    holders: dict[tuple[int, int], set[str]] = {}
    for job_id, attempt, worker in BodyRun.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "attempt", "worker_id"
    ):
        holders.setdefault((job_id, attempt), set()).add(worker)
    started = Counter(job_id for job_id, _attempt in holders)
    shared = sorted(token for token, workers in holders.items() if len(workers) > 1)
    figures = {
        "jobs": len(job_ids),
        **scenario_figures,
        "done": sum(j.status == "done" for j in jobs.values()),
        "failed (attempts ran out)": sum(j.status == "failed" for j in jobs.values()),
        "cancelled": sum(j.status == "cancelled" for j in jobs.values()),
        "body runs": BodyRun.objects.filter(job_id__in=job_ids).count(),
        "reclaims": sum(j.attempt - 1 for j in jobs.values() if j.attempt) - error_retries,
        "retries after an error": error_retries,
        "stale writes rejected": len(re.findall(r"stale write rejected job=", logs))
        + len(re.findall(r"lease lost job=\d+ attempt=\d+ worker=\S+: stale \w+ dropped", logs)),
        "leases found lost by a heartbeat": len(re.findall(r"heartbeat found the job taken over", logs)),
        "duplicates found": sum(1 for n in delivered.values() if n > 1),
        "tokens held by two workers": len(shared),
        "workers": len(fleet.started),
        "runs counted, killed or paused before the body started": 0,
    }
    problems: list[str] = []
    missing = set(job_ids) - set(jobs)
    if missing:
        problems.append(f"{len(missing)} job(s) lost: {sorted(missing)[:10]}")
    for j in jobs.values():
        key = effect_key(j.id)
        if j.status == "done":
            # The finish came from the attempt that held the lease: its result names it.
            if j.result != {"attempt": j.attempt, "worker": j.attempt_workers[-1]}:
                problems.append(f"job {j.id} attempt {j.attempt} {j.attempt_workers}: result {j.result}")
            if key not in effects or delivered[key] != 1:
                problems.append(f"job {j.id}: side effect {effects.get(key)}, delivered {delivered[key]}x")
        elif j.status == "failed":
            # Only attempts whose body started count: a job fails once that many ran.
            # The one exception (docs/guarantees.md): a claim counts the run of a
            # row it hands straight to a child, and a SIGKILL, or a SIGSTOP past
            # the lease, between that claim's commit and the body's start leaves
            # one run counted that never started; then the job's last holder was
            # killed or paused, and exactly one counted run is missing from the
            # journal.
            killed_before_start = (
                started[j.id] == j.runs - 1
                and j.leased_by in fleet.killed | fleet.paused
                and j.last_error.startswith("lease expired on the last run")
            )
            figures["runs counted, killed or paused before the body started"] += killed_before_start
            if (started[j.id] < j.max_attempts and not killed_before_start) or delivered[key] > 1:
                problems.append(
                    f"job {j.id} failed after {started[j.id]} started attempt(s) of {j.max_attempts} "
                    f"(attempt {j.attempt}, delivered {delivered[key]}x): {j.last_error}"
                )
        elif j.status == "cancelled":
            if not j.cancel_requested or delivered[key] > 1:
                problems.append(
                    f"job {j.id} cancelled (requested: {j.cancel_requested}), delivered {delivered[key]}x"
                )
        else:
            problems.append(f"job {j.id} is {j.status} at attempt {j.attempt}")
    # Each side effect has exactly one delivery, by the attempt that recorded it.
    if set(effects.items()) != set(deliveries) or figures["duplicates found"]:
        problems.append(f"side effects {len(effects)} vs deliveries {sum(deliveries.values())}")
    for job_id, attempt in shared[:10]:
        problems.append(
            f"job {job_id} attempt {attempt} ran under workers {sorted(holders[job_id, attempt])}"
        )
    # A finish logged as written was written by the attempt the job ended with.
    for job_id, attempt, worker in re.findall(r"done job=(\d+) attempt=(\d+) worker=(\S+)", logs):
        j = jobs.get(int(job_id))
        if j is not None and (j.attempt, j.attempt_workers[-1]) != (int(attempt), worker):
            problems.append(f"job {job_id}: done logged by attempt {attempt} of {worker}, ended {j.attempt}")
    figures["problems"] = problems
    return figures


def figures_line(name: str, figures: dict[str, Any]) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in figures.items() if k != "problems")
    return f"{name}: {shown}"


def check_steps(job_ids: Sequence[int], fleet: Fleet, **figures: Any) -> dict[str, Any]:
    """Figures of a finished scenario of ``chaos_steps`` jobs, with the problems found.

    Every job is done, each of its steps stored once with exactly one write,
    by the attempt that stored it; its result names the steps' attempts and
    its event's payload; no token ran under two workers; every "done" line
    belongs to the job's final attempt.
    """
    jobs = {j.id: j for j in Job.objects.filter(id__in=job_ids)}
    steps = {(s.job_id, s.name): s for s in Step.objects.filter(job_id__in=job_ids)}
    writes = Counter(Sent.objects.filter(job_id__in=job_ids).values_list("job_id", "key", "attempt"))
    holders: dict[tuple[int, int], set[str]] = {}
    for job_id, attempt, worker in BodyRun.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "attempt", "worker_id"
    ):
        holders.setdefault((job_id, attempt), set()).add(worker)
    logs = fleet.logs()
    problems: list[str] = []
    for job_id in job_ids:
        j = jobs.get(job_id)
        if j is None or j.status != "done":
            problems.append(f"job {job_id} is {j.status if j else 'lost'}")
            continue
        attempts = []
        for name in ("a", "b", "c"):
            s = steps.get((job_id, name))
            key = f"chaos-step:{job_id}:{name}"
            made = [(a, n) for (i, k, a), n in writes.items() if i == job_id and k == key]
            if s is None or made != [(s.attempt, 1)]:
                problems.append(f"job {job_id} step {name}: {s and s.attempt}, writes {made}")
            attempts.append(s and s.attempt)
        event = steps.get((job_id, "event"))
        if event is None or not event.done or event.event_id is None:
            problems.append(f"job {job_id}: its event was not received")
        expected = {
            "steps": attempts,
            "event": {"job": job_id},
            "attempt": j.attempt,
            "worker": j.attempt_workers[-1],
        }
        if j.result != expected:
            problems.append(f"job {job_id}: result {j.result}, expected {expected}")
    shared = [token for token, workers in holders.items() if len(workers) > 1]
    problems += [f"job {job_id} attempt {attempt} ran under two workers" for job_id, attempt in shared[:10]]
    for job_id, attempt, worker in re.findall(r"done job=(\d+) attempt=(\d+) worker=(\S+)", logs):
        j = jobs.get(int(job_id))
        if j is not None and (j.attempt, j.attempt_workers[-1]) != (int(attempt), worker):
            problems.append(f"job {job_id}: done logged by attempt {attempt} of {worker}, ended {j.attempt}")
    return {
        "jobs": len(job_ids),
        **figures,
        "done": sum(j.status == "done" for j in jobs.values()),
        "body runs": sum(len(w) for w in holders.values()),
        "suspends": len(re.findall(r"suspended job=", logs)),
        "stale writes rejected": len(re.findall(r"stale write rejected job=", logs)),
        "steps stored": len([s for s in steps.values() if s.kind == "step"]),
        "tokens held by two workers": len(shared),
        "workers": len(fleet.started),
        "problems": problems,
    }


def early_children(job_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Edges among ``job_ids`` whose child's first body started before its parent finished."""
    rows = {j.id: j for j in Job.objects.filter(id__in=job_ids)}
    first_body: dict[int, Any] = {}
    for run in BodyRun.objects.filter(job_id__in=job_ids).order_by("created_at"):
        first_body.setdefault(run.job_id, run.created_at)
    return [
        (e.parent_id, e.child_id)
        for e in WorkflowEdge.objects.filter(child_id__in=job_ids)
        if first_body[e.child_id] < rows[e.parent_id].finished_at
    ]
