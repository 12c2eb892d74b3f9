"""The job context: what a running task body knows about its own attempt.

The context lives in the process that runs the body (one of the worker's
children). ``lease_lost`` and ``cancel_requested`` come from two places: the
body's own fenced writes, and the flags the worker raises in the body's
shared slot (``leasejobs.worker.slots``) when a heartbeat finds the lease
gone or a cancel requested, or when it stops the body. Both only ever go
from False to True.
"""

import contextvars
import datetime as dt
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from asgiref.sync import sync_to_async

from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.db.rows import one_line, stored_json, tick_of_key, validate_key
from leasejobs.exceptions import LeaseLost
from leasejobs.jobs.steps import StepBook, load_result

logger = logging.getLogger("leasejobs.worker")

_current: contextvars.ContextVar["JobContext | None"] = contextvars.ContextVar(
    "leasejobs_current_job", default=None
)

#: The slot flags (``leasejobs.worker.slots``) that mean "this attempt may no
#: longer write": its lease is lost, it timed out, or the worker stops it.
_FENCED_FLAGS = 1 | 4 | 8
_CANCEL_FLAG = 2

#: A fenced block renews its lease as it commits when less than this share of
#: the lease surely remains (or the job holds places under a limit).
RENEW_BELOW = 0.5


class BodySlot(Protocol):
    """What a context needs of the shared slot of the body it belongs to."""

    def flags(self) -> int:
        """The flags the worker raised for this attempt."""
        ...

    def block_started(self, places: int) -> None:
        """A side-effect block holds the job row now."""
        ...

    def block_ended(self, renewed_until: float | None) -> None:
        """The block ended; its commit renewed the lease until this monotonic time (None: not renewed)."""
        ...

    def lease_left(self) -> float | None:
        """Seconds from now during which the attempt's lease surely holds (None: not known)."""
        ...


@dataclass(frozen=True)
class SideEffectRecord:
    """What ``ctx.side_effect`` yields: ``created`` is True when this attempt
    recorded the key, False when an earlier attempt or job already had."""

    key: str
    created: bool
    fencing_token: int


