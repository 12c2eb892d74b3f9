"""The worker's children: given jobs, heard from, stopped, replaced.

One thread (``run``) serves every child: it sends each the jobs the claimer
assigned to it, reads how their bodies ended, learns from the zygote how
children died, stops the bodies the worker must stop (a timeout, a lost
lease, the end of a stop's grace) and forks a replacement for every child
that is gone. It never touches the database and never waits on a child: a
child that is paused or hung only stops hearing from it.

The pool is built in layers, one module each, every layer importing only the
one below it: ``childstate`` (what the worker knows of each child),
``assignment`` (which child runs which job), ``stopping`` (timeouts, stops
and kills), ``reports`` (what each report of a child or of the zygote does
to a held job: an attempt is reported ended only once its body has
stopped). This module holds the thread and the children's life cycle, the
one part that spawns and buries them; it exists apart so that the loop can
be read whole.
"""

import logging
import os
import selectors
import time

from leasejobs.worker import outcomes
from leasejobs.worker.channel import Channel
from leasejobs.worker.childstate import ChildState
from leasejobs.worker.held import HeldJob, facts_of
from leasejobs.worker.messages import STOP
from leasejobs.worker.reports import ChildReports

__all__ = [
    "BODY_LOOK_SECONDS",
    "EXIT_STATUS_WAIT_SECONDS",
    "IDLE_SECONDS",
    "TIMEOUT_LOOK_SECONDS",
    "Pool",
    "facts_of",
]

logger = logging.getLogger("leasejobs.worker")

#: How long the worker waits for the zygote's word on how a child died
#: before it writes the death without it. The word comes at once unless the
#: machine is starved: CI's chaos run under kills and pauses once took over
#: 2 s, and the crash was written as "exit status not known".
EXIT_STATUS_WAIT_SECONDS = 5.0

#: The longest the pool thread sleeps with nothing to do.
IDLE_SECONDS = 0.5
#: How often it looks at running bodies with a timeout.
TIMEOUT_LOOK_SECONDS = 0.05
#: The least time between two looks at the bodies (``_look_at_bodies``, a walk of
#: every child's slot), however many reports wake the thread: with 64 children of
#: 50 ms jobs a look after each report cost more of the worker's CPU than the
#: claims. A stop asked for is looked at at once (``stop_body``).
BODY_LOOK_SECONDS = 0.01


