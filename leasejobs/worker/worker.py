"""The worker: wires its parts together, supervises their threads, stops in phases.

Job bodies run in child processes (``leasejobs.worker.child``), forked by
the zygote (``leasejobs.worker.zygote``), which the worker forks once at
start, before any thread. The worker process itself runs no body: a body
cannot hold its GIL, crash it or fill its memory, and it can always stop a
body, by killing its child.

Threads of the worker, each with one owner and its own database connection
where it needs one:
- the main thread claims (``Claimer``) and hands jobs to the children;
- the pool thread talks to the children (``Pool``): jobs out, how bodies
  ended in; it enforces ``timeout_seconds`` and stops and replaces children;
- the heartbeat thread keeps leases alive (``Heartbeater``);
- the finisher thread writes outcomes in batches (``Finisher``);
- the listener thread turns NOTIFY into a wake-up (``listener.listen``);
- the periodic thread enqueues the jobs of periodic schedules as their ticks
  come (``leasejobs.periodic.scheduler``; not with ``--no-periodic``);
- the vacuum thread VACUUMs the job table when dead row versions pile up
  (``Vacuumer``; not with ``--no-vacuum``);
- the stop thread acts on stop signals, which the signal handler only
  queues (``request_stop``: a handler must take no lock).
They share the table of held jobs (``HeldJobs``) and the pool. A thread
that dies of anything but one job's data takes the process down with a
clear line and a non-zero exit (its zygote and children die with it), so a
supervisor restarts it: never a half-alive worker that holds leases and
writes no outcome.
"""

import contextlib
import ctypes
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import psycopg
from django.db import DatabaseError, connections

from leasejobs import conf
from leasejobs.db import pooling
from leasejobs.db.connection import CONNECTION_ERRORS
from leasejobs.db.store import WorkerStore
from leasejobs.jobs import registry
from leasejobs.periodic.scheduler import Scheduler
from leasejobs.queues import controls
from leasejobs.worker import child, rules
from leasejobs.worker.claimer import Claimer
from leasejobs.worker.events import Events
from leasejobs.worker.finisher import Finisher
from leasejobs.worker.front_look import FrontLook
from leasejobs.worker.heartbeat import Heartbeater
from leasejobs.worker.held import HeldJob, HeldJobs, Phase, refunds
from leasejobs.worker.listener import listen
from leasejobs.worker.options import WorkerOptions
from leasejobs.worker.pool import Pool
from leasejobs.worker.shutdown import Shutdown
from leasejobs.worker.slots import STOPPED, SlotTable
from leasejobs.worker.vacuum import Vacuumer
from leasejobs.worker.zygote import Zygote

#: SQLSTATE of "permission denied", and of a server that answers read-only.
INSUFFICIENT_PRIVILEGE = "42501"
READ_ONLY = "25006"

#: The exit status of a worker one of whose threads died (EX_SOFTWARE).
THREAD_DIED_EXIT = 70

#: How long the finisher may go on writing after the grace period, for rows
#: that stay locked or a database that is away; their leases then run out.
FINISH_AFTER_GRACE_SECONDS = 1.0