class ClaimedAttempt(Protocol):
    """What a context is made from: a child's ``BodyJob``, the worker's ``HeldJob``."""

    @property
    def id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def task_name(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def runs(self) -> int: ...


def context_for(
    job: ClaimedAttempt,
    *,
    worker_id: str,
    lease_seconds: float,
    places: int,
    slot: "BodySlot | None" = None,
) -> "JobContext":
    """The context of one claimed attempt, the same in the child that runs it and in the worker.

    Built by position: a child builds one per body, and keywords cost a third more.
    """
    return JobContext(
        job.id, job.attempt, worker_id, job.task_name, job.queue, job.runs, lease_seconds, places, slot
    )


@dataclass(slots=True)
class JobContext:
    job_id: int
    attempt: int
    worker_id: str
    task_name: str = ""
    queue: str = "default"
    #: Started runs of the job, this one included: what ``max_attempts`` limits.
    runs: int = 1
    #: The lease this attempt holds (renewed as a side-effect block commits near its end).
    lease_seconds: float = 30.0
    #: Places under queue or key limits this attempt holds: the fence checks them too.
    places: int = 0
    #: The shared slot of the body (None outside a worker's child: ``leasejobs.testing``).
    slot: BodySlot | None = field(default=None, repr=False)
    #: Writes of this attempt the fence refused (the worker counts them).
    stale_writes: int = field(default=0, repr=False)
    _lease_lost: bool = field(default=False, repr=False)
    _cancel_requested: bool = field(default=False, repr=False)
    #: The tick of a periodic job, once known: from ``note_idempotency_key``
    #: or read by ``scheduled_at`` on first use.
    _scheduled_at: dt.datetime | None = field(default=None, repr=False)
    _scheduled_at_read: bool = field(default=False, repr=False)
    #: ``parent_results``, once read (one query, on first use).
    _parent_results: dict[int, Any] | None = field(default=None, repr=False)
    #: The durable steps of this attempt (``ctx.step``), made at the first one.
    _book: StepBook | None = field(default=None, repr=False)

    @property
    def fencing_token(self) -> int:
        """The token every write of this attempt is checked against (== attempt)."""
        return self.attempt

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat or fence check found this attempt no longer holds the job,
        or the worker stopped the attempt (timed out, worker stopping)."""
        if not self._lease_lost and self.slot is not None and self.slot.flags() & _FENCED_FLAGS:
            self._lease_lost = True
        return self._lease_lost

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this running job."""
        if not self._cancel_requested and self.slot is not None and self.slot.flags() & _CANCEL_FLAG:
            self._cancel_requested = True
        return self._cancel_requested

    def note_idempotency_key(self, key: str | None) -> None:
        """Give the context the claimed row's idempotency key, so ``scheduled_at`` needs no query."""
        self._scheduled_at = tick_of_key(key)
        self._scheduled_at_read = True

    @property
    def scheduled_at(self) -> dt.datetime | None:
        """The tick this periodic job is for (aware, UTC), or None for a job no schedule made.

        Named by the job's idempotency key (``periodic:<schedule>:<tick>``);
        read from the job row on first use unless the worker filled it in.
        """
        if self._scheduled_at is None and not self._scheduled_at_read:
            from leasejobs.models import Job

            key = (
                Job.objects.using(db_alias()).filter(pk=self.job_id).values_list("idempotency_key", flat=True)
            )
            self.note_idempotency_key(next(iter(key), None))
        return self._scheduled_at

    @property
    def parent_results(self) -> dict[int, Any]:
        """The results of this job's parents in its workflow, by parent job id.

        Read in one query on first use, in the body's process (a job that
        never asks pays nothing); empty for a job with no parents. A parent
        that failed or was cancelled (its child asked to run anyway) shows
        None, and a pruned parent is missing.
        """
        if self._parent_results is None:
            self._parent_results = {
                parent: None if text is None else json.loads(text)
                for parent, text in facade.parent_results(self.job_id)
            }
        return self._parent_results

    def mark_lease_lost(self) -> None:
        self._lease_lost = True

    def mark_cancel_requested(self) -> None:
        self._cancel_requested = True

    @contextmanager
    def side_effect(self, key: str, data: Any = None) -> Iterator[SideEffectRecord]:
        """Record side effect ``key`` for this attempt, at most once ever.

        In one transaction: lock the job row, check that this attempt still
        holds it (``attempt`` equals the token, this worker holds it, status
        running, and every place under a limit the attempt took is still its
        own), and insert the key unless it exists. A failed check raises
        ``LeaseLost`` and records nothing. The block runs inside the
        transaction, so its own database writes commit with the record, and an
        exception in it rolls the record back. While the block runs, the job
        cannot be taken over; when it ends, the lease and the places are
        renewed in the same transaction (heartbeats cannot touch the row while
        the block holds it), so a block longer than the lease still commits
        holding a live lease, and one whose places were taken meanwhile (its
        worker was paused) commits nothing. The commit is synchronous whatever
        ``synchronous_commit`` says.
        """
        validate_key(key, "a side-effect key")
        data_json = None if data is None else stored_json(data, f"the data of side effect {key!r}")
        if self._book is not None and self._book.current is not None:
            raise RuntimeError(
                f"ctx.side_effect({key!r}) was called inside the function of step {self._book.current!r}; "
                "a step is already fenced and runs once per job: use ctx.step_key as the idempotency key."
            )
        with self.fenced(("side effect", key)) as cursor:
            created = facade.record_side_effect(cursor, self.job_id, key, self.attempt, data_json)
            yield SideEffectRecord(key=key, created=created, fencing_token=self.attempt)

    @contextmanager
    def fenced(self, what: tuple[str, str], event_key: str | None = None) -> Iterator[Any]:
        """A transaction that commits only while this attempt holds its job: the fence
        of ``side_effect`` and of the durable steps (``leasejobs.jobs.steps``).

        Yields the transaction's cursor after the fence check (see
        ``side_effect``) and renews the lease and places before the commit
        (the lease only when less than half of it surely remains);
        ``what`` (kind, name) names the write in the ``LeaseLost`` raised when
        the attempt no longer holds the job. ``event_key``: take that event
        key's lock first (a wait), always before the job row's.
        """
        if self.lease_lost:  # timed out, stopped, given back or taken over: known without asking
            raise self._stale(what, None)
        fence: dict[str, Any] = {"job_id": self.job_id, "attempt": self.attempt, "worker_id": self.worker_id}
        renewed_until: float | None = None
        try:
            with facade.side_effect_transaction() as cursor:
                if event_key is not None:
                    facade.lock_event_key(cursor, event_key)
                row = facade.fence_check(cursor, self.job_id)
                if (
                    row is None
                    or tuple(row[:3]) != (self.attempt, "running", self.worker_id)
                    or row[4] < self.places
                ):
                    raise self._stale(what, row)
                if self.slot is not None:
                    self.slot.block_started(self.places)
                yield cursor
                if self.lease_lost:  # stopped while inside the block: nothing of it commits
                    raise self._stale(what, None)
                if not self._lease_holds_long():
                    sent = time.monotonic()
                    renewed = facade.renew_lease(cursor, fence, self.lease_seconds)
                    if renewed is None or renewed[0] != 1 or renewed[1] < self.places:
                        raise self._stale(what, None)
                    renewed_until = sent + self.lease_seconds
        finally:
            if self.slot is not None:
                self.slot.block_ended(renewed_until)

    def _lease_holds_long(self) -> bool:
        """Whether the block may commit without renewing the lease: the job holds no place
        (its locked row is the whole fence, and nothing of it can run out meanwhile) and
        more than ``RENEW_BELOW`` of the lease surely remains, so the heartbeats the block
        made skip the row have time to renew it. A renewal is a row version written and a
        statement: a job of many steps or side effects would pay one each."""
        if self.places or self.slot is None:
            return False
        left = self.slot.lease_left()
        return left is not None and left > RENEW_BELOW * self.lease_seconds

    @asynccontextmanager
    async def aside_effect(self, key: str, data: Any = None) -> AsyncIterator[SideEffectRecord]:
        """``side_effect`` for ``async def`` bodies: ``async with ctx.aside_effect(key) as effect:``.

        The transaction lives on the thread Django's async ORM uses for this
        body (``sync_to_async(thread_sensitive=True)``), so the block's own
        ``await Model.objects.acreate(...)`` calls commit or roll back with
        the record, as in ``side_effect``.
        """
        block = self.side_effect(key, data)
        record = await sync_to_async(block.__enter__, thread_sensitive=True)()
        try:
            yield record
        except BaseException as exc:
            if not await sync_to_async(block.__exit__, thread_sensitive=True)(
                type(exc), exc, exc.__traceback__
            ):
                raise
        else:
            await sync_to_async(block.__exit__, thread_sensitive=True)(None, None, None)

    # -- durable steps (leasejobs.jobs.steps) ----------------------------------------

    @property
    def _steps(self) -> StepBook:
        """This attempt's ``StepBook``, made at its first durable step."""
        if self._book is None:
            self._book = StepBook(self.job_id, self.attempt, self.fenced)
        return self._book

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per job and return its result, as JSON reads it back.

        The result is stored with ``fn``'s own database writes in one fenced
        transaction (as ``side_effect``'s block); a later attempt returns the
        stored result without calling ``fn``. A function that raises stores
        nothing. Inside ``fn``, ``ctx.step_key`` is the step's idempotency key.
        """
        return self._steps.step(name, fn, args, kwargs)

    async def astep(self, name: str, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any) -> Any:
        """``step`` for ``async def`` bodies and async functions, its transaction on Django's
        async ORM thread (as ``aside_effect``'s)."""
        book = self._steps
        stored = await sync_to_async(book.begin_async, thread_sensitive=True)(name)
        if stored is not None:
            return load_result(stored.result)
        block = self.fenced(("step", name))
        cursor = await sync_to_async(block.__enter__, thread_sensitive=True)()
        try:
            value = await fn(*args, **kwargs)
            text = await sync_to_async(book.end_async, thread_sensitive=True)(cursor, name, value)
        except BaseException as exc:
            book.current = None
            await sync_to_async(block.__exit__, thread_sensitive=True)(type(exc), exc, exc.__traceback__)
            raise
        await sync_to_async(block.__exit__, thread_sensitive=True)(None, None, None)
        return load_result(text)

    @property
    def step_key(self) -> str:
        """The idempotency key of the step whose function runs now, the same in every attempt
        (``leasejobs:<job id>:<step name>``): give it to the external service the step calls."""
        return self._steps.key

    def sleep(self, name: str, seconds: float) -> None:
        """Sleep durably: end this attempt now and resume the job ``seconds`` from now, in a new
        attempt that passes the completed steps and returns here at once.

        Uses no runner, lease or attempt while it sleeps (``max_attempts`` is
        not used up). Never catch the ``Suspended`` it raises.
        """
        self._steps.sleep(name, seconds)

    def wait_for(self, name: str, event_key: str, timeout: float | None = None) -> Any:
        """The payload of event ``event_key`` (``leasejobs.send_event``), stored as step ``name``.

        If the event was not sent yet, the attempt ends (as ``sleep``) and the
        job resumes when it is, or at ``timeout`` seconds after the first
        wait: then ``leasejobs.WaitTimeout`` is raised here.
        """
        return self._steps.wait_for(name, event_key, timeout)

    async def asleep(self, name: str, seconds: float) -> None:
        """``sleep`` for ``async def`` bodies."""
        await sync_to_async(self._steps.sleep, thread_sensitive=True)(name, seconds)

    async def await_for(self, name: str, event_key: str, timeout: float | None = None) -> Any:
        """``wait_for`` for ``async def`` bodies."""
        return await sync_to_async(self._steps.wait_for, thread_sensitive=True)(name, event_key, timeout)

    def _stale(self, what: tuple[str, str], row: Any) -> LeaseLost:
        """Mark the lease lost, log the rejected write, and make the error to raise."""
        self.mark_lease_lost()
        self.stale_writes += 1
        if row is None:
            now = "no longer held by this attempt"
        elif tuple(row[:3]) == (self.attempt, "running", self.worker_id):
            now = f"still this attempt's, but {self.places - row[4]} of its places under limits were taken"
        elif row[2] != self.worker_id and row[0] == self.attempt:
            now = f"held by {row[2]} at the same attempt {row[0]}"
        else:
            now = f"at attempt {row[0]}, {row[1]}"
        kind, key = what
        logger.warning(
            "stale write rejected job=%s attempt=%s worker=%s %s=%s: the job is %s",
            self.job_id,
            self.attempt,
            self.worker_id,
            "key" if kind == "side effect" else kind.split()[0],
            one_line(repr(key)),
            one_line(now),
        )
        return LeaseLost(
            f"job {self.job_id} attempt {self.attempt} no longer holds its lease "
            f"(the job is {now}); {kind} {key!r} was not recorded."
        )


def current_job() -> JobContext | None:
    """The context of the job running in this thread, or None outside a job."""
    return _current.get()


def activate(ctx: JobContext) -> contextvars.Token["JobContext | None"]:
    return _current.set(ctx)


def deactivate(token: contextvars.Token["JobContext | None"]) -> None:
    _current.reset(token)
