"""The demo's four scenarios, each run with two real ``runworker`` processes.

Every scenario gets its own order, its own receipt job on its own queue and
two workers, demo-a and demo-b, that listen to that queue only. Whichever
claims the job first gets the slow first attempt (in scenario 4 it is the one
paused); the other takes the job over once the lease runs out. What happened
is counted from the database (body runs, outbox messages, rejected side
effects, the job's attempt) and from the workers' own logs (stale finishes
the worker dropped, which leave no row).
"""

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q
from django.db.models.functions import Now

from demo_site.receipts.models import BodyRun, Message, Order
from demo_site.receipts.tasks import send_receipt, send_receipt_naive
from leasejobs.jobs.registry import Task
from leasejobs.models import Job
from localworkers import database_url, missing_connections

logger = logging.getLogger("demo_site.receipts")

#: How often the live line reads the job row.
POLL_SECONDS = 0.2
FINISHED = (Job.Status.DONE, Job.Status.FAILED, Job.Status.CANCELLED)


@dataclass(frozen=True)
class Timings:
    """The story's timings, shortened: a lease, and the slow first attempt's PDF render."""

    lease: float
    slow: float
    pause: float  # scenario 4: the worker holding the job stays stopped at least this long


FULL = Timings(lease=3.0, slow=10.0, pause=5.0)
# For the test: the same outcomes in about half the time. The second worker
# must take the job over before the slow attempt ends: its lease runs out
# after 2 s, and an idle worker looks for expired leases every second
# (LEASEJOBS["POLL_INTERVAL_SECONDS"]), which leaves 2 s for a busy machine.
# A body must end, or get a renewal through, within 1.85 s of its claim (the
# zygote kills a body 0.15 s before the lease it knows ends). The fast attempt
# of scenarios 1 and 2 has no heartbeat and imports fpdf2 in its child on its
# first receipt (0.2 s idle): with a 1.5 s lease it once took longer than
# that on a machine running the suite in four processes, and ran a third
# time; with a 1 s lease a healthy heartbeating worker once lost its body to
# its own zygote.
FAST = Timings(lease=2.0, slow=5.0, pause=2.0)


@dataclass(frozen=True)
class Scenario:
    number: int
    title: str
    task: Task
    heartbeat: bool
    how: str  # the set-up in a sentence; {lease}, {beat} and {pause} are the story's timings
    pause: bool = False

    @property
    def queue(self) -> str:
        return f"demo-{self.number}"


SCENARIOS = (
    Scenario(
        1,
        "no heartbeat, unfenced send",
        send_receipt_naive,
        heartbeat=False,
        how="runworker --no-heartbeat; the task emails without ctx.side_effect and without a key",
    ),
    Scenario(
        2,
        "no heartbeat, fenced + idempotent",
        send_receipt,
        heartbeat=False,
        how="runworker --no-heartbeat; the task emails inside ctx.side_effect, its key as idempotency key",
    ),
    Scenario(
        3,
        "heartbeat",
        send_receipt,
        heartbeat=True,
        how="the workers heartbeat every {beat:.2g} s (a third of the lease); the task as in 2",
    ),
    Scenario(
        4,
        "heartbeat, worker paused (SIGSTOP)",
        send_receipt,
        heartbeat=True,
        pause=True,
        how="the worker running the slow attempt is stopped (SIGSTOP) until the other has finished "
        "the job ({pause:g} s at least), then resumed (SIGCONT)",
    ),
)


@dataclass(frozen=True)
class Snapshot:
    """One look at a scenario's job, for the live line (lease time from the database clock)."""

    status: str
    holder: str
    attempt: int
    seconds_left: float | None
    body_runs: int
    bodies_running: int
    receipts: int
    note: str


@dataclass(frozen=True)
class Result:
    scenario: Scenario
    job_id: int
    body_runs: int
    receipts: int
    stale_writes: int
    attempts: int


class StoryError(Exception):
    """A scenario could not be told: a worker did not start, or a step timed out."""


