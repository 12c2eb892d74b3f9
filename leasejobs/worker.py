"""The worker: claims jobs, runs them in threads, heartbeats, finishes.

Threads, each with its own database connection where it needs one:
- the main thread claims jobs in one statement for all free room: the free
  runner slots plus a small prefetch buffer (see ``Worker._prefetch_now``),
  whenever a NOTIFY arrives, the buffer runs low, or the poll interval passes;
- ``concurrency`` runner threads take claimed jobs from the buffer, oldest
  claim first, and run their bodies; a runner that finds another job waiting
  goes straight on to it, so a stream of short jobs costs no thread hand-off
  per job;
- the heartbeat thread extends the lease of every held job (running or
  buffered) in one statement per tick, reports lost leases and cancel
  requests to the bodies, and enforces ``timeout_seconds``; no job body can
  block it;
- the finisher thread writes outcomes, many per statement, each fenced on
  the attempt that produced it; it waits a few milliseconds for company
  (``FINISH_LINGER_SECONDS``) so that a steady stream of jobs costs a
  fraction of a commit each;
- the listener thread waits for NOTIFY on a dedicated autocommit connection.

A job stays "held" (and heartbeated) from its claim until its outcome is
written or dropped, so neither a job waiting in the buffer nor a finish
waiting in the finisher's batch ever loses its lease.
"""

import asyncio
import inspect
import logging
import os
import secrets
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connections
from psycopg.types.json import Jsonb

from leasejobs import conf, registry, retry, sql
from leasejobs.connection import CONNECTION_ERRORS, WorkerConnection
from leasejobs.context import JobContext, activate, deactivate
from leasejobs.enqueue import encode_json
from leasejobs.exceptions import LeaseLost

logger = logging.getLogger("leasejobs.worker")

#: How many outcomes one FINISH statement writes at most.
FINISH_BATCH = 500

#: How long the finisher waits for more outcomes before writing a batch that
#: is still small. A finish that is not written yet only keeps its job held
#: (and heartbeated) a little longer; a crash before it is written means the
#: job runs again under a new token, which fencing and side-effect keys make
#: safe. Three milliseconds turn a steady stream of short jobs into one
#: commit per several jobs and are invisible next to any real job.
FINISH_LINGER_SECONDS = 0.003

#: A buffered job should start within this share of its lease (and within
#: ``PREFETCH_MAX_WAIT_SECONDS``); the prefetch shrinks as jobs get slower.
#: A tenth of a second keeps the jobs of one burst spread over the workers
#: that are there to take them, yet lets a worker claim hundreds of
#: millisecond jobs in one statement.
PREFETCH_LEASE_SHARE = 0.1
PREFETCH_MAX_WAIT_SECONDS = 0.1


#: How long a claim or finish waits for a table-level lock before it gives
#: up and tries again later (row locks are skipped, never waited for).
LOCK_TIMEOUT_MS = 5000


