"""Shutdown as one object with explicit phases.

RUNNING: claiming and running. DRAINING (first SIGTERM/SIGINT): no new
claims, buffered jobs are given back at once, running bodies get
``--grace`` seconds. RELEASING (grace over, or a second signal): every
lease still held is given back, claimable at once. STOPPED: connections
closed, the process may exit.
"""

import enum
import threading
import time


class ShutdownPhase(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"
    RELEASING = "releasing"
    STOPPED = "stopped"


class Shutdown:
    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        self.phase = ShutdownPhase.RUNNING
        self.grace_deadline: float | None = None
        #: Set by the first stop request: no new claims, no new starts.
        self.requested = threading.Event()

    def request(self) -> bool:
        """A stop signal; True for the first (grace starts), False for a later one (grace ends now)."""
        if self.phase is ShutdownPhase.RUNNING:
            self.phase = ShutdownPhase.DRAINING
            self.grace_deadline = time.monotonic() + self.grace_seconds
            self.requested.set()
            return True
        self.grace_deadline = time.monotonic()
        return False

    def grace_over(self) -> bool:
        return self.grace_deadline is not None and time.monotonic() >= self.grace_deadline

    def releasing(self) -> None:
        self.phase = ShutdownPhase.RELEASING

    def stopped(self) -> None:
        self.phase = ShutdownPhase.STOPPED
