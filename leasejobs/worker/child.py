"""A worker's child: the process that runs job bodies, one at a time, in the order given.

The zygote forks it with Django and the tasks imported; it waits for jobs
on its socket, runs each body through ``leasejobs.worker.body.run`` and
reports how each ended. It never claims, heartbeats or finishes: the worker
does, in a process no body can starve of the GIL, crash or fill with memory.

Before a body starts, the child writes the job's assignment number into its
slot (``started``, then ``running``): if it dies, the worker knows exactly
which bodies had started. A job that waited in the child past its lease
(the worker was paused) does not start.

A body the worker stops (timeout, lost lease, the worker stopping) gets
``BodyStopped`` raised in it when the worker sends SIGUSR1 and the slot's
flags say so; once it has ended, the child reports it and leaves, since a
body interrupted mid-way may have left its process in any state. If it does
not end within the worker's grace, the worker has it killed.

A body that kills the process must not take its neighbours' outcomes with
it, so each body's outcome is safe before the next body starts: a plainly
done body (it returned None) is kept in the child's slot, which the worker
reads if the child dies (``SlotTable.keep_done``), and while it lives at
its looks at the bodies, every 10 to 50 ms (a long body may run before the
child's next report); any other report is sent at once. Between bodies,
the child sends what it keeps and looks for news from the worker (a revoke,
a stop) once ``REPORT_LINGER_SECONDS`` have passed, and whenever it runs out
of jobs: one write to the socket per millisecond of bodies, not one per body.
"""

import contextlib
import json
import logging
import math
import os
import random
import resource
import select
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import FrameType
from typing import Any

from asgiref.sync import SyncToAsync
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from leasejobs.exceptions import BodyStopped, LeaseLost
from leasejobs.observability import observe
from leasejobs.worker import body, outcomes, rules
from leasejobs.worker.channel import ChildChannel
from leasejobs.worker.messages import (
    LEAVING,
    REVOKE,
    RUN,
    STOP,
    UNSTARTED,
    BodyJob,
    Ended,
    body_jobs,
    ended_message,
)
from leasejobs.worker.slots import (
    BLOCK_ROW_LOCKED,
    BLOCK_WITH_PLACES,
    KEPT_RING,
    LEASE_LOST,
    NO_BLOCK,
    STOPPED,
    TIMED_OUT,
    SlotTable,
    flags_of,
)

logger = logging.getLogger("leasejobs.worker")

#: How often a child sends what it kept and looks for news from the worker while it
#: works through its jobs.
REPORT_LINGER_SECONDS = 0.001

#: How often a child measures its memory (``--max-memory-per-child``).
MEMORY_CHECK_SECONDS = 0.1

#: A failed body that ran this long is looked at for programs it left running (two
#: reads of /proc): starting one, waiting for it and giving up takes longer.
_PROGRAMS_LOOK_SECONDS = 0.0001

#: The signals whose handlers a failed body's child puts back as they were.
_RESTORED_SIGNALS = (
    signal.SIGALRM,
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGHUP,
    signal.SIGCHLD,
    signal.SIGPIPE,
    signal.SIGVTALRM,
    signal.SIGPROF,
)

#: The flags for which a running body is stopped.
_STOP_FLAGS = LEASE_LOST | TIMED_OUT | STOPPED


@dataclass(frozen=True)
class ChildConfig:
    """What every child of a worker is told at its fork."""

    worker_id: str
    #: Leave after this many bodies (``--max-jobs-per-child``), None: never.
    max_jobs: int | None = None
    #: Leave once the process's own memory passes this many bytes
    #: (``--max-memory-per-child``), None: never.
    max_memory: int | None = None


