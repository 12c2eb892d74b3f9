"""The finisher: writes settled outcomes, many per statement, each fenced.

Runners and the heartbeat hand it settled jobs; it lingers a few
milliseconds for company (``FINISH_LINGER_SECONDS``) and writes up to
``FINISH_BATCH`` outcomes in one FINISH statement. A job stays held (and
heartbeated) until its outcome is written, so a finish waiting in the batch
never loses its lease.

One job's bad value must never stall the others: if a batch is refused for
its data (PostgreSQL refuses a NUL in jsonb, say), the finisher writes its
outcomes one by one, and the one that is still refused is written as a
failure naming the error instead. Only a lost connection is retried as is.
"""

import threading
import time
from collections.abc import Callable

import psycopg

from leasejobs.db.connection import CONNECTION_ERRORS
from leasejobs.db.rows import stored_text
from leasejobs.db.store import Outcome, WorkerStore, run_delta
from leasejobs.worker.batcher import LingerBatcher
from leasejobs.worker.events import Events, describe
from leasejobs.worker.held import HeldJob, HeldJobs

#: How many outcomes one FINISH statement writes at most.
FINISH_BATCH = 500

#: How many bytes of results and errors one FINISH statement writes at most
#: (a single larger outcome goes alone).
FINISH_BATCH_BYTES = 8 * 2**20

#: How long the finisher waits for more outcomes before writing a batch that
#: is still small. A finish that is not written yet only keeps its job held
#: (and heartbeated) a little longer; a crash before it is written means the
#: job runs again under a new token, which fencing and side-effect keys make
#: safe. Three milliseconds turn a steady stream of short jobs into one
#: commit per several jobs and are invisible next to any real job.
FINISH_LINGER_SECONDS = 0.003


class Finisher:
    def __init__(
        self, store: WorkerStore, held: HeldJobs, events: Events, on_written: Callable[[], None]
    ) -> None:
        self.store = store
        self.held = held
        self.events = events
        self.on_written = on_written
        self._batcher: LingerBatcher[HeldJob] = LingerBatcher(
            self._write, linger_seconds=FINISH_LINGER_SECONDS, max_batch=FINISH_BATCH
        )
        self._give_up_at: float | None = None
        self._bytes_lock = threading.Lock()
        self._pending_bytes = 0

    def submit(self, job: HeldJob) -> None:
        """Queue a SETTLED job's outcome for writing."""
        with self._bytes_lock:
            self._pending_bytes += _weight(job)
        self._batcher.add(job)

    @property
    def pending_bytes(self) -> int:
        """The bytes of results and errors waiting to be written: the claimer counts them
        against ``PREFETCH_BYTES`` with the arguments it holds."""
        return self._pending_bytes

    def run(self) -> None:
        """The finisher thread: write until ``close`` and the queue is empty (or given up)."""
        left = self._batcher.run(self._giving_up)
        if left:
            self.events.gave_up_finishing(len(left))

    def close(self, give_up_at: float) -> None:
        """Write what is queued, and give up on rows still locked at ``give_up_at`` (monotonic)."""
        self._give_up_at = give_up_at
        self._batcher.close()

    def _giving_up(self) -> bool:
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    def _write(self, batch: list[HeldJob]) -> list[HeldJob]:
        """Write a batch; return the jobs to try again (row locked, or the database away).

        Large results go in statements of at most ``FINISH_BATCH_BYTES``: the
        rows one statement writes stay locked (and out of the heartbeat) until
        it commits.
        """
        weights = {job: _weight(job) for job in batch}
        left: list[HeldJob] = []
        part: list[HeldJob] = []
        size = 0
        for job in batch:
            if part and size + weights[job] > FINISH_BATCH_BYTES:
                left += self._write_any(part)
                part, size = [], 0
            part.append(job)
            size += weights[job]
        if part:
            left += self._write_any(part)
        with self._bytes_lock:
            self._pending_bytes -= sum(weights.values()) - sum(weights.get(job, 0) for job in left)
        return left

    def _write_any(self, batch: list[HeldJob]) -> list[HeldJob]:
        try:
            return self._write_batch(batch)
        except CONNECTION_ERRORS as exc:
            self.events.finish_failed(len(batch), exc)
            return batch
        except psycopg.Error as exc:
            if len(batch) > 1:
                return [job for one in batch for job in self._write_any([one])]
            return self._write_unstorable(batch[0], exc)

    def _write_batch(self, batch: list[HeldJob]) -> list[HeldJob]:
        began = time.perf_counter()
        rows = self.store.finish(
            [(job.key, _outcome(job), _run_delta(job)) for job in batch],
            slotted=any(job.slots for job in batch),
            skipping=any(job.finish_skipped for job in batch),
        )
        self.events.finish_statement(time.perf_counter() - began)
        written = {(r.id, r.attempt): r.status for r in rows if r.written}
        locked = {(r.id, r.attempt) for r in rows if not r.written}
        done = [job for job in batch if job.key in written]
        for job in done:
            status = written[job.key]
            if status is not None and status != _outcome(job).status:
                # A retry that a pending cancel turned into a cancel: count and log what was written.
                job.outcome = Outcome(status=status, last_error=_outcome(job).last_error)
        self.held.finished(done)
        for job in done:
            self.events.outcome(job, _outcome(job))
        waiting = []
        for job in batch:
            if job.key in written:
                continue
            if job.key in locked:
                if not job.finish_skipped:
                    job.finish_skipped = True
                    self.events.finish_locked(job)
                waiting.append(job)
            elif self.held.unwritten(job, lost=True):
                self.events.lease_lost(
                    job, f"stale {_outcome(job).status} dropped (the job moved on)", stale_write=True
                )
        self.on_written()
        return waiting

    def _write_unstorable(self, job: HeldJob, reason: psycopg.Error) -> list[HeldJob]:
        """One outcome PostgreSQL refused for its data: write a failure naming why instead."""
        self.events.outcome_unstorable(job, reason)
        error = stored_text(f"the outcome could not be stored: {describe(reason)}")
        job.outcome = Outcome(status="failed", last_error=error)
        try:
            return self._write_batch([job])
        except CONNECTION_ERRORS:
            return [job]
        except psycopg.Error as again:
            self.held.unwritten(job, lost=False)
            self.events.outcome_lost(job, again)
            return []


def _weight(job: HeldJob) -> int:
    """What a settled job's outcome weighs in memory until it is written."""
    outcome = job.outcome
    return 0 if outcome is None else len(outcome.result or "") + len(outcome.last_error or "")


def _run_delta(job: HeldJob) -> int:
    return run_delta(started=job.started, counted=job.counted, snoozed=_outcome(job).gives_back_run)


def _outcome(job: HeldJob) -> Outcome:
    assert job.outcome is not None, "only SETTLED jobs reach the finisher"
    return job.outcome
