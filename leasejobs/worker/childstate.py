"""What the worker knows of each child process: the pool's bookkeeping.

A child's record (the jobs it holds and has yet to be sent, the bodies being
stopped in it, its pidfd, whether its socket closed, whether it is dead and
how it exited) is kept apart from the decisions the pool makes on it, so that
the record can be read whole and each decision module reads the same one.
"""

import os
from dataclasses import dataclass, field
from typing import Any

from leasejobs.worker.channel import Channel
from leasejobs.worker.held import HeldJob


@dataclass(eq=False)
class BodyStop:
    """A body the worker is stopping."""

    flag: int
    grace: float
    #: When SIGUSR1 was sent (0: not yet: the body has not started), and when to kill.
    interrupted_at: float = 0.0
    kill_at: float = 0.0
    revoked: bool = False


@dataclass(eq=False)
class ChildState:
    """One child process as the worker knows it (its jobs, its stops, its life)."""

    index: int
    channel: Channel
    pid: int = 0
    #: Jobs given to it and not yet reported, by assignment number, in order.
    outstanding: dict[int, HeldJob] = field(default_factory=dict)
    next_seq: int = 0
    #: Jobs assigned but not yet sent, each a ``BodyJob``'s fields (``assignment._hand``).
    to_send: list[tuple[Any, ...]] = field(default_factory=list)
    stops: dict[int, BodyStop] = field(default_factory=dict)
    #: Jobs whose body ended but left threads running: they end with the process.
    ending_with_it: list[HeldJob] = field(default_factory=list)
    #: The assignment number of the body after which its waiting jobs were handed
    #: to other children (a body that ran much longer than estimated).
    rebalanced_after: int = 0
    #: Jobs up to this assignment number are revoked in its slot, since ``revoked_at``,
    #: and not yet settled (``BodyStopping._revoked``; 0: none).
    revoking: int = 0
    revoked_at: float = 0.0
    #: The slot's count of kept bodies when the pool thread last read them
    #: (``ChildReports._hear_kept``), where that read began, and whether to read
    #: from there once more.
    kept_heard: int = 0
    kept_from: int = 0
    kept_recheck: bool = False
    #: Told to stop starting bodies (the worker is stopping), or it will leave
    #: once the body being stopped in it is gone (``doomed``).
    stopping: bool = False
    doomed: bool = False
    #: Its socket is in the selector for writing too (a message waits to be sent).
    writing: bool = False
    #: A descriptor that becomes readable when the process ends (``os.pidfd_open``):
    #: how the worker knows it is dead, whatever holds its socket open.
    pidfd: int | None = None
    #: Its socket is closed; it is dead (its pidfd readable); how it exited, once
    #: the zygote says; the job it was killed for running past its lease; why it
    #: left on its own.
    closed_at: float = 0.0
    dead_at: float = 0.0
    exit_code: int | None = None
    outlived_seq: int = 0
    leaving: str = ""
    #: Its jobs are dealt with; it is gone for good (the pool is stopping) or replaced.
    buried: bool = False

    @property
    def accepting(self) -> bool:
        return (
            self.pid != 0
            and not self.stopping
            and not self.doomed
            and not self.closed_at
            and not self.dead_at
            and not self.leaving
        )

    @property
    def gone(self) -> bool:
        """Dead, as far as the worker knows: its pidfd said so (without one: its socket and the zygote)."""
        if self.pidfd is not None:
            return bool(self.dead_at)
        return bool(self.closed_at) and (self.exit_code is not None or bool(self.dead_at))


def pidfd_of(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3+), None where there is none (then the zygote's word counts)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