def main(fd: int, index: int, *, slots: SlotTable, config: ChildConfig) -> int:
    """The child's life: runs in the forked process; returns its exit status."""
    random.seed()  # each child its own retry jitter, not the zygote's sequence
    # Not SIG_IGN: an ignored signal stays ignored across exec, and a body's
    # subprocess must still end on terminate(). A handler is reset by exec.
    signal.signal(signal.SIGINT, _ignore)
    signal.signal(signal.SIGTERM, _ignore)
    child = Child(ChildChannel(fd), index, slots, config)
    signal.signal(signal.SIGUSR1, child.interrupt)
    observe.start_in_child()
    return child.run()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """SIGINT and SIGTERM are the worker's to act on (a supervisor may send them to every process)."""


class SlotView:
    """One body's view of its slot, given to its ``JobContext``."""

    __slots__ = ("_slot", "index", "seq")

    def __init__(self, slots: SlotTable, index: int, seq: int) -> None:
        self._slot = slots[index]
        self.index = index
        self.seq = seq

    def flags(self) -> int:
        return flags_of(self._slot, self.seq)

    def block_started(self, places: int) -> None:
        self._slot.block = BLOCK_WITH_PLACES if places else BLOCK_ROW_LOCKED

    def block_ended(self, renewed_until: float | None) -> None:
        # The renewed lease first, then the end of the block: the zygote never
        # sees the block over without the lease its commit renewed.
        if renewed_until is not None:
            self._slot.block_deadline = renewed_until
            self._slot.block_seq = self.seq
        self._slot.block = NO_BLOCK

    def lease_left(self) -> float | None:
        # The supervisor's deadline is its watchdog's (the first lease of this
        # child's jobs to run out, less a margin): a lower bound of this one's.
        deadline = self._slot.deadline
        if self._slot.block_seq == self.seq:
            deadline = max(deadline, self._slot.block_deadline)
        return deadline - time.monotonic() if deadline > 0 else None