def default_worker_id() -> str:
    """Host, pid and a random suffix: unique per process, never reused."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class WorkerOptions:
    queues: list[str] | None = None
    concurrency: int = 4
    lease_seconds: float | None = None
    heartbeat_seconds: float | None = None
    heartbeat: bool = True
    burst: bool = False
    max_jobs: int | None = None
    worker_id: str = field(default_factory=default_worker_id)
    grace_seconds: float = 10.0
    poll_interval: float | None = None
    #: Most jobs claimed ahead of free runner slots (None: LEASEJOBS["PREFETCH"]).
    prefetch: int | None = None


@dataclass(slots=True)
class Outcome:
    """The result of one attempt, waiting to be written by the finisher."""

    status: str  # done, queued (retry or snooze), failed or cancelled
    result: Any = None
    last_error: str | None = None
    error_entry: dict[str, Any] | None = None
    retry_delay: float | None = None
    snoozed: bool = False  # queued by Snooze: snoozes + 1, not counted as an attempt


def failure_outcome(
    exc: BaseException,
    *,
    attempt: int,
    snoozes: int,
    max_attempts: int,
    policy: "retry.RetryPolicy | None",
    worker_id: str,
    cancel_requested: bool = False,
) -> Outcome:
    """The outcome of an attempt whose body raised ``exc`` (see ``retry.decide``).

    A cancel requested while it ran ends it cancelled. A snooze adds no
    error entry: it is not a failure.
    """
    last_line = traceback.format_exception_only(exc)[-1].strip()
    entry = {
        "attempt": attempt,
        "worker_id": worker_id,
        "exception_class": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }
    if cancel_requested:
        return Outcome(status="cancelled", last_error=last_line, error_entry=entry)
    # Claims that ended in a snooze do not count: attempts used = attempt - snoozes.
    decision = retry.decide(policy, exc, attempt - snoozes, max_attempts, snoozes)
    if decision.action == "snooze":
        return Outcome(status="queued", retry_delay=decision.delay, snoozed=True)
    if decision.action == "retry":
        return Outcome(status="queued", last_error=last_line, error_entry=entry, retry_delay=decision.delay)
    return Outcome(status="failed", last_error=decision.reason or last_line, error_entry=entry)


@dataclass(slots=True)
class HeldJob:
    """A job this worker has claimed and not yet finished."""

    id: int
    attempt: int
    max_attempts: int
    task_name: str
    args: Any
    kwargs: Any
    task: "registry.Task | None"
    lease_seconds: float
    ctx: JobContext
    snoozes: int = 0  # claims of this job that ended in a snooze
    retry_policy: "retry.RetryPolicy | None" = None  # the row's, else the task's
    deadline: float | None = None  # monotonic time past which it times out
    settled: bool = False  # an outcome was decided (or dropped); only once
    finish_skipped: bool = False  # its finish met its row locked (logged once)


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.worker_id = options.worker_id
        self.lease_seconds = float(options.lease_seconds or conf.get("LEASE_SECONDS"))
        self.poll_interval = float(options.poll_interval or conf.get("POLL_INTERVAL_SECONDS"))
        self.prefetch = int(conf.get("PREFETCH") if options.prefetch is None else options.prefetch)
        self.channel = conf.get("NOTIFY_CHANNEL")
        self.task_leases = {
            name: t.lease_seconds for name, t in registry.all_tasks().items() if t.lease_seconds
        }
        self._lock = threading.Lock()
        # Runners wait here for a claimed job; notified once per job buffered.
        self._job_ready = threading.Condition(self._lock)
        self._buffer: deque[HeldJob] = deque()  # claimed, not started, in claim order
        self._idle_runners = 0
        self._runners_exit = False
        self._held: dict[int, HeldJob] = {}
        self._running = 0  # bodies running now
        self._claimed = 0
        # Mean body duration (seconds), smoothed; None until a body has run.
        self._mean_duration: float | None = None
        self._outcomes: deque[tuple[HeldJob, Outcome]] = deque()
        self._outcome_ready = threading.Event()
        self._finisher_exit = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()  # set when the finisher may stop
        self._grace_deadline: float | None = None
        self.counts = {"claimed": 0, "done": 0, "retried": 0, "snoozed": 0, "failed": 0, "lost_leases": 0}
        self._is_async: dict[str, bool] = {}
        # Claims and finishes skip locked rows; a lock on the whole table (a
        # migration's ALTER TABLE) must not wedge them either: they give up
        # after LOCK_TIMEOUT_MS and try again on their next turn.
        lock_timeout = f"-c lock_timeout={LOCK_TIMEOUT_MS}"
        # The claim must walk its partial index in claim order and stop after
        # LIMIT rows. Right after a bulk enqueue the table's statistics still
        # say "a few rows", and the planner then prefers to read every
        # queued row and sort them: 40 ms instead of 2 ms per claim at 50,000
        # queued jobs, and worse as the queue grows. This connection runs
        # nothing but the claim, so it simply takes the other plans away.
        self._claim_db = WorkerConnection(
            "claim",
            self.worker_id,
            session_settings=f"-c enable_seqscan=off -c enable_bitmapscan=off {lock_timeout}",
        )
        # A heartbeat never waits long: not on a lock, not on a slow server.
        beat_timeout = max(1000, int(self._beat_interval(self.lease_seconds) * 1000))
        self._beat_db = WorkerConnection(
            "heartbeat",
            self.worker_id,
            session_settings=f"-c statement_timeout={beat_timeout} -c lock_timeout={beat_timeout}",
        )
        self._finish_db = WorkerConnection("finish", self.worker_id, session_settings=lock_timeout)
        self._threads: list[threading.Thread] = []

    # -- life cycle ------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; a second request ends the grace period at once."""
        if self._stopping.is_set():
            self._grace_deadline = time.monotonic()
            logger.warning("second stop signal: giving leases back now worker=%s", self.worker_id)
        else:
            self._grace_deadline = time.monotonic() + self.options.grace_seconds
            logger.info(
                "stopping worker=%s: no new claims, %.0f s grace for %d running job(s)",
                self.worker_id,
                self.options.grace_seconds,
                self._running,
            )
            self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        """Run until stopped (signal, --burst, --max-jobs); always returns cleanly."""
        o = self.options
        logger.info(
            "worker started worker=%s queues=%s concurrency=%d prefetch=%d lease=%.1fs heartbeat=%s",
            self.worker_id,
            ",".join(o.queues) if o.queues else "all",
            o.concurrency,
            self.prefetch,
            self.lease_seconds,
            "off" if not o.heartbeat else (f"{o.heartbeat_seconds}s" if o.heartbeat_seconds else "lease/3"),
        )
        self._start_thread(self._listen, "leasejobs-listener")
        self._start_thread(self._heartbeat_loop, "leasejobs-heartbeat")
        finisher = self._start_thread(self._finish_loop, "leasejobs-finisher")
        for i in range(o.concurrency):
            self._start_thread(self._run_loop, f"leasejobs-runner-{i}")
        try:
            self._claim_loop()
            self._drain()
        finally:
            with self._lock:
                self._runners_exit = True
                self._job_ready.notify_all()
            self._finisher_exit = True
            self._outcome_ready.set()
            finisher.join(timeout=30)
            self._release_all()
            self._done.set()
            self._wake.set()
            for conn in (self._claim_db, self._beat_db, self._finish_db):
                conn.close()
            c = self.counts
            logger.info(
                "worker stopped worker=%s claimed=%d done=%d retried=%d failed=%d lost_leases=%d",
                self.worker_id,
                c["claimed"],
                c["done"],
                c["retried"],
                c["failed"],
                c["lost_leases"],
            )

    def _start_thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        # Daemon threads: a body still running past the grace period must not
        # keep the process alive once its lease has been given back.
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    # -- claiming --------------------------------------------------------------

    def _prefetch_now(self) -> int:
        """How many jobs may wait in the buffer, given how long bodies take.

        Up to ``prefetch``, but only as many as the runners will start within
        a tenth of a second (and of the lease): a buffered job is claimed and
        heartbeated, yet nobody works on it, so with slow jobs it would only
        keep them from idle workers elsewhere. Until a body has run, nothing
        is prefetched.
        """
        mean = self._mean_duration
        if not self.prefetch or mean is None:
            return 0
        wait = min(PREFETCH_MAX_WAIT_SECONDS, self.lease_seconds * PREFETCH_LEASE_SHARE)
        fits = self.options.concurrency * wait / max(mean, 1e-6)
        return min(self.prefetch, int(fits))

    def _room(self) -> tuple[int, int]:
        """Jobs to claim now, and the least worth a statement.

        With a prefetch buffer, a claim waits until half of it is free, so
        that a stream of short jobs is claimed many rows per statement.
        """
        prefetch = self._prefetch_now()
        with self._lock:
            room = self.options.concurrency + prefetch - self._running - len(self._buffer)
        worth = (self.options.concurrency + prefetch) // 2 if prefetch else 1
        if self.options.max_jobs is not None:
            left = self.options.max_jobs - self._claimed
            room, worth = min(room, left), min(worth, left)
        return room, worth

    def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            if self.options.max_jobs is not None and self._claimed >= self.options.max_jobs:
                logger.info("reached --max-jobs %d worker=%s", self.options.max_jobs, self.worker_id)
                return
            self._wake.clear()
            room, worth = self._room()
            if room >= worth:
                try:
                    got = self._claim(room)
                except CONNECTION_ERRORS as exc:
                    logger.warning("claim failed worker=%s: %s", self.worker_id, _one_line(exc))
                    self._wake.wait(self.poll_interval)
                    continue
                if got == 0 and self.options.burst and self._idle():
                    logger.info("no job ready: --burst worker=%s exits", self.worker_id)
                    return
                if got == room:
                    continue  # more may be ready; claim again as soon as there is room
            self._wake.wait(self.poll_interval)

    def _idle(self) -> bool:
        with self._lock:
            return not self._held

    def _claim(self, limit: int) -> int:
        rows = self._claim_db.execute(
            sql.CLAIM,
            {
                "queues": self.options.queues,
                "limit": limit,
                "lease_seconds": self.lease_seconds,
                "task_leases": Jsonb(self.task_leases),
                "worker_id": self.worker_id,
                "job_id": None,
            },
        )
        claimed: list[HeldJob] = []
        for (
            job_id,
            task_name,
            args,
            kwargs,
            attempt,
            max_attempts,
            queue_name,
            exhausted,
            error,
            snoozes,
            stored_policy,
        ) in rows:
            if exhausted:
                self.counts["failed"] += 1
                logger.error(
                    "failed job=%s attempt=%s worker=%s task=%s: %s",
                    job_id,
                    attempt,
                    self.worker_id,
                    task_name,
                    error,
                )
                continue
            task = registry.get(task_name)
            claimed.append(
                HeldJob(
                    id=job_id,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    task_name=task_name,
                    args=args,
                    kwargs=kwargs,
                    task=task,
                    snoozes=snoozes,
                    retry_policy=retry.policy_for(task.retry if task else None, stored_policy),
                    lease_seconds=float(
                        task.lease_seconds if task and task.lease_seconds else self.lease_seconds
                    ),
                    ctx=JobContext(
                        job_id=job_id,
                        attempt=attempt,
                        worker_id=self.worker_id,
                        task_name=task_name,
                        queue=queue_name,
                    ),
                )
            )
            logger.info(
                "claimed job=%s attempt=%s worker=%s task=%s queue=%s",
                job_id,
                attempt,
                self.worker_id,
                task_name,
                queue_name,
            )
        refused: list[tuple[HeldJob, str]] = []
        with self._lock:
            for held in claimed:
                self._held[held.id] = held
                refusal = self._refusal(held)
                if refusal is None:
                    self._buffer.append(held)
                else:
                    refused.append((held, refusal))
            n = len(claimed)
            self._claimed += n
            self.counts["claimed"] += n
            # Wake only as many idle runners as there are new jobs.
            self._job_ready.notify(min(self._idle_runners, n - len(refused)))
        for held, refusal in refused:
            self._settle(held, Outcome(status="failed", last_error=refusal))
        return len(rows)

    @staticmethod
    def _refusal(held: HeldJob) -> str | None:
        """Why a claimed row cannot run at all (no retry will help), or None."""
        if held.task is None:
            return f"unknown task {held.task_name!r}"
        if not isinstance(held.args, list) or not isinstance(held.kwargs, dict):
            return "malformed job row: args must be a JSON list and kwargs a JSON object"
        return None

    # -- running ---------------------------------------------------------------

    def _next_job(self) -> HeldJob | None:
        """The oldest buffered job, waiting for one; None when the runners stop.

        Once a stop is requested no buffered job starts: the claim loop gives
        their leases back at once instead.
        """
        with self._lock:
            while not self._buffer or self._stopping.is_set():
                if self._runners_exit:
                    return None
                self._idle_runners += 1
                self._job_ready.wait()
                self._idle_runners -= 1
            held = self._buffer.popleft()
            self._running += 1
        return held

    def _run_loop(self) -> None:
        while True:
            held = self._next_job()
            if held is None:
                return
            started = time.monotonic()
            try:
                self._execute(held, started)
            finally:
                elapsed = time.monotonic() - started
                mean = self._mean_duration
                self._mean_duration = elapsed if mean is None else mean + (elapsed - mean) / 16
                with self._lock:
                    self._running -= 1
                    low = len(self._buffer) <= self.options.concurrency
                if low and not self._wake.is_set():
                    self._wake.set()  # a slot is free and the buffer runs low: claim more

    def _execute(self, held: HeldJob, started: float) -> None:
        task = held.task
        assert task is not None
        if task.timeout_seconds:
            held.deadline = started + task.timeout_seconds
        is_async = self._is_async.get(held.task_name)
        if is_async is None:
            is_async = self._is_async[held.task_name] = inspect.iscoroutinefunction(task.func)
        token = activate(held.ctx)
        try:
            args = [held.ctx, *held.args] if task.takes_context else held.args
            if is_async:
                result = asyncio.run(task.func(*args, **held.kwargs))
            else:
                result = task.func(*args, **held.kwargs)
            if result is not None:
                encode_json(result, f"the return value of {held.task_name}")
        except LeaseLost as exc:
            self._drop(held, f"the body stopped: {exc}")
            return
        except BaseException as exc:  # SystemExit in a body must not kill its runner
            outcome = self._failure(held, exc)
        else:
            outcome = Outcome(status="cancelled" if held.ctx.cancel_requested else "done", result=result)
        finally:
            deactivate(token)
            _tidy_django_connections()
        if not self._settle(held, outcome):
            logger.warning(
                "late outcome dropped job=%s attempt=%s worker=%s after %.1fs: the attempt had timed out"
                " or its lease was given back",
                held.id,
                held.attempt,
                self.worker_id,
                time.monotonic() - started,
            )

    def _failure(self, held: HeldJob, exc: BaseException) -> Outcome:
        """Retry, fail, snooze or discard by the job's retry policy; a cancel ends it."""
        return failure_outcome(
            exc,
            attempt=held.attempt,
            snoozes=held.snoozes,
            max_attempts=held.max_attempts,
            policy=held.retry_policy,
            worker_id=self.worker_id,
            cancel_requested=held.ctx.cancel_requested,
        )

    def _settle(self, held: HeldJob, outcome: Outcome) -> bool:
        """Hand the attempt's one outcome to the finisher (False if already settled)."""
        with self._lock:
            if held.settled:
                return False
            held.settled = True
        self._outcomes.append((held, outcome))
        if not self._outcome_ready.is_set():
            self._outcome_ready.set()
        return True

    def _drop(self, held: HeldJob, why: str) -> None:
        """Forget an attempt that no longer holds its job; write nothing."""
        with self._lock:
            held.settled = True
            self._held.pop(held.id, None)
            self.counts["lost_leases"] += 1
        held.ctx.mark_lease_lost()
        logger.warning(
            "lease lost job=%s attempt=%s worker=%s: %s", held.id, held.attempt, self.worker_id, why
        )

    # -- finishing -------------------------------------------------------------

    def _finish_loop(self) -> None:
        pending: list[tuple[HeldJob, Outcome]] = []
        while True:
            if not pending and not self._outcomes:
                if self._finisher_exit:
                    return
                self._outcome_ready.wait()
                self._outcome_ready.clear()
                if (
                    len(self._outcomes) < FINISH_BATCH
                    and not self._finisher_exit
                    and not self._stopping.is_set()
                ):
                    time.sleep(FINISH_LINGER_SECONDS)  # wait for company
            while self._outcomes and len(pending) < FINISH_BATCH:
                pending.append(self._outcomes.popleft())
            if not pending:
                continue
            try:
                pending = self._write_outcomes(pending)
            except CONNECTION_ERRORS as exc:
                logger.warning(
                    "finish failed for %d job(s) worker=%s: %s; retrying",
                    len(pending),
                    self.worker_id,
                    _one_line(exc),
                )
                if (
                    self._stopping.is_set()
                    and self._grace_deadline is not None
                    and (time.monotonic() > self._grace_deadline + 5)
                ):
                    return  # unwritten jobs keep their lease until it expires
                time.sleep(0.2)
            else:
                if not pending:
                    continue
                # Rows locked by another transaction: try again shortly, but
                # not past the grace at exit (their leases run out instead).
                if self._finisher_exit and (
                    self._grace_deadline is None or time.monotonic() > self._grace_deadline + 1
                ):
                    logger.warning(
                        "gave up finishing %d job(s) worker=%s: their rows stay locked; "
                        "their leases run out on their own",
                        len(pending),
                        self.worker_id,
                    )
                    return
                time.sleep(0.2)

    def _write_outcomes(self, batch: list[tuple[HeldJob, Outcome]]) -> list[tuple[HeldJob, Outcome]]:
        """Write a batch; return the outcomes whose rows were locked (still to write)."""
        rows = self._finish_db.execute(
            sql.FINISH,
            {
                "ids": [h.id for h, _ in batch],
                "attempts": [h.attempt for h, _ in batch],
                "statuses": [o.status for _, o in batch],
                "results": [None if o.result is None else Jsonb(o.result) for _, o in batch],
                "last_errors": [o.last_error for _, o in batch],
                "error_entries": [None if o.error_entry is None else Jsonb(o.error_entry) for _, o in batch],
                "retry_delays": [o.retry_delay for _, o in batch],
                "snoozed": [o.snoozed for _, o in batch],
            },
        )
        written = {job_id for job_id, ok in rows if ok}
        locked = {job_id for job_id, ok in rows if not ok}
        with self._lock:
            for held, _ in batch:
                if held.id not in locked:
                    self._held.pop(held.id, None)
            self.counts["lost_leases"] += len(batch) - len(written) - len(locked)
        waiting = []
        for held, outcome in batch:
            if held.id in locked:
                if not held.finish_skipped:
                    held.finish_skipped = True
                    logger.warning(
                        "finish skipped job=%s attempt=%s worker=%s: row locked by another transaction; "
                        "retrying",
                        held.id,
                        held.attempt,
                        self.worker_id,
                    )
                waiting.append((held, outcome))
                continue
            if held.id not in written:
                held.ctx.mark_lease_lost()
                logger.warning(
                    "lease lost job=%s attempt=%s worker=%s: stale %s dropped (the job moved on)",
                    held.id,
                    held.attempt,
                    self.worker_id,
                    outcome.status,
                )
                continue
            self._log_outcome(held, outcome)
        self._wake.set()
        return waiting

    def _log_outcome(self, held: HeldJob, outcome: Outcome) -> None:
        ids = (held.id, held.attempt, self.worker_id)
        if outcome.snoozed:
            self.counts["snoozed"] += 1
            logger.info("snoozed job=%s attempt=%s worker=%s for %.1fs", *ids, outcome.retry_delay)
        elif outcome.status == "queued":
            self.counts["retried"] += 1
            logger.warning(
                "retry job=%s attempt=%s worker=%s in %.1fs: %s",
                *ids,
                outcome.retry_delay,
                outcome.last_error,
            )
        elif outcome.status == "failed":
            self.counts["failed"] += 1
            logger.error("failed job=%s attempt=%s worker=%s: %s", *ids, outcome.last_error)
        elif outcome.status == "cancelled":
            logger.info("cancelled job=%s attempt=%s worker=%s", *ids)
        else:
            self.counts["done"] += 1
            logger.info("done job=%s attempt=%s worker=%s", *ids)

    # -- heartbeats and timeouts -----------------------------------------------

    def _beat_interval(self, lease: float) -> float:
        return self.options.heartbeat_seconds or lease / 3

    def _heartbeat_loop(self) -> None:
        next_beat = time.monotonic()
        while not self._done.is_set():
            now = time.monotonic()
            with self._lock:
                held = [h for h in self._held.values() if not (h.settled and h.deadline == -1)]
            self._check_timeouts(held, now)
            if self.options.heartbeat and now >= next_beat:
                shortest = min((h.lease_seconds for h in held), default=self.lease_seconds)
                next_beat = now + self._beat_interval(shortest)
                if held:
                    self._beat(held)
            deadlines = [h.deadline for h in held if h.deadline and h.deadline > 0 and not h.settled]
            wake_at = min([next_beat, *deadlines]) if self.options.heartbeat else min([now + 1, *deadlines])
            self._done.wait(max(0.01, min(wake_at - time.monotonic(), 1.0)))

    def _check_timeouts(self, held: list[HeldJob], now: float) -> None:
        for h in held:
            if h.deadline is None or h.deadline < 0 or now < h.deadline or h.settled:
                continue
            assert h.task is not None
            outcome = self._failure(
                h, TimeoutError(f"job ran past its timeout of {h.task.timeout_seconds} s")
            )
            if self._settle(h, outcome):
                h.deadline = -1
                # The body may go on, but its writes are fenced off from now.
                h.ctx.mark_lease_lost()
                logger.warning(
                    "timeout job=%s attempt=%s worker=%s: %s",
                    h.id,
                    h.attempt,
                    self.worker_id,
                    outcome.last_error,
                )

    def _beat(self, held: list[HeldJob]) -> None:
        try:
            rows = self._beat_db.execute(
                sql.HEARTBEAT,
                {
                    "ids": [h.id for h in held],
                    "attempts": [h.attempt for h in held],
                    "lease_seconds": [h.lease_seconds for h in held],
                },
            )
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
            logger.warning(
                "heartbeat timed out worker=%s jobs=%d: %s", self.worker_id, len(held), _one_line(exc)
            )
            return
        except CONNECTION_ERRORS as exc:
            logger.warning(
                "heartbeat failed worker=%s jobs=%d: %s", self.worker_id, len(held), _one_line(exc)
            )
            return
        by_id = {h.id: h for h in held}
        for job_id, renewed, cancel_requested, still_held in rows:
            h = by_id[job_id]
            if cancel_requested and not h.ctx.cancel_requested:
                h.ctx.mark_cancel_requested()
                logger.info("cancel requested job=%s attempt=%s worker=%s", h.id, h.attempt, self.worker_id)
            if not still_held:
                with self._lock:
                    current = self._held.get(job_id)
                if current is h and not h.settled:
                    self._drop(h, "heartbeat found the job taken over or no longer running")
            elif not renewed:
                logger.info(
                    "heartbeat skipped job=%s attempt=%s worker=%s: row locked by another transaction",
                    h.id,
                    h.attempt,
                    self.worker_id,
                )

    # -- wake-ups --------------------------------------------------------------

    def _listen(self) -> None:
        """Wake the claim loop on NOTIFY; reconnect and re-LISTEN after failures."""
        listener = WorkerConnection("listen", self.worker_id)
        listen = psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel))
        while not self._done.is_set():
            try:
                conn = listener.connect()
                conn.execute(listen)
                self._wake.set()  # anything enqueued while we were not listening
                while not self._done.is_set():
                    for notify in conn.notifies(timeout=1.0):
                        if self.options.queues is None or notify.payload in self.options.queues:
                            self._wake.set()
            except CONNECTION_ERRORS as exc:
                listener.close()
                if not self._done.is_set():
                    logger.warning(
                        "listener lost worker=%s: %s; polling until it is back",
                        self.worker_id,
                        _one_line(exc),
                    )
                    self._done.wait(1.0)
        listener.close()

    # -- stopping --------------------------------------------------------------

    def _drain(self) -> None:
        """Wait for running bodies: forever after --burst/--max-jobs, else until grace ends.

        After a stop request, jobs still in the buffer never start: their
        leases are given back at once, so other workers can take them now.
        """
        while True:
            if self._stopping.is_set():
                self._release_buffered()
            with self._lock:
                busy = self._running or self._buffer
                unwritten = any(h.settled for h in self._held.values())
            if not busy and not unwritten:
                return
            if self._grace_deadline is not None and time.monotonic() >= self._grace_deadline:
                return
            self._wake.wait(0.05)
            self._wake.clear()

    def _release_buffered(self) -> None:
        with self._lock:
            if not self._buffer:
                return
            jobs = list(self._buffer)
            self._buffer.clear()
            for h in jobs:
                h.settled = True
                self._held.pop(h.id, None)
        self._release(jobs)

    def _release_all(self) -> None:
        """Give back the lease of every job still held (claimable at once)."""
        with self._lock:
            unsettled = [h for h in self._held.values() if not h.settled]
            for h in unsettled:
                h.settled = True
                h.ctx.mark_lease_lost()
        self._release(unsettled)

    def _release(self, jobs: list[HeldJob]) -> None:
        if not jobs:
            return
        try:
            rows = self._finish_db.execute(
                sql.RELEASE, {"ids": [h.id for h in jobs], "attempts": [h.attempt for h in jobs]}
            )
        except CONNECTION_ERRORS as exc:
            logger.warning(
                "could not give back %d lease(s) worker=%s: %s; they expire on their own",
                len(jobs),
                self.worker_id,
                _one_line(exc),
            )
            return
        released = {r[0] for r in rows}
        for h in sorted(jobs, key=lambda h: h.id):
            if h.id in released:
                logger.info("released job=%s worker=%s", h.id, self.worker_id)
            else:
                logger.warning(
                    "lease not given back job=%s attempt=%s worker=%s: its row is locked by another "
                    "transaction or the job moved on; the lease runs out on its own",
                    h.id,
                    h.attempt,
                    self.worker_id,
                )


def _tidy_django_connections() -> None:
    """After a body: drop Django connections a failure left unusable.

    Healthy connections are kept (a new connection per job is what makes a
    naive Django worker slow); a broken one is closed so the next job gets a
    fresh one instead of the same error.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and conn.errors_occurred:
            conn.close_if_unusable_or_obsolete()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
