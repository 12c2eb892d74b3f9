"""Retry policies, and the one decision taken after a job body raised.

Pure: no database, no Django models. The worker (and ``leasejobs.testing``)
call ``decide`` with what the body raised and how many attempts the job has
used; it answers retry (after a delay), fail, snooze or discard, and the
caller writes that outcome through the fenced finish statement.

A policy is checked when it is built, so a task with a policy that makes no
sense is refused at import (``@task(retry=...)``), not at its first failure.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from leasejobs import conf
from leasejobs.db.rows import qualified_name, validate_delay_seconds
from leasejobs.exceptions import Discard, LeaseLost, Snooze, Suspended

Backoff = Literal["exponential", "linear", "fixed"]
BACKOFFS: tuple[str, ...] = ("exponential", "linear", "fixed")


#: Exceptions that steer the worker; a policy may not list them.
CONTROL_FLOW: tuple[type[BaseException], ...] = (Snooze, Discard, LeaseLost, Suspended)
_CONTROL_FLOW_NAMES = {qualified_name(c) for c in CONTROL_FLOW}


def _exception_names(name: str, value: object) -> tuple[str, ...]:
    """Exception classes (or, from a stored policy, their dotted names) as dotted names."""
    if isinstance(value, type | str):
        value = (value,)
    if not isinstance(value, tuple | list) or not all(
        isinstance(v, str) or (isinstance(v, type) and issubclass(v, BaseException)) for v in value
    ):
        raise ValueError(f"RetryPolicy {name} must be an exception class or a tuple of them.")
    for v in value:
        if (isinstance(v, type) and issubclass(v, CONTROL_FLOW)) or v in _CONTROL_FLOW_NAMES:
            label = v.__name__ if isinstance(v, type) else v
            raise ValueError(
                f"RetryPolicy {name} may not list {label}: Snooze, Discard, LeaseLost and Suspended "
                "are not failures and are never retried."
            )
    return tuple(v if isinstance(v, str) else qualified_name(v) for v in value)


def _seconds(name: str, value: object) -> None:
    if value is not None:
        validate_delay_seconds(value, f"RetryPolicy {name}")


@dataclass(frozen=True)
class RetryPolicy:
    """How a task's failures are retried.

    - ``retry_on``: the exceptions that are retried (None: every exception
      not in ``fail_on``); any other exception fails the job at once.
      Given as classes, kept as their dotted names (``"builtins.KeyError"``).
    - ``fail_on``: exceptions that fail the job at once, never retried
      (checked first, so ``fail_on=(ValueError,)`` wins over
      ``retry_on=(Exception,)``).
    - ``backoff``: the delay before retry number n (n = failed attempts so
      far): ``exponential`` base * 2**(n-1), ``linear`` base * n, ``fixed``
      base; then capped at ``max_seconds``.
    - ``base_seconds`` / ``max_seconds``: None reads
      ``LEASEJOBS["RETRY_BACKOFF_SECONDS"]`` / ``["RETRY_BACKOFF_MAX_SECONDS"]``
      when the job fails, so the global settings stay the defaults.
    - ``jitter``: the share of the delay taken off at random (0: exact; the
      default 0.5 picks a point in the upper half), so a burst of failures
      does not come back as a burst of retries.
    """

    retry_on: tuple[str, ...] | None = None
    fail_on: tuple[str, ...] = ()
    backoff: Backoff = "exponential"
    base_seconds: float | None = None
    max_seconds: float | None = None
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.retry_on is not None:
            object.__setattr__(self, "retry_on", _exception_names("retry_on", self.retry_on))
        object.__setattr__(self, "fail_on", _exception_names("fail_on", self.fail_on))
        both = set(self.retry_on or ()) & set(self.fail_on)
        if both:
            names = ", ".join(sorted(both))
            raise ValueError(f"RetryPolicy lists {names} in both retry_on and fail_on; keep it in one.")
        if self.backoff not in BACKOFFS:
            raise ValueError(
                f"RetryPolicy backoff must be one of {', '.join(BACKOFFS)}, not {self.backoff!r}."
            )
        _seconds("base_seconds", self.base_seconds)
        _seconds("max_seconds", self.max_seconds)
        if (
            self.base_seconds is not None
            and self.max_seconds is not None
            and self.max_seconds < self.base_seconds
        ):
            raise ValueError("RetryPolicy max_seconds (the cap) must be at least base_seconds.")
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter <= 1
        ):
            raise ValueError("RetryPolicy jitter must be a share of the delay between 0 and 1.")

    def retries(self, exc: BaseException) -> bool:
        """Whether this exception may be retried at all (attempts left aside).

        Matched by the dotted names of the exception's classes (its MRO), so
        a policy stored on a job row works without importing anything.
        """
        names = {qualified_name(c) for c in type(exc).__mro__}
        if names & set(self.fail_on):
            return False
        return self.retry_on is None or bool(names & set(self.retry_on))

    def to_json(self) -> dict[str, Any]:
        """The policy as stored on a job row (``Job.retry_policy``)."""
        return {
            "retry_on": None if self.retry_on is None else list(self.retry_on),
            "fail_on": list(self.fail_on),
            "backoff": self.backoff,
            "base_seconds": self.base_seconds,
            "max_seconds": self.max_seconds,
            "jitter": self.jitter,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RetryPolicy":
        """A policy read back from a job row; checked like any other."""
        return cls(
            retry_on=None if data.get("retry_on") is None else tuple(data["retry_on"]),
            fail_on=tuple(data.get("fail_on") or ()),
            backoff=data.get("backoff", "exponential"),
            base_seconds=data.get("base_seconds"),
            max_seconds=data.get("max_seconds"),
            jitter=data.get("jitter", 0.5),
        )

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds before the retry that follows ``failures`` failed attempts (1 or more)."""
        base = float(conf.get("RETRY_BACKOFF_SECONDS") if self.base_seconds is None else self.base_seconds)
        cap = float(conf.get("RETRY_BACKOFF_MAX_SECONDS") if self.max_seconds is None else self.max_seconds)
        n = max(1, failures)
        if self.backoff == "exponential":
            # 2**n overflows a float past n = 1023; any cap is reached long before.
            raw = base * 2 ** min(n - 1, 1000)
        elif self.backoff == "linear":
            raw = base * n
        else:
            raw = base
        capped = float(min(cap, raw))
        return capped * (1 - self.jitter * rand())


