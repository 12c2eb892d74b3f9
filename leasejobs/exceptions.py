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


class WaitTimeout(Exception):
    """Raised by ``ctx.wait_for`` when its ``timeout`` passed before the event came.

    The timeout is recorded as the wait's outcome, so every later attempt of
    the job gets it again at once: catch it to take another path, or name it
    in the task's ``RetryPolicy(fail_on=...)`` to fail the job without retries.
    """


class Suspended(BaseException):
    """Raised by ``ctx.sleep`` and ``ctx.wait_for`` to end the attempt now; never catch it.

    The sleep or wait is already recorded, fenced; the worker writes the job
    back to ``queued``, due when the sleep ends or the event comes, and gives
    back the run (a suspended attempt does not count toward
    ``max_attempts``). A ``BaseException``, like ``BodyStopped``, so that
    ``except Exception`` in the body does not swallow it.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class ProcessDied(Exception):
    """The process that ran a job's body died before it could report how the body ended.

    Never raised in a body: the worker records it as that attempt's failure
    (a signal, the kernel's out-of-memory killer, ``os._exit``, a crash in C
    code), so the job is retried or failed by its ``RetryPolicy`` like any
    failure, and a policy may name it in ``retry_on`` or ``fail_on``.
    """

    def __init__(self, how: str, after_body: bool = False) -> None:
        when = (
            "after its body returned, before it reported the outcome" if after_body else "while its body ran"
        )
        super().__init__(f"the job's process {how} {when}")
        self.how = how
        self.after_body = after_body


class BodyStopped(BaseException):
    """Raised inside a body the worker is stopping: past its timeout, its lease lost, the worker stopping.

    A ``BaseException``, like ``KeyboardInterrupt``, so that ``except
    Exception`` in the body does not swallow it while ``finally`` blocks and
    ``with`` statements still run. The worker has already decided the
    attempt's outcome; whatever the body does next is not written, and the
    process is killed if the body has not ended after a grace period.
    """
