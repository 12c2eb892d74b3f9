"""Exceptions a task body may see."""


class LeaseLost(Exception):
    """This attempt no longer holds its job: another claim moved the fencing
    token on, or the job left the running state (timeout, cancel, release).

    Raised by ``ctx.side_effect`` when the fence check fails; nothing was
    recorded. A body that lets it escape writes nothing: the worker drops the
    attempt, because the attempt that now holds the job owns its outcome.
    """
