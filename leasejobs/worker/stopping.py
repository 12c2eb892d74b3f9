"""Stopping bodies: timeouts, lost leases, cancels, and the kill after a stop's grace.

A body is stopped in steps: its flag is raised in its shared slot, it is
interrupted (SIGUSR1 raises ``BodyStopped`` in it) once it runs, and its
child is killed, with the process group its bodies left, when the grace is
over; a job its child has not started is revoked instead. The pool thread
looks at the running bodies every 10 to 50 ms (``_look_at_bodies``): a
timeout, a body that outlived its lease (the zygote watches too), a body
running far longer than estimated (the jobs queued behind it go to other
children). Signals go through the child's pidfd where there is one, so a
process that took a reaped child's pid is never signalled.
"""

import contextlib
import os
import signal
import time

from leasejobs.observability import observe
from leasejobs.worker import outcomes, rules
from leasejobs.worker.assignment import JobAssignment
from leasejobs.worker.childstate import BodyStop, ChildState
from leasejobs.worker.held import HeldJob, Phase, facts_of
from leasejobs.worker.messages import REVOKE
from leasejobs.worker.slots import CANCEL_REQUESTED, TIMED_OUT


class BodyStopping(JobAssignment):
    """Stop, interrupt and kill the bodies the worker must end (see the module docstring)."""

    def stop_body(self, job: HeldJob, flag: int, grace: float) -> None:
        """Stop this job's body: raise ``flag`` for it, interrupt it, kill its child after ``grace``.

        A job its child has not started is revoked instead (reported unstarted).
        """
        with self.lock:
            child = self._child_of(job)
            if child is None:
                return
            self.slots.raise_flag(child.index, job.seq, flag)
            stop = child.stops.get(job.seq)
            if stop is None:
                child.stops[job.seq] = BodyStop(flag, grace)
            elif grace < stop.grace:
                # A stop under way (a timeout's grace) that a lost lease overtakes: the
                # stale body must not run beside the new holder for the rest of it.
                stop.flag |= flag
                stop.grace = grace
                if stop.interrupted_at:
                    stop.kill_at = min(stop.kill_at, time.monotonic() + grace)
            child.doomed = True  # a child whose body is stopped leaves
            self._next_body_look = 0.0  # interrupt it now, not at the next look
        self._wake()

    def cancel(self, job: HeldJob) -> None:
        """A cancel was requested: the body sees ``ctx.cancel_requested``; an unstarted job never starts."""
        with self.lock:
            child = self._child_of(job)
            if child is None:
                return
            self.slots.raise_flag(child.index, job.seq, CANCEL_REQUESTED)
            child.channel.send((REVOKE, [job.seq]))

    def _child_of(self, job: HeldJob) -> ChildState | None:
        if 0 <= job.child < len(self._children):
            child = self._children[job.child]
            if child.outstanding.get(job.seq) is job:
                return child
        return None

    def _signal(self, child: ChildState, signum: int) -> None:
        """Signal the child itself, never a process that took its pid after it was reaped; lock held."""
        if child.dead_at or not child.pid:
            return
        if child.pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(child.pidfd, signum)
        else:
            self._forks().kill(child.index, child.pid, signum)

    def _kill(self, child: ChildState) -> None:
        """SIGKILL the child and every process its bodies left in its process group; lock held.

        The group outlives its leader as long as a member lives, so its id
        cannot be taken by another process meanwhile.
        """
        self._signal(child, signal.SIGKILL)
        if child.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(child.pid, signal.SIGKILL)

    def _look_at_bodies(self, now: float) -> None:
        """Timeouts, and the stops in progress: interrupt, then kill after the grace; lock held."""
        busy = 0
        for child in self._children:
            if not child.pid or child.closed_at or child.dead_at:
                continue
            if self.watch and not child.outlived_seq:
                # The zygote watches too: it acts while this worker is paused, this
                # worker while the zygote is.
                seq = self.slots.outlived(child.index, now)
                if seq:
                    child.outlived_seq = seq
                    self._kill(child)
                    continue
            running = self.slots.running(child.index)
            busy += running is not None
            if running is not None:
                self._rebalance(child, running.seq, now - running.started_at, now)
                job = child.outstanding.get(running.seq)
                if job is not None and job.phase is Phase.ASSIGNED and job.task is not None:
                    seconds = job.task.timeout_seconds
                    deadline = rules.timeout_deadline(running.started_at, seconds)
                    if deadline is not None and now >= deadline:
                        self._time_out(child, job, seconds)
            for seq, stop in child.stops.items():
                if running is not None and running.seq == seq:
                    if not stop.interrupted_at:
                        # Raised again: one raised while the job waited behind another
                        # body was not (``SlotTable.raise_flag``).
                        self.slots.raise_flag(child.index, seq, stop.flag)
                        stop.interrupted_at, stop.kill_at = now, now + stop.grace
                        self._signal(child, signal.SIGUSR1)
                    elif now >= stop.kill_at:
                        self._kill(child)
                elif not stop.revoked and seq > self.slots[child.index].started:
                    stop.revoked = True
                    child.channel.send((REVOKE, [seq]))
        observe.bodies_running(busy)

    def _rebalance(self, child: ChildState, running: int, for_seconds: float, now: float) -> None:
        """A body running far longer than estimated keeps the jobs waiting behind it: they
        are revoked in its slot, and go to a child with room, or back to the queue
        (``_revoke``); lock held.

        40 ms past its estimate when another child is idle; 0.25 s past it when
        none is (``rules.SLOWED_TASK_SECONDS``), since those jobs go back to the
        queue: a task that slowed down (a service that answers late) must not
        keep jobs claimed before a pause, or before a limit set at run time,
        starting for seconds after it, while a body merely descheduled on a
        busy machine should not send its neighbours back and forth."""
        job = child.outstanding.get(running)
        estimate = job.estimate if job is not None else 0.0
        idle = any(c.accepting and not c.outstanding for c in self._children)
        past = 2 * rules.CHILD_QUEUE_SECONDS if idle else rules.SLOWED_TASK_SECONDS
        if child.rebalanced_after >= running or for_seconds < estimate + past:
            return
        waiting = [seq for seq in child.outstanding if seq > running]
        if not waiting:
            return
        child.rebalanced_after = running
        self._revoke(child, max(waiting), now)

    def _revoke(self, child: ChildState, upto: int, now: float) -> None:
        """Take back the jobs of ``child`` up to ``upto`` that it has not started, whatever body
        it runs meanwhile (``SlotTable.revoke``); ``ChildReports._settle_revokes`` deals with
        them; lock held."""
        self.slots.revoke(child.index, upto)
        child.revoking = max(child.revoking, upto)
        child.revoked_at = now

    def _time_out(self, child: ChildState, job: HeldJob, seconds: float | None) -> None:
        """Past its timeout: decide the outcome, stop the body, write it once it stopped; lock held."""
        facts = facts_of(job, self.events.worker_id)
        outcome = outcomes.timeout(facts, seconds, cancel_requested=job.cancel_requested)
        if self.held.stop(job, outcome, f"it ran past its timeout of {seconds:g} s"):
            self.events.timeout(job, outcome.last_error or "")
            self.slots.raise_flag(child.index, job.seq, TIMED_OUT)
            child.stops.setdefault(job.seq, BodyStop(TIMED_OUT, self.stop_grace))
            child.doomed = True