class Pool(ChildReports):
    """The worker's side of its children (see the module docstring)."""

    # -- life cycle --------------------------------------------------------------

    def start(self, count: int) -> None:
        """Have ``count`` children: the pool thread asks the zygote for them as it starts."""
        self._selector.register(self._forks().ctl, selectors.EVENT_READ, "zygote")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._count = count

    def _spawn(self, index: int) -> ChildState:
        self.slots.reset(index)
        child = ChildState(index, Channel(self._forks().spawn(index)))
        self._selector.register(child.channel.sock, selectors.EVENT_READ, child)
        return child

    def run(self) -> None:
        """The pool thread: until ``close`` and every child is gone."""
        with self.lock:
            self._children = [self._spawn(index) for index in range(self._count)]
        while not self._closed or not all(c.buried for c in self._children):
            timeout = self._next_look()
            for key, mask in self._selector.select(timeout):
                if key.data == "zygote":
                    self._hear_zygote()
                elif key.data == "wake":
                    self._drain_wake()
                elif isinstance(key.data, tuple):
                    self._died_now(key.data[1])
                else:
                    self._hear_child(key.data, mask)
            with self.lock:
                self._send_all()
                now = time.monotonic()
                if now >= self._next_body_look:
                    self._next_body_look = now + BODY_LOOK_SECONDS
                    self._hear_kept(now)
                    self._settle_revokes(now)
                    self._look_at_bodies(now)
                self._bury_the_dead(now)
            if self._closed and time.monotonic() > self._close_deadline:
                break

    def stop_starting(self) -> None:
        """No child starts another body; the jobs they hold and have not started are given back."""
        with self.lock:
            self._stopping = True
            while self._backlog:
                job = self._backlog.popleft()
                if self.held.give_back(job):
                    self._given_back.append(job)
            now = time.monotonic()
            for child in self._children:
                if not child.stopping:
                    child.stopping = True
                    child.channel.send((STOP,))
                    if child.outstanding:
                        # A child reads its STOP between bodies: those waiting behind a
                        # long body are taken back now, to be given back at once.
                        self._revoke(child, max(child.outstanding), now)
        self._wake()

    def close(self, timeout: float = 5.0) -> None:
        """Every child leaves (they are told to stop; the zygote kills what remains at its stop)."""
        self.stop_starting()
        with self.lock:
            self._closed = True
            self._close_deadline = time.monotonic() + timeout
        self._wake()

    def holds_nothing(self) -> bool:
        """Nothing is held and nothing waits to be given back, seen at one instant: a job
        leaves the held table and joins those to give back under the pool's lock (``--burst``
        must not end between the two, its job still running in the database)."""
        with self.lock:
            return self.held.empty() and not self._given_back

    def take_given_back(self) -> list[HeldJob]:
        """The jobs to release now (their bodies never started, or were stopped)."""
        with self.lock:
            jobs, self._given_back = self._given_back, []
            return jobs

    # -- the pool thread -------------------------------------------------------------

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _next_look(self) -> float:
        if self.watch:  # bodies are watched for their leases: as often as for timeouts
            return TIMEOUT_LOOK_SECONDS
        with self.lock:
            soon = IDLE_SECONDS
            for child in self._children:
                if child.stops or child.revoking or ((child.closed_at or child.dead_at) and not child.buried):
                    soon = TIMEOUT_LOOK_SECONDS
                elif child.outstanding and (
                    child.kept_recheck or self.slots[child.index].kept_count != child.kept_heard
                ):
                    soon = min(soon, TIMEOUT_LOOK_SECONDS)  # bodies kept as done, perhaps behind a long one
                elif child.outstanding and any(
                    j.task is not None and j.task.timeout_seconds for j in child.outstanding.values()
                ):
                    soon = min(soon, TIMEOUT_LOOK_SECONDS)
            return soon

    def _send_all(self) -> None:
        """Send every child what was assigned to it; lock held."""
        for _ in range(len(self._backlog)):
            job = self._backlog.popleft()
            if job.cancel_requested:
                # Cancelled while it waited for a child: no slot held its flag, so a body
                # started now would not see the cancel. It never starts.
                if self.held.settle(job, outcomes.cancelled_before_start(), started=False):
                    self._finish(job)
                continue
            self._give(job)  # what still does not fit goes back to the end
        for child in self._children:
            if child.to_send and child.pid:
                self._send(child)
            elif child.channel.pending:
                child.channel.flush()
            writing = bool(child.channel.pending)
            # A child whose end closed is out of the selector; one whose events are
            # unchanged is left alone (a modify per child per report was a cost).
            if writing != child.writing and not child.closed_at:
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
                self._selector.modify(child.channel.sock, events, child)
                child.writing = writing

    def _bury_the_dead(self, now: float) -> None:
        """Children whose socket closed: once the zygote says how they ended, end their jobs; lock held."""
        for i, child in enumerate(self._children):
            if child.buried or not (child.closed_at or child.dead_at):
                continue
            if not child.gone:
                if child.pidfd is None and now - child.closed_at >= EXIT_STATUS_WAIT_SECONDS:
                    child.dead_at = now  # no pidfd, no word from the zygote: taken as dead
                continue
            if child.exit_code is None and now - child.dead_at < EXIT_STATUS_WAIT_SECONDS:
                continue  # the zygote's word on how it ended is on its way
            self._died(child)
            if not self._closed and not self._stopping:
                self._children[i] = self._spawn(i)