def policy_for(task_policy: RetryPolicy | None, stored: object) -> RetryPolicy | None:
    """The policy a claimed job fails by: the one stored on its row, else its task's.

    A stored policy that does not read back (a row written by hand) is
    ignored: the task's policy applies.
    """
    if isinstance(stored, dict):
        try:
            return RetryPolicy.from_json(stored)
        except (ValueError, TypeError):
            pass
    return task_policy


#: The policy of a task that names none: every exception retried, exponential
#: backoff from the LEASEJOBS settings, jittered in its upper half.
DEFAULT = RetryPolicy()


@dataclass(frozen=True)
class Decision:
    """What to write after a body raised: retry, fail, snooze or discard.

    ``delay``: seconds until the job is due again (retry and snooze).
    ``reason``: the job's ``last_error`` when it is not the exception's own
    line: a discard's reason, or why a snooze failed the job.
    """

    action: Literal["retry", "fail", "snooze", "discard"]
    delay: float | None = None
    reason: str | None = None


def decide(
    policy: RetryPolicy | None,
    exc: BaseException,
    runs: int,
    max_attempts: int,
    snoozes: int = 0,
    max_snoozes: int | None = None,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """The outcome of an attempt whose body raised ``exc``.

    ``runs``: attempts that count toward ``max_attempts``, this one included
    (snoozed attempts do not count). ``snoozes``: times the job snoozed
    before this attempt; ``max_snoozes`` (default ``LEASEJOBS["MAX_SNOOZES"]``)
    is how many it may: the one after that fails the job.
    """
    policy = policy or DEFAULT
    if isinstance(exc, Snooze):
        limit = conf.get("MAX_SNOOZES") if max_snoozes is None else max_snoozes
        if snoozes >= limit:
            return Decision(
                "fail", reason=f"snoozed {snoozes} times already, the most LEASEJOBS['MAX_SNOOZES'] allows"
            )
        return Decision("snooze", delay=exc.seconds)
    if isinstance(exc, Discard):
        return Decision("discard", reason=f"discarded: {exc.reason}")
    if not policy.retries(exc) or runs >= max_attempts:
        return Decision("fail")
    return Decision("retry", delay=policy.delay(runs, rand))
