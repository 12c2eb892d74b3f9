"""The worker: wires its parts together, supervises their threads, stops in phases.

Threads, each with one owner and its own database connection where it needs one:
- the main thread claims (``Claimer``);
- ``concurrency`` runner threads run bodies (``Runners``);
- the heartbeat thread keeps leases alive and enforces timeouts (``Heartbeater``);
- the finisher thread writes outcomes in batches (``Finisher``);
- the listener thread turns NOTIFY into a wake-up (``listener.listen``);
- the periodic thread enqueues the jobs of periodic schedules as their ticks
  come (``leasejobs.periodic.scheduler``; not with ``--no-periodic``);
- the vacuum thread VACUUMs the job table when dead row versions pile up
  (``Vacuumer``; not with ``--no-vacuum``);
- the stop thread acts on stop signals, which the signal handler only
  queues (``request_stop``: a handler must take no lock).
They share one thing, the table of held jobs (``HeldJobs``), which owns
the lock. A thread that dies of anything but one job's data takes the
process down with a clear line and a non-zero exit, so a supervisor restarts
it: never a half-alive worker that holds leases and writes no outcome.
"""

import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import psycopg
from django.db import DatabaseError

from leasejobs import conf, controls, pooling, registry
from leasejobs.connection import CONNECTION_ERRORS
from leasejobs.periodic.scheduler import Scheduler
from leasejobs.store import Outcome, WorkerStore
from leasejobs.worker import rules
from leasejobs.worker.claimer import Claimer
from leasejobs.worker.events import Events
from leasejobs.worker.finisher import Finisher
from leasejobs.worker.heartbeat import Heartbeater
from leasejobs.worker.held import HeldJob, HeldJobs
from leasejobs.worker.listener import listen
from leasejobs.worker.options import WorkerOptions
from leasejobs.worker.runners import Runners
from leasejobs.worker.shutdown import Shutdown
from leasejobs.worker.vacuum import Vacuumer

#: SQLSTATE of "permission denied".
INSUFFICIENT_PRIVILEGE = "42501"

#: The exit status of a worker one of whose threads died (EX_SOFTWARE).
THREAD_DIED_EXIT = 70

