"""Durable steps: ``ctx.step``, ``ctx.sleep`` and ``ctx.wait_for``, and ``send_event``.

A body is straight-line code that runs again from the top on every attempt.
Each named step is stored (``leasejobs_step``) the first time an attempt
completes it, in a transaction fenced like ``ctx.side_effect``'s (the job
row locked and checked to be this attempt's, the lease renewed before the
commit): a later attempt returns the stored result without running it
again, and an attempt that no longer holds its job stores nothing. A sleep
or a wait that cannot return yet ends the attempt (``Suspended``): the
worker writes the job back to ``queued``, due when the sleep ends or the
event comes, without counting the run.

One ``StepBook`` per attempt reads every step of its job once, at the
attempt's first step, so a job of ten steps pays one read and one fenced
transaction per step it runs, none for the steps it passes.
"""

import inspect
import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from leasejobs import conf
from leasejobs.db import facade
from leasejobs.db.rows import one_line, stored_json, validate_delay_seconds, validate_key
from leasejobs.db.sql.fragments import NEVER
from leasejobs.exceptions import Suspended, WaitTimeout

logger = logging.getLogger("leasejobs.steps")

#: ``JobContext.fenced``: a transaction that commits only while the attempt holds its job.
Fenced = Callable[..., AbstractContextManager[Any]]


@dataclass(slots=True)
class Stored:
    """One step row as an attempt read or wrote it."""

    kind: str  # step, sleep or wait
    attempt: int
    #: The JSON text of the result (a step's value, a wait's payload); None for a sleep or a timeout.
    result: str | None
    event_key: str | None
    event_id: int | None
    done: bool


def step_key(job_id: int, name: str) -> str:
    """The idempotency key of step ``name`` of a job: the same in every attempt."""
    return f"leasejobs:{job_id}:{name}"


def _seconds(value: object, what: str) -> float:
    """Seconds a sleep or a wait lasts: finite, 0 or more, and ending before ``NEVER``, the
    date that marks a waiting job's ``run_at`` as never: a job due after it (a sleep of a
    billion years) could not be read back by Python's ``datetime``, nor by any page or
    query that loads it."""
    seconds = validate_delay_seconds(value, what)
    if seconds >= (_NEVER - datetime.now(UTC)).total_seconds():
        raise ValueError(
            f"{what} would end after {_NEVER:%Y-%m-%d}, later than a job's run_at can be read back: "
            f"{seconds:g} s is too long (a job that waits until someone acts waits for an event "
            "with no timeout)."
        )
    return float(seconds)


_NEVER = datetime.fromisoformat(NEVER)


def load_result(text: str | None) -> Any:
    """A stored result (JSON text, or None) as the body gets it."""
    return None if text is None else json.loads(text)