class Child:
    def __init__(self, channel: ChildChannel, index: int, slots: SlotTable, config: ChildConfig) -> None:
        self.channel = channel
        self.index = index
        self.slots = slots
        self.slot = slots[index]
        self.config = config
        self.pid = os.getpid()
        self.queue: deque[BodyJob] = deque()
        self.revoked: set[int] = set()
        self.stopping = False
        self.ran = 0
        self._reports: list[Ended] = []
        #: Of ``_reports``, how many are kept in the slot; whether one is not (it must be
        #: sent before the next body starts).
        self._kept = 0
        self._unkept = False
        self._unstarted: list[int] = []
        self._looked_at = 0.0
        self._in_body = False
        self._running_seq = 0
        #: Whether the child waited for jobs since its last body (a connection may have
        #: been ended by the server meanwhile).
        self._waited = False
        #: When the memory was last measured (it costs a read of smaps_rollup): never, so
        #: the first body's is always looked at.
        self._memory_checked = -math.inf
        self._peak_checked = 0
        #: The threads a body may leave behind: those there before any body ran.
        self._threads = {t.ident for t in threading.enumerate()}
        #: Threads Python's ``threading`` does not know of (C libraries'), and the signal
        #: handlers and mask, as they are before any body ran (read by ``run``, once
        #: ``main`` has set the child's own handlers).
        self._native = _native_threads()
        self._signals: dict[int, Any] = {}
        self._mask: set[int | signal.Signals] = set()
        #: This thread's connection of every database, made now (none is opened):
        #: looked at after each body without asking Django's per-thread registry.
        self._databases = [connections[alias] for alias in connections]

    # -- the loop ----------------------------------------------------------------

    def run(self) -> int:
        self._signals = {signum: signal.getsignal(signum) for signum in _RESTORED_SIGNALS}
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        while True:
            if not self.queue:
                self._flush()
            if not self.queue:
                self._waited = True
            messages = self.channel.receive(wait=not self.queue)
            if messages is None:
                return 0  # the worker is gone
            self._take(messages)
            if self.stopping and not self.queue:
                self._flush()
                return 0
            while self.queue:
                job = self.queue.popleft()
                if self.stopping or job.seq in self.revoked or self._too_late(job):
                    self.revoked.discard(job.seq)
                    self._unstarted.append(job.seq)
                    continue
                # What ended before is safe before another body starts (kept in the slot,
                # or sent): a body that kills this process must not take its neighbours'
                # outcomes with it.
                if self._unkept or self._unstarted:
                    self._flush()
                try:
                    ran = self._run_one(job)
                except BodyStopped:  # landed just outside the body: it has ended all the same
                    ran = Ended(job.seq, None, 0.0, True), True
                if ran is None:
                    self._unstarted.append(job.seq)
                    continue
                ended, stopped = ran
                self._report(ended)
                why = self._leaving(stopped, ended.strays)
                if why:
                    return self._leave(why)
                if time.monotonic() - self._looked_at >= REPORT_LINGER_SECONDS:
                    self._looked_at = time.monotonic()
                    self._flush()
                    more = self.channel.receive(wait=False)
                    if more is None:
                        return 0
                    self._take(more)

    def _too_late(self, job: BodyJob) -> bool:
        """Whether ``job``'s body would start past its claim's lease, or past this slot's
        watchdog deadline.

        Past the deadline (its worker could not renew a lease of this child's
        jobs: paused, cut off), the zygote stops whatever body runs here at its
        next look: a body started now would spend a counted run on a start and
        a kill, and could begin a side effect its job no longer holds.
        """
        now = time.monotonic()
        deadline = self.slot.deadline
        return now >= job.lease_ends or 0 < deadline <= now

    def _take(self, messages: list[Any]) -> None:
        for message in messages:
            kind = message[0]
            if kind == RUN:
                self.queue.extend(body_jobs(message[1]))
            elif kind == REVOKE:
                self.revoked.update(message[1])
            elif kind == STOP:
                self.stopping = True

    def _report(self, ended: Ended) -> None:
        self._reports.append(ended)
        if (
            ended.outcome is outcomes.DONE
            and not ended.stale_writes
            and not ended.strays
            and self._kept < KEPT_RING
        ):
            self.slots.keep_done(self.index, ended.seq, ended.seconds)
            self._kept += 1
        else:
            self._unkept = True

    def _flush(self) -> None:
        if self._reports:
            self.channel.send(ended_message(self._reports))
            self._reports = []
            self._kept = 0
            self._unkept = False
        if self._unstarted:
            self.channel.send((UNSTARTED, self._unstarted))
            self._unstarted = []

    def _leaving(self, stopped: bool, strays: int) -> str | None:
        """Why this child should leave now (None: it goes on)."""
        self.ran += 1
        if stopped:
            return "a body it ran was stopped"
        if strays:
            return f"a body left {strays} thread(s) or program(s) running, which end with the process"
        if self.config.max_jobs is not None and self.ran >= self.config.max_jobs:
            return f"it ran {self.ran} jobs (--max-jobs-per-child)"
        if self.config.max_memory is not None:
            now = time.monotonic()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, one system call
            if now - self._memory_checked >= MEMORY_CHECK_SECONDS or peak - self._peak_checked >= 1024:
                # Read exactly at most every MEMORY_CHECK_SECONDS, and after any body that
                # took the process's resident memory to a new high by 1 MiB or more:
                # quick bodies that each keep memory are not let run past the limit.
                self._memory_checked, self._peak_checked = now, peak
                used = own_memory()
                if used is not None and used > self.config.max_memory:
                    return (
                        f"its memory reached {used / 2**20:.0f} MiB "
                        f"(--max-memory-per-child {self.config.max_memory / 2**20:.0f})"
                    )
        return None

    def _leave(self, why: str) -> int:
        self._unstarted.extend(job.seq for job in self.queue)
        self.queue.clear()
        self._flush()
        with contextlib.suppress(OSError):
            self.channel.send((LEAVING, why))
        return 0

    # -- one body ------------------------------------------------------------------

    def _run_one(self, job: BodyJob) -> tuple[Ended, bool] | None:
        """Run one body: how it ended and whether it was stopped (None: revoked, not started)."""
        if self._waited:
            self._waited = False
            _close_ended_connections(self._databases)
        try:
            ready = body.prepare(
                job,
                job.args,
                job.kwargs,
                worker_id=self.config.worker_id,
                lease_seconds=job.lease_seconds,
                places=job.places,
                slot=SlotView(self.slots, self.index, job.seq),
            )
        except ValueError as exc:
            return Ended(job.seq, outcomes.refusal(str(exc)), 0.0, started=False), False
        ctx, facts = ready.ctx, ready.facts
        # running before started: a reader that sees ``started`` at this job and
        # ``running`` no longer at it knows the body ended (``JobAssignment._work_left``).
        before = self.slot.started
        self.slot.started_at = time.monotonic()
        self.slot.running = job.seq
        self.slot.started = job.seq
        if job.seq <= self.slot.revoke_upto:
            # Revoked in the slot (the way a revoke reaches a child busy with a long body),
            # read only after ``started`` was written: the worker, which reads ``started``
            # ``REVOKE_SETTLE_SECONDS`` after it revoked, may have given the job to another
            # child already. It does not start here.
            self.slot.running = 0
            self.slot.started = before
            return None
        self._running_seq = job.seq
        self._in_body = True
        try:
            ran = body.run(
                ready.task, ctx, facts, ready.args, ready.kwargs, _trace_context(job.trace_context)
            )
        finally:
            if os.getpid() != self.pid:
                # A copy the body forked and did not end (no ``os._exit``) has returned
                # here: it must not touch the slot nor run this child's next bodies.
                os._exit(0)
            self._in_body = False
            self.slot.running = 0
        lost = str(ran.raised) if isinstance(ran.raised, LeaseLost) and ran.outcome is None else None
        stopped = ran.stopped or bool(flags_of(self.slot, job.seq) & _STOP_FLAGS)
        strays = self._strays()
        if ran.raised is not None:
            # A failed body may have given up on something it started: what still runs
            # of it would go on beside the job's retry, and what it set for its own
            # process (an alarm it did not cancel) would reach the next body.
            _restore_signals(self._signals, self._mask)
            if ran.seconds >= _PROGRAMS_LOOK_SECONDS:
                strays += self._programs_left() + max(0, _native_threads() - self._native)
        outcome = ran.outcome
        left_open = _roll_back_open_transactions(self._databases)
        _reset_sessions(self._databases)
        if left_open and outcome is not None:
            # Its writes were rolled back: a success would claim work that is not there.
            left_error = RuntimeError(
                f"the body left a transaction open on database {', '.join(left_open)} "
                "(autocommit turned off, or an atomic block not exited): it was rolled back"
            )
            outcome = outcomes.failure(facts, left_error, cancel_requested=ctx.cancel_requested)
        return Ended(job.seq, outcome, ran.seconds, True, lost, ctx.stale_writes, strays), stopped

    def _strays(self) -> int:
        """Threads a body started and left running (a call it gave up waiting for, say).

        The thread of Django's async ORM calls (asgiref's executor) does not count:
        it waits, idle, for the next body's calls.
        """
        if threading.active_count() <= len(self._threads):
            return 0
        allowed = set(self._threads)
        executor = getattr(SyncToAsync, "single_thread_executor", None)
        allowed.update(t.ident for t in getattr(executor, "_threads", ()))
        return sum(1 for t in threading.enumerate() if t.ident not in allowed)

    def _programs_left(self) -> int:
        """Processes a failed body started and left running (a program it gave up waiting
        for, then raised): they would go on beside the job's retry. Read from /proc;
        zombies (ended, not yet reaped) do not count."""
        try:
            with open(f"/proc/self/task/{self.pid}/children", "rb") as f:
                pids = f.read().split()
        except OSError:
            return 0
        left = 0
        for pid in pids:
            try:
                with open(b"/proc/%s/stat" % pid, "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            left += stat[stat.rindex(b")") + 2 :][:1] != b"Z"
        return left

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR1: stop the running body if the worker raised a stop flag for it."""
        if not self._in_body:
            return
        flags = self.slots.flags(self.index, self._running_seq)
        if flags & _STOP_FLAGS:
            raise BodyStopped(rules.stop_reason(flags))


def _roll_back_open_transactions(databases: list[BaseDatabaseWrapper]) -> list[str]:
    """Roll back and close every Django connection a body left inside a transaction; their aliases.

    A child keeps its connections between bodies: one left with autocommit
    off (or inside an atomic block) would turn the next body's writes and
    its fenced side effects into savepoints that never commit, while they
    hold the job's row.
    """
    left: list[str] = []
    for conn in databases:
        if conn.connection is None or (conn.get_autocommit() and not conn.in_atomic_block):
            continue
        left.append(conn.alias)
        with contextlib.suppress(Exception):
            conn.connection.rollback()
        conn.in_atomic_block = False
        conn.savepoint_ids = []
        conn.savepoint_state = 0
        conn.needs_rollback = False
        with contextlib.suppress(Exception):
            conn.close()
    return left


#: What a body may leave in its database session for the next body of its child:
#: settings (``SET statement_timeout``, a read-only default, a role, a search path)
#: and session advisory locks. One round trip, after bodies whose connection is open.
_RESET_SESSION = "RESET ALL; SELECT pg_advisory_unlock_all()"


def _reset_sessions(databases: list[BaseDatabaseWrapper]) -> None:
    """Undo the session settings and advisory locks a body left on a PostgreSQL connection.

    The next body's fenced side effect runs on the same connection: a
    ``statement_timeout`` or a read-only default left by another job must not
    fail it. Django's own settings of the connection (its time zone, its
    ``assume_role``) are made again, as at connect. A connection this fails on
    is closed: the next body opens a fresh one.
    """
    for conn in databases:
        if conn.connection is None or conn.vendor != "postgresql":
            continue
        try:
            conn.connection.execute(_RESET_SESSION)
            conn._configure_connection(conn.connection)  # type: ignore[attr-defined]
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()


def _native_threads() -> int:
    """This process's threads that Python's ``threading`` does not list (started by C
    code, or by ``_thread``): from /proc, 0 if it cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[17]) - threading.active_count()
    except (OSError, ValueError, IndexError):
        return 0


