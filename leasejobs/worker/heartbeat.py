"""Heartbeats: the thread that keeps held leases alive.

One HEARTBEAT statement per tick extends the lease of every attempt the
worker holds (in a child's hands, being stopped, or settled and waiting to
be written). The tick follows the shortest lease held (a third of it by
default), recomputed whenever a job with a shorter lease is claimed
(``poke``), so a task's own short lease is heartbeated in time from its
first second. Each renewal moves on the deadline at which the zygote kills
a body whose lease could not be renewed. A heartbeat that finds an attempt
no longer holding its job (taken over, released, its place lost) stops its
body; one that finds a cancel requested tells the body
(``ctx.cancel_requested``) and keeps an unstarted job from starting.
"""

import threading
import time

import psycopg

from leasejobs import conf
from leasejobs.db.connection import CONNECTION_ERRORS
from leasejobs.db.store import WorkerStore
from leasejobs.worker import rules
from leasejobs.worker.events import Events
from leasejobs.worker.held import HeldJob, HeldJobs
from leasejobs.worker.pool import Pool
from leasejobs.worker.slots import LEASE_LOST


class Heartbeater:
    def __init__(
        self,
        store: WorkerStore,
        held: HeldJobs,
        pool: Pool,
        events: Events,
        *,
        enabled: bool,
        interval_option: float | None,
        default_lease: float,
    ) -> None:
        self.store = store
        self.held = held
        self.pool = pool
        self.events = events
        self.enabled = enabled
        self.interval_option = interval_option
        self.default_lease = default_lease
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._last_beat = time.monotonic()
        self._summary_at = time.monotonic()
        #: How often a working worker says what it did (``done=N failed=N ...``) at INFO.
        self.summary_seconds = float(conf.get("SUMMARY_SECONDS"))
        self._summary_counts = dict(held.counts)

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
        # The liveness row is written at once, not one interval in: a worker
        # just started is live for `leasejobs_health --worker` and the admin.
        if self.enabled:
            self._alive(self.interval(self.held.to_beat()), first=True)
        while not self._stop.is_set():
            jobs = self.held.to_beat()
            now = time.monotonic()
            wake_at = now + 1.0
            if self.enabled:
                next_beat = self._last_beat + self.interval(jobs)
                if now >= next_beat:
                    self._last_beat = now
                    if jobs:
                        self._beat(jobs, lag=now - next_beat)
                    self._alive(self.interval(jobs), first=False)
                    next_beat = now + self.interval(jobs)
                wake_at = min(wake_at, next_beat)
            self._summarize(now)
            self._poke.wait(max(0.005, wake_at - time.monotonic()))
            self._poke.clear()

    def _summarize(self, now: float) -> None:
        """Once a minute, while the worker works, one INFO line of what it did meanwhile."""
        if now - self._summary_at < self.summary_seconds:
            return
        counts = dict(self.held.counts)
        delta = {name: n - self._summary_counts.get(name, 0) for name, n in counts.items()}
        running = len(self.held)
        if any(delta.values()) or running:
            self.events.working(now - self._summary_at, delta, running)
        self._summary_at, self._summary_counts = now, counts

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
            if row.cancel_requested and not job.cancel_requested:
                job.cancel_requested = True
                self.pool.cancel(job)
                self.events.cancel_requested(job)
            if not row.held:
                if self.held.drop(job):
                    why = "taken over, no longer running, or its place under a limit lost"
                    self.events.lease_lost(job, f"heartbeat found the job {why}; its body is stopped")
                    self.pool.stop_body(
                        job, LEASE_LOST, min(rules.LOST_GRACE_SECONDS, self.interval(jobs) / 2)
                    )
            elif not row.renewed:
                # Its body's side-effect block holds the row (no claim can take it); the
                # block renews the lease as it commits. Under limits, the places are what
                # could run out meanwhile: renewed, they keep the zygote's watchdog quiet.
                if job.slots and row.places_renewed >= job.slots:
                    job.lease_ends = sent + job.lease_seconds
                self.events.heartbeat_skipped(job)
            else:
                job.lease_ends = sent + job.lease_seconds
        self.pool.renewed()
