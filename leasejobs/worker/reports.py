"""What the children and the zygote report, and what each report does to a held job.

What each event does to a held job (``HeldJobs`` phases):

- a body ended: its outcome is SETTLED and goes to the finisher; a body
  that let ``LeaseLost`` escape is dropped (nothing to write); a STOPPING
  job's body ending lets the worker's own outcome be written, or its lease
  be given back;
- a job a child did not start (revoked, stopped, its lease ran out while it
  waited): given to another child, since its run is counted and its lease
  held; when the worker is stopping, given back with its run refunded; with
  a cancel pending, ended as cancelled;
- a child died: a job whose body it kept as done in its slot is done (the
  report had not been sent); each other job it had started and not
  reported ended with the death (``ProcessDied``, naming the signal),
  unless the zygote killed it for outliving its lease (then the lease is
  lost: nothing to write); the jobs it had not started go to another child.

An attempt is thus reported ended only once its body has stopped, and a
place under a limit, freed by the finish, only once its body is dead.

The pool thread calls these as it reads the children's sockets, the
zygote's and the children's pidfds; each runs with the pool's lock held.
"""

import contextlib
import os
import selectors
import signal
import time

from leasejobs.observability import observe
from leasejobs.worker import outcomes, rules
from leasejobs.worker.childstate import ChildState, pidfd_of
from leasejobs.worker.held import HeldJob, Phase, facts_of
from leasejobs.worker.messages import ENDED, LEAVING, UNSTARTED, Ended, endeds
from leasejobs.worker.slots import REVOKE_SETTLE_SECONDS
from leasejobs.worker.stopping import BodyStopping
from leasejobs.worker.zygote import EXITED, OUTLIVED, SPAWNED

#: How long a body runs before the pool thread reads what its child kept unsent (a
#: child sends it between bodies, at least once a millisecond).
KEPT_LOOK_SECONDS = 0.005