#: How long the worker waits, at the end of a stop, for the bodies it stopped to be gone.
STOPPED_BODIES_WAIT_SECONDS = 5.0


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        """Wire the parts; ``start_children`` (or ``run``) forks the zygote."""
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
        self.slots = SlotTable(options.concurrency)
        self.finisher = Finisher(self.store, self.held, self.events, on_written=self._wake_claimer)
        self.pool = Pool(
            self.slots,
            self.held,
            self.events,
            finish=self.finisher.submit,
            work_wanted=self._wake_claimer,
            stop_grace=float(conf.get("STOP_GRACE_SECONDS")),
            watch=options.heartbeat,
        )
        self.heartbeater = Heartbeater(
            self.store,
            self.held,
            self.pool,
            self.events,
            enabled=options.heartbeat,
            interval_option=options.heartbeat_seconds,
            default_lease=self.lease_seconds,
        )
        self.claimer = Claimer(
            self.store,
            self.held,
            self.pool,
            self.events,
            options,
            lease_seconds=self.lease_seconds,
            poll_interval=self.poll_interval,
            prefetch=self.prefetch,
            prefetch_bytes=int(conf.get("PREFETCH_BYTES")),
            finish=self.finisher.submit,
            new_lease=self._new_lease,
            results_pending=lambda: self.finisher.pending_bytes,
        )
        self._threads: list[threading.Thread] = []
        #: Stop requests from the signal handler (True), and the stop thread's end (False).
        self._stop_requests: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def start_children(self) -> None:
        """Fork the zygote that forks the children; call it before this process starts a thread."""
        if self.pool.zygote is None:
            self.pool.zygote = _fork_zygote(self.options, self.slots)

    # -- the parts' shared moves -----------------------------------------------

    def _wake_claimer(self) -> None:
        if not self.claimer.wake.is_set():
            self.claimer.wake.set()

    def _new_lease(self, shortest: float) -> None:
        """Jobs were claimed: heartbeat sooner if one holds a shorter lease than the tick assumed."""
        if shortest < self.lease_seconds:
            self.heartbeater.poke()

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
                self.events.stopping(self.options.grace_seconds, len(self.held.in_phase(Phase.ASSIGNED)))
            else:
                self.events.stop_now()
            self.claimer.wake.set()

    def run(self) -> None:
        """Run until stopped (signal, --burst, --max-jobs); returns once every lease is settled."""
        o = self.options
        beat = f"{o.heartbeat_seconds}s" if o.heartbeat_seconds else "lease/3"
        beat = beat if o.heartbeat else "off"
        tasks = registry.all_tasks()
        self.events.started(
            f"queues={','.join(o.queues) if o.queues else 'all'} concurrency={o.concurrency} "
            f"processes={o.concurrency} prefetch={self.prefetch} lease={self.lease_seconds:.1f}s "
            f"heartbeat={beat} {self.plan.description} "
            f"tasks={len(tasks)} ({', '.join(f'{name}@{t.queue}' for name, t in sorted(tasks.items()))})"
        )
        self._warn_clamped_heartbeats()
        self._warn_unused_queues()
        self._sync_queue_settings()
        self.start_children()  # before the first thread, unless runworker did it already
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
                    claims=self.plan.listen_claims,
                ),
                "leasejobs-listener",
            )
        scheduler = Scheduler(self.worker_id) if o.periodic else None
        periodic = None
        if scheduler is not None and scheduler.schedules:
            periodic = self._start(lambda: self._run_schedules(scheduler), "leasejobs-periodic")
        vacuumer = self._vacuumer()
        vacuuming = None if vacuumer is None else self._start(vacuumer.run, "leasejobs-vacuum")
        front = self.claimer.front = FrontLook(
            self.worker_id,
            self.claimer.start,
            o.queues,
            self.events,
            self.claimer.wake.set,
            pooled=self.plan.pooled,
        )
        front_thread = self._start(front.run, "leasejobs-front")
        self._start(self.heartbeater.run, "leasejobs-heartbeat")
        finisher = self._start(self.finisher.run, "leasejobs-finisher")
        self.pool.start(o.concurrency)
        pool = self._start(self.pool.run, "leasejobs-pool")
        try:
            self.claimer.run(self.shutdown.requested)
            front.stop()  # no claim will take what a look finds
            if vacuumer is not None:
                vacuumer.stop()  # stopping: a deploy's migrate must not wait for a VACUUM of ours
            self._drain()
        finally:
            self.shutdown.releasing()
            self._stop_bodies()
            self.pool.close()
            pool.join(timeout=STOPPED_BODIES_WAIT_SECONDS)
            # Whatever is still held and not settled is given back after the
            # finisher's last flush: the two share a connection, and during an
            # outage the release must not delay the finisher's giving up.
            unfinished = self.pool.take_given_back() + self.claimer.take_unreleased() + self._give_up_held()
            self.finisher.close(give_up_at=self._finish_deadline())
            finisher.join(timeout=30)
            self._give_back(unfinished)
            front.stop()  # again, if claiming ended in an exception
            self.heartbeater.stop()
            self._done.set()
            if self.pool.zygote is not None:
                self.pool.zygote.stop()
            if periodic is not None:
                periodic.join(timeout=5)  # it closes its connection and logs its figures
            if vacuumer is not None and vacuuming is not None:
                vacuumer.stop()  # again, if claiming ended in an exception
                vacuuming.join(timeout=5)
            self._forget_me()
            front_thread.join(timeout=1)  # its look was cancelled (FrontLook.stop); it closes its connection
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
            if getattr(exc.__cause__, "sqlstate", None) not in (INSUFFICIENT_PRIVILEGE, READ_ONLY):
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
            _name_os_thread(name)
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

    def _warn_unused_queues(self) -> None:
        """A ``--queue`` no registered task has as its queue: most often a typo."""
        used = sorted({t.queue for t in registry.all_tasks().values()})
        for name in self.options.queues or []:
            if name not in used:
                self.events.queue_unused(name, used)

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

        After a stop request, jobs no child has started never start: their
        leases are given back at once (their counted runs refunded), so
        other workers can take them now. A give-back the claimer found
        locked is tried again meanwhile and waited for, as a body is: left
        to its lease, its job would wait that long, and one of a single
        attempt would be failed unrun by the claim that takes it over.
        """
        while True:
            pending = self.claimer.give_back_pending()
            if self.shutdown.requested.is_set():
                self.pool.stop_starting()
                self._give_back(self.pool.take_given_back())
                if self.shutdown.grace_over():
                    return
            if not self.held.busy() and not pending:
                return
            self.claimer.wake.wait(0.05)
            self.claimer.wake.clear()

    def _stop_bodies(self) -> None:
        """The grace is over: stop every body still running, wait until each is gone, give its lease back.

        An attempt is given back only once its body has stopped, so its place
        under a limit is free only when no body of it runs.
        """
        running = self.held.in_phase(Phase.ASSIGNED)
        for job in running:
            if self.held.stop(job, None, "the worker stopped and its grace period was over"):
                self.pool.stop_body(job, STOPPED, rules.SHUTDOWN_KILL_SECONDS)
        deadline = time.monotonic() + STOPPED_BODIES_WAIT_SECONDS
        while running and time.monotonic() < deadline:
            self._give_back(self.pool.take_given_back())
            if not self.held.in_phase(Phase.STOPPING):
                return
            time.sleep(0.02)

    def _give_up_held(self) -> list[HeldJob]:
        """Jobs still held when the worker exits: those whose body never started are given
        back (claimable at once); a body that started and is not known to be gone keeps
        its lease, which runs out as a killed worker's would, so no other attempt runs
        beside it sooner."""
        given: list[HeldJob] = []
        for job in self.held.in_phase(Phase.ASSIGNED) + self.held.in_phase(Phase.STOPPING):
            if self.pool.may_have_started(job):
                self.events.left_to_its_lease(job)
            elif self.held.give_back(job):
                given.append(job)
        return given

    def _give_back(self, jobs: list[HeldJob]) -> None:
        """Release these leases (claimable at once); refund runs counted but never started."""
        if not jobs:
            return
        for job in jobs:
            job.lease_lost = True
        try:
            released = self.store.release(refunds(jobs), slotted=any(j.slots for j in jobs))
        except CONNECTION_ERRORS as exc:
            self.events.release_failed(len(jobs), exc)
            return
        for job in sorted(jobs, key=lambda j: j.key.id):
            self.events.released(job, job.key in released)


def _name_os_thread(name: str) -> None:
    """Give the OS thread the Python thread's name (Linux), so ``top -H`` and
    ``/proc/<pid>/task/*/comm`` show which of the worker's threads is busy."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.removeprefix("leasejobs-")[:15].encode(), 0, 0, 0)


#: ``prctl`` option: this thread's name.
_PR_SET_NAME = 15


def _fork_zygote(options: WorkerOptions, slots: SlotTable) -> Zygote:
    """Fork the zygote that forks the children (``leasejobs.worker.zygote``).

    Django's connections are closed first: a forked process must never use
    (or close) a connection its parent holds. Everything imported so far is
    frozen out of the cycle collector's sight, so the children share those
    pages with the zygote instead of copying them when it walks them.
    """
    if threading.active_count() > 1:
        logging.getLogger("leasejobs.worker").warning(
            "the worker forks its zygote while %d threads run: fork it before starting threads",
            threading.active_count(),
        )
    connections.close_all()
    config = child.ChildConfig(
        worker_id=options.worker_id,
        max_jobs=options.max_jobs_per_child,
        max_memory=options.max_memory_per_child,
    )
    main = functools.partial(child.main, slots=slots, config=config)
    return Zygote.start(slots, main, bodies_per_child=1, watch=options.heartbeat)