class WorkerProcess:
    """One ``manage.py runworker`` of the demo, logging to its own file."""

    def __init__(self, worker_id: str, args: list[str], log_path: Path) -> None:
        self.worker_id = worker_id
        self.log_path = log_path
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            # The demo's own database, also when that is a test database.
            "DATABASE_URL": database_url(),
            "PYTHONUNBUFFERED": "1",
        }
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runworker", *args],
                cwd=settings.BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.proc.pid
        logger.info("started worker=%s pid=%s: runworker %s", worker_id, self.pid, " ".join(args))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM, after a SIGCONT in case it is paused (a stopped process handles no signal)."""
        if self.alive():
            for signum in (signal.SIGCONT, signal.SIGTERM):
                os.kill(self.pid, signum)

    def wait_or_kill(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            logger.warning("worker=%s pid=%s still runs after SIGTERM: SIGKILL", self.worker_id, self.pid)
            self.proc.kill()
            self.proc.wait(timeout=5)


def stop_workers(workers: list[WorkerProcess], timeout: float = 10.0) -> None:
    """Stop workers by pid, all at once: SIGTERM, then SIGKILL for any still there after ``timeout``."""
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + timeout
    for worker in workers:
        worker.wait_or_kill(max(0.0, deadline - time.monotonic()))


class Story:
    """Runs scenarios one after another; ``on_change`` sees every snapshot of the live job."""

    def __init__(
        self, timings: Timings, log_dir: Path, on_change: Callable[[Scenario, Snapshot], None]
    ) -> None:
        self.timings = timings
        self.log_dir = log_dir
        self.on_change = on_change
        self.workers: list[WorkerProcess] = []  # every worker started, for stop_all
        self.scenario_workers: list[WorkerProcess] = []
        self.note = ""

    def prepare(self) -> None:
        """Refuse to run beside other workers; settle jobs an interrupted run left behind."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE %s",
                ["leasejobs claim %"],
            )
            others = sorted(row[0].removeprefix("leasejobs claim ") for row in cursor.fetchall())
        if others:
            raise StoryError(
                f"other leasejobs workers are connected to this database ({', '.join(others)}) and "
                "would take the demo's jobs; stop them first (with Docker: docker compose stop worker)."
            )
        Job.objects.filter(
            queue__in=[s.queue for s in SCENARIOS], status__in=[Job.Status.QUEUED, Job.Status.RUNNING]
        ).update(
            status=Job.Status.CANCELLED,
            lease_until=None,
            finished_at=Now(),
            last_error="left behind by an interrupted demo run",
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def run(self, scenario: Scenario) -> Result:
        t = self.timings
        self.scenario_workers = []
        try:
            # The job goes in once both workers are up: whichever claims it,
            # the other is there to take it over when its lease runs out (a
            # worker still starting on a busy machine could miss that window,
            # and the first would take its own job back).
            with connection.cursor() as cursor:
                cursor.execute("SELECT statement_timestamp()")
                (since,) = cursor.fetchone()
            workers = {
                w.worker_id: w for w in (self._start(scenario, "demo-a"), self._start(scenario, "demo-b"))
            }
            self._wait_ready(scenario, since)
            self.note = "demo-a and demo-b started"
            order = Order.objects.create(customer_email="ada@example.com", item="A slow PDF", amount="12.00")
            job = scenario.task.using(queue=scenario.queue).enqueue(order.id, slow_first_attempt=t.slow)
            claimed = self._wait(
                scenario,
                job.id,
                order.id,
                lambda s: s.attempt >= 1 and s.body_runs >= 1,
                "a worker to claim the job and start its body",
            )
            holder = workers.get(claimed.holder)
            if holder is None:
                raise StoryError(
                    f"scenario {scenario.number}: {claimed.holder}, not a demo worker, took the job"
                )
            self.note = ""
            if scenario.pause:
                holder.pause()
                paused_at = time.monotonic()
                self.note = f"{holder.worker_id} paused (SIGSTOP)"
                self._wait(
                    scenario,
                    job.id,
                    order.id,
                    lambda s: s.status in FINISHED and time.monotonic() - paused_at >= t.pause,
                    "the other worker to take the job over and finish it",
                )
                holder.resume()
                self.note = f"{holder.worker_id} resumed (SIGCONT) after {time.monotonic() - paused_at:.1f} s"
                self._wait_for_stopped_body(scenario, holder, job.id)
            self._wait(
                scenario,
                job.id,
                order.id,
                lambda s: s.status in FINISHED and s.bodies_running == 0,
                "the job to finish and every body run to end",
            )
            if scenario.pause:
                self.note = f"{holder.worker_id} lives on" if holder.alive() else f"{holder.worker_id} exited"
                self.on_change(scenario, self._snapshot(job.id, order.id))
        finally:
            stop_workers(self.scenario_workers)
        return self._count(scenario, job.id, order.id, self.scenario_workers)

    def stop_all(self) -> None:
        """Stop every worker this story started that still runs (on errors and Ctrl-C)."""
        stop_workers(self.workers)

    def _start(self, scenario: Scenario, worker_id: str) -> WorkerProcess:
        args = ["--worker-id", worker_id, "--queue", scenario.queue, "--lease", f"{self.timings.lease:g}"]
        args += ["--concurrency", "1", "--grace", "1"]
        if not scenario.heartbeat:
            args.append("--no-heartbeat")
        log_path = self.log_dir / f"scenario-{scenario.number}-{worker_id}.log"
        worker = WorkerProcess(worker_id, args, log_path)
        self.workers.append(worker)
        self.scenario_workers.append(worker)
        return worker

    def _wait_for_stopped_body(self, scenario: Scenario, holder: WorkerProcess, job_id: int) -> None:
        """The paused worker could not renew its lease, so its zygote killed the body at the
        lease's end, before anyone could take the job over: once the resumed worker says so,
        the demo records the end the killed body could not record itself."""
        # Once resumed, the worker hears of it from its zygote ("its lease ran out") or from its
        # heartbeat ("taken over"), whichever comes first; the body is gone either way.
        said = re.compile(rf"lease lost job={job_id} attempt=1 worker={holder.worker_id}: ")
        timeout = 30.0
        self._poll(
            lambda: bool(said.search(holder.log())),
            timeout,
            lambda: (
                f"scenario {scenario.number}: waited {timeout:.0f} s for {holder.worker_id} to report its "
                f"stopped body. Worker logs: {self.log_dir}"
            ),
        )
        BodyRun.objects.filter(
            job_id=job_id, attempt=1, worker_id=holder.worker_id, ended_at__isnull=True
        ).update(outcome=BodyRun.Outcome.STOPPED, ended_at=Now())
        self.note = f"{holder.worker_id}'s body was stopped at its lease's end, before a stale write"

    def _wait_ready(self, scenario: Scenario, since: datetime) -> None:
        """Until this scenario's workers listen and have their claim connections open."""
        ids = [w.worker_id for w in self.scenario_workers]
        missing = []

        def ready() -> bool:
            nonlocal missing
            with connection.cursor() as cursor:
                missing = missing_connections(cursor, ids, since)
            return not missing

        timeout = 60.0
        self._poll(
            ready,
            timeout,
            lambda: (
                f"scenario {scenario.number}: waited {timeout:.0f} s for {' and '.join(ids)} to start; "
                f"not yet connected: {', '.join(missing)}. Worker logs: {self.log_dir}"
            ),
        )

    def _wait(
        self,
        scenario: Scenario,
        job_id: int,
        order_id: int,
        done: Callable[[Snapshot], bool],
        what: str,
    ) -> Snapshot:
        """Poll the job, reporting each snapshot, until ``done``; bounded by the story's timings."""
        timeout = self.timings.slow + 4 * self.timings.lease + 30
        snapshot = self._snapshot(job_id, order_id)

        def reached() -> bool:
            nonlocal snapshot
            snapshot = self._snapshot(job_id, order_id)
            self.on_change(scenario, snapshot)
            return done(snapshot)

        self._poll(
            reached,
            timeout,
            lambda: (
                f"scenario {scenario.number}: waited {timeout:.0f} s for {what}; "
                f"the job is {snapshot.status} at attempt {snapshot.attempt}. Worker logs: {self.log_dir}"
            ),
        )
        return snapshot

    def _poll(self, reached: Callable[[], bool], timeout: float, timed_out: Callable[[], str]) -> None:
        """Until ``reached()``, every POLL_SECONDS; a worker that exits or the timeout ends it."""
        deadline = time.monotonic() + timeout
        while not reached():
            for worker in self.scenario_workers:
                if not worker.alive():
                    raise StoryError(
                        f"worker {worker.worker_id} exited with {worker.proc.returncode}; "
                        f"its log ({worker.log_path}) ends:\n{_tail(worker.log())}"
                    )
            if time.monotonic() > deadline:
                raise StoryError(timed_out())
            time.sleep(POLL_SECONDS)

    def _snapshot(self, job_id: int, order_id: int) -> Snapshot:
        job = (
            Job.objects.filter(pk=job_id)
            .annotate(left=ExpressionWrapper(F("lease_until") - Now(), output_field=DurationField()))
            .values("status", "leased_by", "attempt", "left")
            .get()
        )
        runs = BodyRun.objects.filter(job_id=job_id).aggregate(
            total=Count("id"), running=Count("id", filter=Q(ended_at__isnull=True))
        )
        return Snapshot(
            status=job["status"],
            holder=job["leased_by"],
            attempt=job["attempt"],
            seconds_left=None if job["left"] is None else job["left"].total_seconds(),
            body_runs=runs["total"],
            bodies_running=runs["running"],
            receipts=Message.objects.filter(tags__order=order_id).count(),
            note=self.note,
        )

    @staticmethod
    def _count(scenario: Scenario, job_id: int, order_id: int, workers: list[WorkerProcess]) -> Result:
        """The scenario's numbers; a stale finish leaves no row, only its worker's log line."""
        stale_finish = re.compile(rf"lease lost job={job_id} attempt=\d+ worker=\S+: stale \w+ dropped")
        runs = BodyRun.objects.filter(job_id=job_id)
        return Result(
            scenario=scenario,
            job_id=job_id,
            body_runs=runs.count(),
            receipts=Message.objects.filter(tags__order=order_id).count(),
            stale_writes=runs.filter(outcome=BodyRun.Outcome.REJECTED).count()
            + sum(len(stale_finish.findall(w.log())) for w in workers),
            attempts=Job.objects.values_list("attempt", flat=True).get(pk=job_id),
        )


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