class ChildReports(BodyStopping):
    """The children's and the zygote's reports, applied to the held jobs (see the module docstring)."""

    def _hear_zygote(self) -> None:
        messages = self._forks().receive()
        if messages is None:
            if self._closed:
                return
            raise RuntimeError(
                f"the zygote (pid {self._forks().pid}) that forks this worker's children is gone"
            )
        with self.lock:
            for message in messages:
                kind, index = message[0], message[1]
                child = self._children[index]
                if kind == SPAWNED:
                    child.pid = message[2]
                    child.pidfd = pidfd_of(child.pid)
                    if child.pidfd is not None:
                        self._selector.register(child.pidfd, selectors.EVENT_READ, ("death", child))
                    self.children_started += 1
                elif kind == EXITED and message[2] == child.pid:
                    child.exit_code = message[3]
                elif kind == OUTLIVED and message[2] == child.pid:
                    child.outlived_seq = child.outlived_seq or message[3]
        self._work_wanted()

    def _hear_child(self, child: ChildState, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            with self.lock:  # other threads send (a STOP, a REVOKE) under the lock too
                child.channel.flush()
        if not mask & selectors.EVENT_READ:
            return
        messages = child.channel.receive()
        wanted = False
        with self.lock:
            for message in messages or []:
                kind = message[0]
                if kind == ENDED:
                    for ended in endeds(message[1]):
                        job = child.outstanding.pop(ended.seq, None)
                        child.stops.pop(ended.seq, None)
                        if job is not None:
                            self._ended(job, ended)
                    wanted = True
                elif kind == UNSTARTED:
                    for seq in message[1]:
                        job = child.outstanding.pop(seq, None)
                        child.stops.pop(seq, None)
                        if job is not None:
                            self._unstarted(job)
                    wanted = True
                elif kind == LEAVING:
                    child.leaving = message[1]
            if child.channel.eof and not child.closed_at:
                child.closed_at = time.monotonic()
                self._selector.unregister(child.channel.sock)
                if not child.dead_at and not child.leaving and not child.stopping:
                    # Its end of the socket is closed while it lives (a body closed every
                    # descriptor it found): the worker can no longer hear how its bodies
                    # end, so it ends them all, once the process is dead.
                    self._kill(child)
        if wanted:
            self._work_wanted()

    def _hear_kept(self, now: float) -> None:
        """Bodies a live child kept as done in its slot and has not reported (it sends them with
        its next report, which a long body after them delays): ended now; lock held.

        Only a child whose body has run for ``KEPT_LOOK_SECONDS`` is read: any
        other sends what it kept within a millisecond. Every job in the ring
        has ended done, whenever it is read. A count read with stale entries
        beside it (stores seen out of order, on a CPU that allows it) is read
        once more at the next look.
        """
        heard = False
        for child in self._children:
            if not child.pid or not child.outstanding:
                continue
            running = self.slots.running(child.index)
            if running is None or now - running.started_at < KEPT_LOOK_SECONDS:
                continue
            changed = self.slots[child.index].kept_count != child.kept_heard
            if not changed and not child.kept_recheck:
                continue
            since = child.kept_from if child.kept_recheck else child.kept_heard
            child.kept_heard, kept = self.slots.kept(child.index, since)
            child.kept_from, child.kept_recheck = since, changed
            for seq, seconds in kept.items():
                job = child.outstanding.pop(seq, None)
                if job is not None:
                    child.stops.pop(seq, None)
                    self._ended(job, Ended(seq, outcomes.DONE, seconds, True))
                    heard = True
        if heard:
            self._work_wanted()

    def _died_now(self, child: ChildState) -> None:
        """Its pidfd is readable: the process is dead (its socket may stay open in a helper it forked)."""
        with self.lock:
            if not child.dead_at:
                child.dead_at = time.monotonic()
            if child.pidfd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(child.pidfd)

    def _ended(self, job: HeldJob, ended: Ended) -> None:
        """A body reported its end; lock held."""
        self._unhold(job)
        if ended.started:
            previous = self.durations.get(job.task_name)
            self.durations[job.task_name] = rules.mean_duration(previous, ended.seconds)
        observe.body_reported(job.queue, job.task_name, job.waited, ended.seconds, ended.stale_writes)
        if job.phase is Phase.ASSIGNED:
            if ended.outcome is None:
                if self.held.drop(job):
                    self.events.lease_lost(job, f"the body stopped: {ended.lost or 'it was stopped'}")
            elif ended.strays:
                # What the body left running ends with its process: the attempt ends then.
                why = (
                    f"its body returned but left {ended.strays} thread(s) or program(s) running; "
                    "its process ends first"
                )
                if self.held.stop(job, ended.outcome, why):
                    job.started = True
                    self._children[job.child].ending_with_it.append(job)
            elif self.held.settle(job, ended.outcome, started=ended.started):
                self._finish(job)
        elif job.phase is Phase.STOPPING:
            self._stopped(job, started=True, seconds=ended.seconds)

    def _stopped(self, job: HeldJob, *, started: bool, seconds: float | None) -> None:
        """A STOPPING job's body is known to have ended; lock held."""
        give_back = job.outcome is None
        if self.held.stopped(job, started=started):
            self.events.body_stopped(job, job.stop_reason, seconds)
            if give_back:
                self._given_back.append(job)
            else:
                self._finish(job)

    def _settle_revokes(self, now: float) -> None:
        """``REVOKE_SETTLE_SECONDS`` after a revoke (``BodyStopping._revoke``): the jobs a child
        had not started by then never start there, and are dealt with now; the others are
        its to report; lock held."""
        taken = False
        for child in self._children:
            if not child.revoking or now < child.revoked_at + REVOKE_SETTLE_SECONDS:
                continue
            started = self.slots[child.index].started
            upto, child.revoking = child.revoking, 0
            for seq in [seq for seq in child.outstanding if started < seq <= upto]:
                child.stops.pop(seq, None)
                self._unstarted(child.outstanding.pop(seq))
                taken = True
        if taken:
            self._work_wanted()

    def _unhold(self, job: HeldJob) -> None:
        """The job leaves its child's hands, its bytes with it; lock held."""
        self.bytes_held -= job.bytes

    def _unstarted(self, job: HeldJob) -> None:
        """A child will not start this job; lock held."""
        self._unhold(job)
        if job.phase is Phase.STOPPING:
            self._stopped(job, started=False, seconds=None)
        elif job.phase is not Phase.ASSIGNED:
            return
        elif job.cancel_requested:
            if self.held.settle(job, outcomes.cancelled_before_start(), started=False):
                self._finish(job)
        elif time.monotonic() >= job.lease_ends - rules.watchdog_margin(job.lease_seconds):
            # Its lease ran out while it waited (the worker was paused), or is as
            # good as out (inside the watchdog's margin, where no child starts it):
            # another worker may hold it now, and a place under a limit.
            if self.held.drop(job):
                self.events.lease_lost(job, "its lease ran out before its body started")
        elif self._stopping or self._all_busy(job):
            # No child takes it now (each runs a body past its estimate): back to the
            # queue, its run refunded, rather than held here until one has room.
            if self.held.give_back(job):
                self._given_back.append(job)
        else:
            self._give(job)

    def _died(self, child: ChildState) -> None:
        """End the jobs of a child that is gone; lock held."""
        code = child.exit_code
        child.buried = True
        # What its bodies left in its process group (a helper a body forked, a program it
        # gave up on) dies with it, before any of its jobs ends and frees a place.
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(child.pid, signal.SIGKILL)
        if code == 0 and child.leaving:
            self.events.child_left(child.index, child.pid, child.leaving)
        elif code != 0 or child.outstanding:
            self.children_died += 1
            observe.child_died()
            how = outcomes.describe_status(code)
            if child.outlived_seq:
                how = "was killed by the zygote: its body ran past its lease, which the worker did not renew"
            self.events.child_died(child.index, child.pid, how, len(child.outstanding), not self._stopping)
        for job in child.ending_with_it:
            self._stopped(job, started=True, seconds=None)
        child.ending_with_it.clear()
        started = self.slots[child.index].started
        _, kept = self.slots.kept(child.index)
        for seq, job in list(child.outstanding.items()):
            del child.outstanding[seq]
            if seq in kept:
                self._ended(job, Ended(seq, outcomes.DONE, kept[seq], True))
                continue
            if seq > started:
                self._unstarted(job)
                continue
            self._unhold(job)
            if job.phase is Phase.STOPPING:
                self._stopped(job, started=True, seconds=None)
            elif job.phase is not Phase.ASSIGNED:
                continue
            elif seq == child.outlived_seq:
                if self.held.drop(job):
                    self.events.lease_lost(
                        job, "its lease ran out while the worker could not renew it: its body was killed"
                    )
            else:
                running = seq == started
                outcome = outcomes.died(
                    facts_of(job, self.events.worker_id),
                    code,
                    after_body=not running,
                    cancel_requested=job.cancel_requested,
                )
                if self.held.settle(job, outcome, started=True):
                    self._finish(job)
        if child.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(child.pidfd)
            os.close(child.pidfd)
            child.pidfd = None
        if not child.closed_at:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(child.channel.sock)
        child.channel.close()
        child.pid = 0
