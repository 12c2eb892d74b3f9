"""Exceptions a task body may see or raise."""

import math


class LeaseLost(Exception):
    """This attempt no longer holds its job: another claim moved the fencing
    token on, or the job left the running state (timeout, cancel, release).

    Raised by ``ctx.side_effect`` when the fence check fails; nothing was
    recorded. A body that lets it escape writes nothing: the worker drops the
    attempt, because the attempt that now holds the job owns its outcome.
    """


class Snooze(Exception):
    """Raise from a body to run the job again ``seconds`` from now.

    Not a failure: nothing is added to the job's errors, and the attempt does
    not count toward ``max_attempts``. A job may snooze
    ``LEASEJOBS["MAX_SNOOZES"]`` times; the snooze after that fails it (a
    body that snoozes forever is a bug worth seeing). Written like every
    finish: only while this attempt still holds the job.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ValueError("Snooze(seconds) needs a finite number of seconds.")
        if seconds < 0:
            raise ValueError("Snooze(seconds) cannot be negative.")
        super().__init__(seconds)
        self.seconds = float(seconds)

    def __str__(self) -> str:
        return f"snoozed for {self.seconds:g} s"


class Discard(Exception):
    """Raise from a body to end the job ``failed`` now with ``reason``: no retries.

    For failures that no retry can fix (the order was deleted, the input is
    invalid). Fenced like every finish: a stale attempt's discard changes
    nothing.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = str(reason)