def _restore_signals(handlers: dict[int, Any], mask: set[int | signal.Signals]) -> None:
    """Cancel the alarm and interval timers a body left, and put back the signal mask
    and the handlers of ``_RESTORED_SIGNALS`` as they were before any body ran."""
    for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        signal.setitimer(timer, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(signum, handler)


def _close_ended_connections(databases: list[BaseDatabaseWrapper]) -> None:
    """Close each connection the server ended while the child waited for jobs.

    An idle connection has nothing to read unless the server ended it
    (``idle_session_timeout``, a restart, ``pg_terminate_backend``): its
    socket is then readable, and the next body would fail on its first query.
    One ``select`` of the open connections' sockets, no round trip.
    """
    open_ = [conn for conn in databases if conn.connection is not None]
    if not open_:
        return
    ended = []
    by_fd = {}
    for conn in open_:
        try:
            by_fd[conn.connection.fileno()] = conn
        except Exception:  # psycopg knows it is closed
            ended.append(conn)
    with contextlib.suppress(OSError, ValueError):
        ended += [by_fd[fd] for fd in select.select(list(by_fd), [], [], 0)[0]]
    for conn in ended:
        with contextlib.suppress(Exception):
            conn.close()


def _trace_context(text: str | None) -> dict[str, str] | None:
    """The stored trace context, or None if there is none (or it cannot be read: no span parent then)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def own_memory() -> int | None:
    """This process's own memory in bytes (private pages: not those it shares with the zygote)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            private = 0
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    private += int(line.split()[1]) * 1024
            return private
    except (OSError, ValueError):
        return None