#: How long the finisher may go on writing after the grace period, for rows
#: that stay locked or a database that is away; their leases then run out.
FINISH_AFTER_GRACE_SECONDS = 1.0


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.worker_id = options.worker_id
        self.lease_seconds = float(options.lease_seconds or conf.get("LEASE_SECONDS"))
        self.poll_interval = float(options.poll_interval or conf.get("POLL_INTERVAL_SECONDS"))
        self.prefetch = int(conf.get("PREFETCH") if options.prefetch is None else options.prefetch)
        self.channel = str(conf.get("NOTIFY_CHANNEL"))
        self.events = Events(self.worker_id)
        self.held = HeldJobs()
        self.shutdown = Shutdown(options.grace_seconds)
        self._done = threading.Event()
        self.plan = options.connections or pooling.direct()
        interval = rules.heartbeat_interval(options.heartbeat_seconds, self.lease_seconds)
        self.store = WorkerStore(self.worker_id, heartbeat_timeout=interval, pooled=self.plan.pooled)
        self.heartbeater = Heartbeater(
            self.store,
            self.held,
            self.events,
            enabled=options.heartbeat,
            interval_option=options.heartbeat_seconds,
            default_lease=self.lease_seconds,
            settle=self._settle_timed_out,
        )
        self.finisher = Finisher(self.store, self.held, self.events, on_written=self._wake_claimer)
        self.runners = Runners(
            self.store, self.held, self.events, settle=self._settle, buffer_low=self._buffer_low
        )
        self.claimer = Claimer(
            self.store,
            self.held,
            self.events,
            options,
            lease_seconds=self.lease_seconds,
            poll_interval=self.poll_interval,
            prefetch=self.prefetch,
            mean_duration=lambda: self.runners.mean_duration,
            settle=self._settle,
            new_lease=self._new_lease,
            after_side_effect=self.heartbeater.poke,
        )
        self._threads: list[threading.Thread] = []
        #: Stop requests from the signal handler (True), and the stop thread's end (False).
        self._stop_requests: queue.SimpleQueue[bool] = queue.SimpleQueue()

    # -- the parts' shared moves -----------------------------------------------

    def _settle(self, job: HeldJob, outcome: Outcome) -> bool:
        """Decide an attempt's one outcome and hand it to the finisher (False if decided before)."""
        if not self.held.settle(job, outcome):
            return False
        self.finisher.submit(job)
        return True

    def _settle_timed_out(self, job: HeldJob, outcome: Outcome) -> bool:
        """A timeout: settled like any outcome, but the attempt gets no more heartbeats."""
        if not self.held.settle(job, outcome, beating=False):
            return False
        self.finisher.submit(job)
        return True

    def _buffer_low(self, buffered: int) -> None:
        if buffered <= self.options.concurrency and not self.claimer.wake.is_set():
            self.claimer.wake.set()  # a slot is free and the buffer runs low: claim more

    def _wake_claimer(self) -> None:
        self.claimer.wake.set()

    def _new_lease(self, shortest: float) -> None:
        """Jobs were claimed: heartbeat sooner if one holds a shorter lease than the tick assumed."""
        if shortest < self.lease_seconds:
            self.heartbeater.poke()

    # -- life cycle ------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; a second request ends the grace period at once.

        Called by the SIGTERM/SIGINT handler, which runs in the main thread
        between any two bytecodes: also while that thread holds a lock (its
        own ``claimer.wake``'s, inside ``wait()`` or ``clear()``, or a log
        stream's). So it takes none: it only puts the request on a reentrant
        queue (``SimpleQueue.put`` may be called from a signal handler), and
        the stop thread acts on it.
        """
        self._stop_requests.put(True)

    def _handle_stops(self) -> None:
        """The stop thread: each stop request starts the grace period, or ends it; False ends the thread."""
        while self._stop_requests.get():
            if self.shutdown.request():
                self.events.stopping(self.options.grace_seconds, self.held.running)
            else:
                self.events.stop_now()
            self.claimer.wake.set()

    def run(self) -> None:
        """Run until stopped (signal, --burst, --max-jobs); returns once every lease is settled."""
        o = self.options
        beat = f"{o.heartbeat_seconds}s" if o.heartbeat_seconds else "lease/3"
        beat = beat if o.heartbeat else "off"
        self.events.started(
            f"queues={','.join(o.queues) if o.queues else 'all'} concurrency={o.concurrency} "
            f"prefetch={self.prefetch} lease={self.lease_seconds:.1f}s heartbeat={beat} "
            f"{self.plan.description}"
        )
        self._warn_clamped_heartbeats()
        self._sync_queue_settings()
        self._start(self._handle_stops, "leasejobs-stop")
        if (listen_params := self.plan.listen) is not None:
            self._start(
                lambda: listen(
                    listen_params,
                    self.channel,
                    self.worker_id,
                    o.queues,
                    self.claimer.notified,
                    self._done,
                    self.events,
                ),
                "leasejobs-listener",
            )
        scheduler = Scheduler(self.worker_id) if o.periodic else None
        periodic = None
        if scheduler is not None and scheduler.schedules:
            periodic = self._start(lambda: self._run_schedules(scheduler), "leasejobs-periodic")
        vacuumer = self._vacuumer()
        vacuuming = None if vacuumer is None else self._start(vacuumer.run, "leasejobs-vacuum")
        self._start(self.heartbeater.run, "leasejobs-heartbeat")
        finisher = self._start(self.finisher.run, "leasejobs-finisher")
        for i in range(o.concurrency):
            self._start(self.runners.run, f"leasejobs-runner-{i}")
        try:
            self.claimer.run(self.shutdown.requested)
            if vacuumer is not None:
                vacuumer.stop()  # stopping: a deploy's migrate must not wait for a VACUUM of ours
            self._drain()
        finally:
            self.shutdown.releasing()
            self.held.close()
            # Drop what still runs before the finisher's last flush: no body can settle
            # after this, so no outcome arrives once the finisher has exited. Their
            # leases are released after it: the two share a connection, and during an
            # outage the release must not delay the finisher's giving up.
            unfinished = self.held.give_back()
            self.finisher.close(give_up_at=self._finish_deadline())
            finisher.join(timeout=30)
            self._give_back(unfinished)
            self.heartbeater.stop()
            self._done.set()
            if periodic is not None:
                periodic.join(timeout=5)  # it closes its connection and logs its figures
            if vacuumer is not None and vacuuming is not None:
                vacuumer.stop()  # again, if claiming ended in an exception
                vacuuming.join(timeout=5)
            self._forget_me()
            self.store.close()
            self._stop_requests.put(False)
            self.shutdown.stopped()
            self.events.stopped(self.held.counts)

    def _vacuumer(self) -> Vacuumer | None:
        threshold = conf.get("VACUUM_THRESHOLD")
        if not self.options.vacuum or threshold is None:
            return None
        return Vacuumer(
            self.worker_id,
            self.events,
            threshold=int(threshold),
            scale_factor=float(conf.get("VACUUM_SCALE_FACTOR")),
            pooled=self.plan.pooled,
        )

    def _sync_queue_settings(self) -> None:
        """Write LEASEJOBS["QUEUES"] to the queue table; a role not allowed to is told, not stopped."""
        try:
            controls.sync_settings()
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
                raise
            self.events.queue_settings_not_written(exc)

    def _start(self, target: Callable[[], None], name: str) -> threading.Thread:
        # Daemon threads: a body still running past the grace period must not
        # keep the process alive once its lease has been given back.
        thread = threading.Thread(target=self._supervised(target, name), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _supervised(self, target: Callable[[], None], name: str) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.events.thread_died(name, exc)
                logging.shutdown()  # flush the line above before the process ends
                os._exit(THREAD_DIED_EXIT)

        return run

    def _run_schedules(self, scheduler: Scheduler) -> None:
        """Enqueue periodic jobs as their ticks come, until the worker stops claiming."""
        try:
            while not self.shutdown.requested.is_set() and not self._done.is_set():
                # At most a second asleep: --burst and --max-jobs end without a stop request.
                self.shutdown.requested.wait(min(1.0, scheduler.run_due()))
        finally:
            scheduler.close()

    def _warn_clamped_heartbeats(self) -> None:
        option = self.options.heartbeat_seconds
        if option is None or not self.options.heartbeat:
            return
        for name, task in sorted(registry.all_tasks().items()):
            if task.lease_seconds and rules.heartbeat_interval(option, task.lease_seconds) < option:
                interval = rules.heartbeat_interval(option, task.lease_seconds)
                self.events.heartbeat_clamped(name, float(task.lease_seconds), interval)

    def _forget_me(self) -> None:
        """A clean stop removes this worker's liveness row (a killed one's goes stale)."""
        try:
            self.store.gone()
        except psycopg.Error as exc:
            self.events.liveness_failed(exc)

    def _finish_deadline(self) -> float:
        if self.shutdown.grace_deadline is None:
            return time.monotonic() + FINISH_AFTER_GRACE_SECONDS
        return max(time.monotonic(), self.shutdown.grace_deadline + FINISH_AFTER_GRACE_SECONDS)

    # -- stopping --------------------------------------------------------------

    def _drain(self) -> None:
        """Wait for running bodies: forever after --burst/--max-jobs, else until grace ends.

        After a stop request, jobs still in the buffer never start: their
        leases are given back at once, so other workers can take them now.
        """
        while True:
            if self.shutdown.requested.is_set():
                self._give_back(self.held.stop_starting())
                if self.shutdown.grace_over():
                    return
            if not self.held.busy():
                return
            self.claimer.wake.wait(0.05)
            self.claimer.wake.clear()

    def _give_back(self, jobs: list[HeldJob]) -> None:
        """Release these leases (claimable at once); refund runs counted but never started."""
        if not jobs:
            return
        for job in jobs:
            job.ctx.mark_lease_lost()
        try:
            released = self.store.release(
                [(j.key, j.counted and not j.started) for j in jobs], slotted=any(j.slots for j in jobs)
            )
        except CONNECTION_ERRORS as exc:
            self.events.release_failed(len(jobs), exc)
            return
        for job in sorted(jobs, key=lambda j: j.key.id):
            self.events.released(job, job.key in released)