class StepBook:
    """The steps of one attempt: what earlier attempts stored, and the names this one used."""

    def __init__(self, job_id: int, attempt: int, fenced: Fenced) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self._fenced = fenced
        self._stored: dict[str, Stored] | None = None
        self._used: set[str] = set()
        #: The step whose function runs now (its ``key`` is known), or None.
        self.current: str | None = None

    @property
    def key(self) -> str:
        """The idempotency key of the step whose function runs now."""
        if self.current is None:
            raise RuntimeError(
                "ctx.step_key is only known while a step's function runs; read it inside the function "
                "you pass to ctx.step."
            )
        return step_key(self.job_id, self.current)

    def _rows(self) -> dict[str, Stored]:
        if self._stored is None:
            self._stored = {row[0]: Stored(*row[1:]) for row in facade.read_steps(self.job_id)}
        return self._stored

    def _take(self, name: str, kind: str) -> Stored | None:
        """Claim ``name`` for this attempt; what an earlier attempt stored under it, if anything."""
        validate_key(name, f"the name of a {kind}")
        if self.current is not None:
            raise RuntimeError(
                f"ctx.{kind} {name!r} was called inside the function of step {self.current!r}; "
                "call it from the body, outside any step's function."
            )
        if name in self._used:
            raise ValueError(
                f"the step name {name!r} is used twice in one attempt of job {self.job_id}; "
                "give each step, sleep and wait of a job a name of its own."
            )
        self._used.add(name)
        stored = self._rows().get(name)
        if stored is not None and stored.kind != kind:
            raise ValueError(
                f"the name {name!r} is a {stored.kind} of job {self.job_id} already, not a {kind}; "
                "give each step, sleep and wait of a job a name of its own."
            )
        return stored

    def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``ctx.step``: the stored result, or ``fn``'s, stored with its writes in one fenced transaction."""
        stored = self._take(name, "step")
        if stored is not None:
            return load_result(stored.result)
        with self._fenced(("step", name)) as cursor:
            self.current = name
            try:
                value = fn(*args, **kwargs)
            finally:
                self.current = None
            if inspect.isawaitable(value):
                if inspect.iscoroutine(value):
                    value.close()
                raise TypeError(
                    f"the function of step {name!r} returned an awaitable; pass a plain function to "
                    "ctx.step (an async body passes its async function to ctx.astep)."
                )
            text = self._record(cursor, name, value)
        return load_result(text)

    def _record(self, cursor: Any, name: str, value: Any) -> str:
        # Read back as ``jsonb`` stored it (no exponent, no negative zero), as every later
        # attempt reads it: the attempt that ran ``fn`` sees the same value.
        text = facade.record_step(
            cursor,
            {
                "job_id": self.job_id,
                "name": name,
                "attempt": self.attempt,
                "result": stored_json(value, f"the result of step {name!r}"),
            },
        )
        self._rows()[name] = Stored("step", self.attempt, text, None, None, True)
        return text

    def begin_async(self, name: str) -> Stored | None:
        """``ctx.astep``'s first half: the stored step, or None (then ``current`` is set)."""
        stored = self._take(name, "step")
        if stored is None:
            self.current = name
        return stored

    def end_async(self, cursor: Any, name: str, value: Any) -> str:
        """``ctx.astep``'s second half, inside the fenced transaction: store the result."""
        self.current = None
        return self._record(cursor, name, value)

    def sleep(self, name: str, seconds: float) -> None:
        """``ctx.sleep``: return if an earlier attempt slept here; else record it and suspend."""
        seconds = _seconds(seconds, f"ctx.sleep({name!r}, seconds)")
        if self._take(name, "sleep") is not None:
            return
        with self._fenced(("sleep", name)) as cursor:
            facade.record_sleep(
                cursor, {"job_id": self.job_id, "name": name, "attempt": self.attempt, "seconds": seconds}
            )
        self._rows()[name] = Stored("sleep", self.attempt, None, None, None, True)
        raise Suspended(f"sleeping {seconds:g} s at {name!r}")

    def wait_for(self, name: str, event_key: str, timeout: float | None) -> Any:
        """``ctx.wait_for``: the event's payload, stored as the step; else suspend until it comes."""
        validate_key(event_key, "an event key")
        if timeout is not None:
            timeout = _seconds(timeout, f"the timeout of ctx.wait_for({name!r})")
        stored = self._take(name, "wait")
        if stored is not None and stored.event_key != event_key:
            raise ValueError(
                f"wait {name!r} of job {self.job_id} waits for event {stored.event_key!r}, "
                f"not {event_key!r}; give a wait for another key a name of its own."
            )
        if stored is not None and stored.done:
            if stored.event_id is None:
                raise _timed_out(name, event_key)
            return load_result(stored.result)
        params = {"job_id": self.job_id, "name": name, "attempt": self.attempt, "key": event_key}
        with self._fenced(("wait", name), event_key) as cursor:
            event_id, payload, _ = facade.look_event(cursor, params)
            if event_id is not None:
                facade.receive_event(cursor, {**params, "payload": payload, "event_id": event_id})
                got = "received"
            elif stored is not None and facade.time_out_wait(cursor, params):
                got = "timed out"
            else:
                facade.wait_event(cursor, {**params, "timeout": timeout})
                got = "waiting"
        self._rows()[name] = Stored("wait", self.attempt, payload, event_key, event_id, got != "waiting")
        if got == "received":
            return load_result(payload)
        if got == "timed out":
            raise _timed_out(name, event_key)
        raise Suspended(f"waiting for event {event_key!r} at {name!r}")


def _timed_out(name: str, event_key: str) -> WaitTimeout:
    return WaitTimeout(f"wait {name!r} for event {event_key!r} timed out before the event was sent.")


def send_event(event_key: str, payload: Any = None) -> bool:
    """Send event ``event_key`` with its JSON ``payload``, in the caller's transaction.

    Delivered only if that transaction commits: every job that waits for the
    key (``ctx.wait_for``), now or later, receives the payload, and the ones
    waiting now are made due in the same transaction. A key names one fact:
    the first send of a key stands, and a later send of the same key
    changes nothing (returns False; True: this call stored it).
    """
    validate_key(event_key, "an event key")
    text = stored_json(payload, f"the payload of event {event_key!r}")
    stored, woken = facade.send_event(event_key, text, str(conf.get("NOTIFY_CHANNEL")))
    logger.info("event sent key=%s stored=%s woken=%s", one_line(repr(event_key)), bool(stored), woken)
    return bool(stored)
