"""The job context: what a running task body knows about its own attempt.

The context is shared between the thread running the body and the worker's
threads, which flip ``lease_lost`` and ``cancel_requested``. Those are plain
flags that only ever go from False to True: an attribute write is atomic, so
either thread may look at any time, and nobody waits on them (a
``threading.Event`` each cost a fifth of the worker's CPU per no-op job).
"""

import contextvars
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from leasejobs import sql
from leasejobs.conf import db_alias
from leasejobs.exceptions import LeaseLost
from leasejobs.validators import validate_key
from leasejobs.values import one_line, stored_json

logger = logging.getLogger("leasejobs.worker")

_current: contextvars.ContextVar["JobContext | None"] = contextvars.ContextVar(
    "leasejobs_current_job", default=None
)


@dataclass(frozen=True)
class SideEffectRecord:
    """What ``ctx.side_effect`` yields: ``created`` is True when this attempt
    recorded the key, False when an earlier attempt or job already had."""

    key: str
    created: bool
    fencing_token: int


@dataclass(slots=True)
class JobContext:
    job_id: int
    attempt: int
    worker_id: str
    task_name: str = ""
    queue: str = "default"
    #: Started runs of the job, this one included: what ``max_attempts`` limits.
    runs: int = 1
    #: The lease this attempt holds (renewed as a side-effect block commits).
    lease_seconds: float = 30.0
    #: Called when a side-effect block ends, so the worker heartbeats soon.
    after_side_effect: Callable[[], None] | None = field(default=None, repr=False)
    #: Called when the fence refused a write of this attempt (the worker's metrics).
    on_stale_write: "Callable[[JobContext], None] | None" = field(default=None, repr=False)
    _lease_lost: bool = field(default=False, repr=False)
    _cancel_requested: bool = field(default=False, repr=False)
    #: The tick of a periodic job, once known: from ``note_idempotency_key``
    #: (the worker, from the claimed row) or read by ``scheduled_at`` on first use.
    _scheduled_at: dt.datetime | None = field(default=None, repr=False)
    _scheduled_at_read: bool = field(default=False, repr=False)

    @property
    def fencing_token(self) -> int:
        """The token every write of this attempt is checked against (== attempt)."""
        return self.attempt

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat or fence check found this attempt no longer holds the job."""
        return self._lease_lost

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this running job."""
        return self._cancel_requested

    def note_idempotency_key(self, key: str | None) -> None:
        """Give the context the claimed row's idempotency key, so ``scheduled_at`` needs no query."""
        from leasejobs.periodic.schedules import tick_of_key

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

    def mark_lease_lost(self) -> None:
        self._lease_lost = True

    def mark_cancel_requested(self) -> None:
        self._cancel_requested = True

    @contextmanager
    def side_effect(self, key: str, data: Any = None) -> Iterator[SideEffectRecord]:
        """Record side effect ``key`` for this attempt, at most once ever.

        In one transaction: lock the job row, check that this attempt still
        holds it (``attempt`` equals the token, this worker holds it, status
        running), and insert the key unless it exists. A failed check raises
        ``LeaseLost`` and records nothing. The block runs inside the
        transaction, so its own database writes commit with the record, and an
        exception in it rolls the record back. While the block runs, the job
        cannot be taken over; when it ends, the lease is renewed in the same
        transaction (heartbeats cannot touch the row while the block holds it),
        so a block longer than the lease still commits holding a live lease.
        The commit is synchronous whatever ``synchronous_commit`` says.
        """
        validate_key(key, "a side-effect key")
        data_json = None if data is None else stored_json(data, f"the data of side effect {key!r}")
        if self.lease_lost:  # timed out, given back or taken over: known without asking
            raise self._stale(key, None)
        fence: dict[str, Any] = {"job_id": self.job_id, "attempt": self.attempt, "worker_id": self.worker_id}
        try:
            with transaction.atomic(using=db_alias()), connections[db_alias()].cursor() as cursor:
                cursor.execute(sql.FENCE_CHECK, {"job_id": self.job_id})
                row = cursor.fetchone()
                if row is None or tuple(row[:3]) != (self.attempt, "running", self.worker_id):
                    raise self._stale(key, row)
                cursor.execute(
                    sql.RECORD_SIDE_EFFECT,
                    {"job_id": self.job_id, "key": key, "fencing_token": self.attempt, "data": data_json},
                )
                created = cursor.fetchone() is not None
                yield SideEffectRecord(key=key, created=created, fencing_token=self.attempt)
                cursor.execute(sql.RENEW_LEASE, {**fence, "lease_seconds": self.lease_seconds})
        finally:
            if self.after_side_effect is not None:
                self.after_side_effect()

    def _stale(self, key: str, row: Any) -> LeaseLost:
        """Mark the lease lost, log the rejected write, and make the error to raise."""
        self.mark_lease_lost()
        if self.on_stale_write is not None:
            self.on_stale_write(self)
        if row is None:
            now = "no longer held by this attempt"
        elif row[2] != self.worker_id and row[0] == self.attempt:
            now = f"held by {row[2]} at the same attempt {row[0]}"
        else:
            now = f"at attempt {row[0]}, {row[1]}"
        logger.warning(
            "stale write rejected job=%s attempt=%s worker=%s key=%s: the job is %s",
            self.job_id,
            self.attempt,
            self.worker_id,
            one_line(repr(key)),
            one_line(now),
        )
        return LeaseLost(
            f"job {self.job_id} attempt {self.attempt} no longer holds its lease "
            f"(the job is {now}); side effect {key!r} was not recorded."
        )


def current_job() -> JobContext | None:
    """The context of the job running in this thread, or None outside a job."""
    return _current.get()


def activate(ctx: JobContext) -> contextvars.Token["JobContext | None"]:
    return _current.set(ctx)


def deactivate(token: contextvars.Token["JobContext | None"]) -> None:
    _current.reset(token)
