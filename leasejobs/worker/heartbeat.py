"""Heartbeats and timeouts: the thread that keeps held leases alive.

One HEARTBEAT statement per tick extends the lease of every attempt the
worker holds (buffered, running, or settled and waiting to be written). The
tick follows the shortest lease held (a third of it by default), recomputed
whenever a job with a shorter lease is claimed (``poke``), so a task's own
short lease is heartbeated in time from its first second. The same thread
enforces ``timeout_seconds``: a body past its deadline gets a timeout
outcome, and its attempt gets no more heartbeats. It also carries a cancel
request to the body's ``ctx.cancel_requested``.
"""

import threading
import time
from collections.abc import Callable

import psycopg

from leasejobs.connection import CONNECTION_ERRORS
from leasejobs.store import Outcome, WorkerStore
from leasejobs.worker import rules
from leasejobs.worker.events import Events
from leasejobs.worker.held import HeldJob, HeldJobs, Phase
from leasejobs.worker.outcomes import timeout_outcome


class Heartbeater:
    def __init__(
        self,
        store: WorkerStore,
        held: HeldJobs,
        events: Events,
        *,
        enabled: bool,
        interval_option: float | None,
        default_lease: float,
        settle: Callable[[HeldJob, Outcome], bool],
    ) -> None:
        self.store = store
        self.held = held
        self.events = events
        self.enabled = enabled
        self.interval_option = interval_option
        self.default_lease = default_lease
        self._settle = settle
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._last_beat = time.monotonic()

    def poke(self) -> None:
        """Look again now: a shorter lease was claimed, or a side-effect block ended."""
        self._poke.set()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()

    def interval(self, jobs: list[HeldJob]) -> float:
        shortest = min((j.lease_seconds for j in jobs), default=self.default_lease)
        return rules.heartbeat_interval(self.interval_option, shortest)

    def run(self) -> None:
        first = True
        while not self._stop.is_set():
            jobs = self.held.to_beat()
            now = time.monotonic()
            self._check_timeouts(jobs, now)
            wake_at = now + 1.0
            if self.enabled:
                next_beat = self._last_beat + self.interval(jobs)
                if now >= next_beat:
                    self._last_beat = now
                    if jobs:
                        self._beat(jobs, lag=now - next_beat)
                    self._alive(self.interval(jobs), first=first)
                    first = False
                    next_beat = now + self.interval(jobs)
                wake_at = min(wake_at, next_beat)
            deadlines = [j.deadline for j in jobs if j.deadline is not None and j.phase is Phase.RUNNING]
            wake_at = min([wake_at, *deadlines])
            self._poke.wait(max(0.005, wake_at - time.monotonic()))
            self._poke.clear()

    def _check_timeouts(self, jobs: list[HeldJob], now: float) -> None:
        for job in jobs:
            # Only a body still running can time out: a job settled just before its
            # deadline waits for its finish and must not wake this thread every tick.
            if job.deadline is None or now < job.deadline or job.phase is not Phase.RUNNING:
                continue
            outcome = timeout_outcome(job, self.events.worker_id)
            if self._settle(job, outcome):
                # The body may go on, but its writes are fenced off from now.
                job.ctx.mark_lease_lost()
                self.events.timeout(job, outcome.last_error or "")

    def _alive(self, interval: float, *, first: bool) -> None:
        """The worker's liveness row, refreshed every tick whether or not it holds jobs."""
        try:
            self.store.alive(interval, first=first)
        except psycopg.Error as exc:  # a lost connection, a missing grant: never the heartbeat's end
            self.events.liveness_failed(exc)

    def _beat(self, jobs: list[HeldJob], *, lag: float) -> None:
        began = time.perf_counter()
        sent = time.monotonic()
        try:
            rows = self.store.heartbeat([(j.key, j.lease_seconds) for j in jobs], [j.slots for j in jobs])
        except CONNECTION_ERRORS as exc:  # includes statement and lock timeouts
            self.events.heartbeat_failed(len(jobs), exc)
            return
        self.events.heartbeat_statement(time.perf_counter() - began, lag)
        by_key = {(j.key.id, j.key.attempt): j for j in jobs}
        for row in rows:
            job = by_key[(row.id, row.attempt)]
            if row.cancel_requested and not job.ctx.cancel_requested:
                job.ctx.mark_cancel_requested()
                self.events.cancel_requested(job)
            if not row.held:
                if self.held.drop(job):
                    why = "taken over, no longer running, or its place under a limit lost"
                    self.events.lease_lost(job, f"heartbeat found the job {why}")
            elif not row.renewed:
                self.events.heartbeat_skipped(job)
            else:
                job.lease_ends = sent + job.lease_seconds
