"""Everything the worker reports, one method per event, one log line each.

Each method also tells ``leasejobs.observability.observe`` (signals, metrics, traces), so
this module is the worker's one place of reporting.

Every line names the job, the attempt and the worker. Text that comes from a
job (an exception's message, a task or queue name) is escaped to one line
first: a newline in it must not forge another log line.

Levels: a line per successful job ("claimed", "done") is DEBUG (``runworker
-v 2``): at thousands of jobs a second it would cost a third of the
throughput, and it says nothing an operator acts on; so is a heartbeat that
skipped a row its own body's side-effect block holds. Start, stop, cancels
and releases are INFO (the default); retries, lost leases, timeouts, stopped
bodies and stale writes WARNING; failures and children that died ERROR.
"""

import logging

from leasejobs.db.rows import one_line
from leasejobs.db.store import Outcome
from leasejobs.observability import observe
from leasejobs.worker.held import HeldJob

logger = logging.getLogger("leasejobs.worker")


class Events:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def _ids(self, job: HeldJob) -> tuple[int, int, str]:
        return job.key.id, job.key.attempt, self.worker_id

    # -- life cycle ------------------------------------------------------------

    def started(self, description: str) -> None:
        logger.info("worker started worker=%s %s", self.worker_id, description)

    def queue_unused(self, queue: str, used: list[str]) -> None:
        logger.warning(
            "--queue %s worker=%s: no task uses it (no registered task has it as its queue; the tasks' "
            "queues are %s): check its spelling, or enqueue to it with .using(queue=%r)",
            one_line(queue),
            self.worker_id,
            one_line(", ".join(used) or "none"),
            queue,
        )

    def working(self, seconds: float, counts: dict[str, int], running: int) -> None:
        """The summary of the last interval, while the worker works (INFO: seen at the default level)."""
        logger.info(
            "worker working worker=%s in the last %.0f s: %s running=%d",
            self.worker_id,
            seconds,
            " ".join(f"{name}={n}" for name, n in counts.items()),
            running,
        )

    def retries_pending(self, count: int, next_in: float, waiting: bool) -> None:
        logger.info(
            "%d job(s) of this worker's queues wait for a retry or a snooze, the next due in %.1f s "
            "worker=%s: %s",
            count,
            next_in,
            self.worker_id,
            "waiting for them (--wait-for-retries)"
            if waiting
            else "exiting without them; runworker --burst --wait-for-retries waits",
        )

    def stopping(self, grace: float, running: int) -> None:
        logger.info(
            "stopping worker=%s: no new claims, %.0f s grace for %d running job(s)",
            self.worker_id,
            grace,
            running,
        )

    def stop_now(self) -> None:
        logger.warning("second stop signal: giving leases back now worker=%s", self.worker_id)

    def stopped(self, counts: dict[str, int]) -> None:
        logger.info(
            "worker stopped worker=%s %s",
            self.worker_id,
            " ".join(f"{name}={n}" for name, n in counts.items()),
        )

    def exiting(self, why: str) -> None:
        logger.info("%s worker=%s", why, self.worker_id)

    def thread_died(self, thread: str, exc: BaseException) -> None:
        logger.critical(
            "thread %s died worker=%s: %s; the worker exits so that its supervisor restarts it "
            "(its leases run out and other workers take its jobs over)",
            thread,
            self.worker_id,
            describe(exc),
            exc_info=exc,
        )

    # -- claiming --------------------------------------------------------------

    def claimed(self, jobs: list[HeldJob], seconds: float) -> None:
        """One claim statement: ``jobs`` it handed to the children, in ``seconds``.

        The per-job DEBUG lines are built only when DEBUG is on: escaping
        their names for nothing cost more than the claim's own Python.
        """
        observe.claimed((j.ctx for j in jobs), seconds)
        if not logger.isEnabledFor(logging.DEBUG):
            return
        for job in jobs:
            logger.debug(
                "claimed job=%s attempt=%s worker=%s task=%s queue=%s",
                *self._ids(job),
                one_line(job.task_name),
                one_line(job.queue),
            )

    def ended_at_claim(
        self, job_id: int, attempt: int, status: str, error: str, queue: str, task: str
    ) -> None:
        observe.outcome_written(queue, task, status)
        log = logger.error if status == "failed" else logger.info
        log("%s job=%s attempt=%s worker=%s: %s", status, job_id, attempt, self.worker_id, one_line(error))

    def claim_failed(self, exc: BaseException) -> None:
        logger.warning("claim failed worker=%s: %s", self.worker_id, describe(exc))

    def front_look_failed(self, exc: BaseException) -> None:
        logger.warning(
            "front look failed worker=%s: %s; claims go on from their keys", self.worker_id, describe(exc)
        )

    # -- running ---------------------------------------------------------------

    def cancel_requested(self, job: HeldJob) -> None:
        logger.info("cancel requested job=%s attempt=%s worker=%s", *self._ids(job))

    def body_stopped(self, job: HeldJob, why: str, seconds: float | None) -> None:
        how = "its process was killed" if seconds is None else f"after {seconds:.1f}s"
        logger.warning(
            "body stopped job=%s attempt=%s worker=%s (%s): %s", *self._ids(job), how, one_line(why)
        )

    def child_died(self, index: int, pid: int, how: str, jobs: int, replaced: bool) -> None:
        logger.error(
            "child %d (pid %d) %s worker=%s holding %d job(s)%s",
            index,
            pid,
            how,
            self.worker_id,
            jobs,
            "; a fresh child takes its place" if replaced else "",
        )

    def child_left(self, index: int, pid: int, why: str) -> None:
        logger.info(
            "child %d (pid %d) left worker=%s: %s; a fresh child takes its place",
            index,
            pid,
            self.worker_id,
            one_line(why),
        )

    def timeout(self, job: HeldJob, error: str) -> None:
        logger.warning("timeout job=%s attempt=%s worker=%s: %s", *self._ids(job), one_line(error))

    # -- finishing -------------------------------------------------------------

    def outcome(self, job: HeldJob, outcome: Outcome) -> None:
        observe.outcome_written(job.queue, job.task_name, outcome.status)
        if outcome.status == "done":  # most outcomes: a line only at DEBUG, built only then
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("done job=%s attempt=%s worker=%s", *self._ids(job))
            return
        ids = self._ids(job)
        if outcome.snoozed:
            logger.info("snoozed job=%s attempt=%s worker=%s for %.1fs", *ids, outcome.retry_delay)
        elif outcome.suspended:
            logger.info("suspended job=%s attempt=%s worker=%s: a durable sleep or wait", *ids)
        elif outcome.status == "queued":
            logger.warning(
                "retry job=%s attempt=%s worker=%s in %.1fs: %s",
                *ids,
                outcome.retry_delay,
                one_line(outcome.last_error or ""),
            )
        elif outcome.status == "failed":
            logger.error("failed job=%s attempt=%s worker=%s: %s", *ids, one_line(outcome.last_error or ""))
        elif outcome.status == "cancelled":
            logger.info("cancelled job=%s attempt=%s worker=%s", *ids)

    def lease_lost(self, job: HeldJob, why: str, *, stale_write: bool = False) -> None:
        """``stale_write``: the worker's own finish was refused by the fence."""
        observe.lease_lost(job.ctx, why, stale_write=stale_write)
        logger.warning("lease lost job=%s attempt=%s worker=%s: %s", *self._ids(job), why)

    def finish_statement(self, seconds: float) -> None:
        observe.finish_statement(seconds)

    def heartbeat_statement(self, seconds: float, lag: float) -> None:
        observe.heartbeat(seconds, lag)

    def liveness_failed(self, exc: BaseException) -> None:
        logger.warning("liveness row not refreshed worker=%s: %s", self.worker_id, describe(exc))

    def finish_locked(self, job: HeldJob) -> None:
        logger.warning(
            "finish skipped job=%s attempt=%s worker=%s: row locked by another transaction; retrying",
            *self._ids(job),
        )

    def finish_failed(self, n: int, exc: BaseException) -> None:
        logger.warning(
            "finish failed for %d job(s) worker=%s: %s; retrying", n, self.worker_id, describe(exc)
        )

    def outcome_unstorable(self, job: HeldJob, exc: BaseException) -> None:
        logger.error(
            "outcome not storable job=%s attempt=%s worker=%s: %s; the job fails with that error",
            *self._ids(job),
            describe(exc),
        )

    def outcome_lost(self, job: HeldJob, exc: BaseException) -> None:
        logger.error(
            "outcome not written job=%s attempt=%s worker=%s: %s; its lease runs out and the job is retried",
            *self._ids(job),
            describe(exc),
        )

    def gave_up_finishing(self, n: int) -> None:
        logger.warning(
            "gave up finishing %d job(s) worker=%s: their rows stay locked or the database is away; "
            "their leases run out on their own",
            n,
            self.worker_id,
        )

    # -- heartbeats ------------------------------------------------------------

    def heartbeat_failed(self, n: int, exc: BaseException) -> None:
        logger.warning("heartbeat failed worker=%s jobs=%d: %s", self.worker_id, n, describe(exc))

    def heartbeat_skipped(self, job: HeldJob) -> None:
        logger.debug(
            "heartbeat skipped job=%s attempt=%s worker=%s: row locked by another transaction",
            *self._ids(job),
        )

    def heartbeat_clamped(self, task_name: str, lease: float, interval: float) -> None:
        logger.warning(
            "heartbeat clamped worker=%s task=%s: its lease is %gs, so its jobs are heartbeated every %gs, "
            "not every --heartbeat",
            self.worker_id,
            one_line(task_name),
            lease,
            interval,
        )

    # -- listening and giving back ---------------------------------------------

    def queue_settings_not_written(self, exc: BaseException) -> None:
        logger.warning(
            "LEASEJOBS['QUEUES'] differs from the queue table, but this worker's role may not write it "
            "(run `manage.py leasejobs_queue sync` as the table's owner) worker=%s: %s",
            self.worker_id,
            describe(exc),
        )

    def listener_lost(self, exc: BaseException) -> None:
        logger.warning("listener lost worker=%s: %s; polling until it is back", self.worker_id, describe(exc))

    def released(self, job: HeldJob, ok: bool) -> None:
        if ok:
            logger.info(
                "released job=%s attempt=%s worker=%s%s",
                *self._ids(job),
                ": its body had started, so its run counts" if job.started and job.counted else "",
            )
        else:
            logger.warning(
                "lease not given back job=%s attempt=%s worker=%s: its row is locked by another "
                "transaction or the job moved on; the lease runs out on its own",
                *self._ids(job),
            )

    def give_back_later(self, job: HeldJob) -> None:
        logger.warning(
            "lease not given back yet job=%s attempt=%s worker=%s: its row is locked by another "
            "transaction; trying again until its lease runs out",
            *self._ids(job),
        )

    def give_back_moot(self, job: HeldJob) -> None:
        logger.info(
            "give-back dropped job=%s attempt=%s worker=%s: the job moved on (released or ended by "
            "another) while its row was locked",
            *self._ids(job),
        )

    def left_to_its_lease(self, job: HeldJob) -> None:
        logger.warning(
            "lease kept job=%s attempt=%s worker=%s: its body is not known to have stopped, "
            "so the job is claimable again only once the lease runs out",
            *self._ids(job),
        )

    def release_retried(self, n: int, exc: BaseException) -> None:
        logger.warning(
            "could not give back %d lease(s) worker=%s: %s; trying again until their leases run out",
            n,
            self.worker_id,
            describe(exc),
        )

    def release_failed(self, n: int, exc: BaseException) -> None:
        logger.warning(
            "could not give back %d lease(s) worker=%s: %s; they expire on their own",
            n,
            self.worker_id,
            describe(exc),
        )

    # -- vacuum ----------------------------------------------------------------

    def vacuumed(self, seconds: float, dead_before: int, dead_after: int | None) -> None:
        observe.vacuumed(seconds)
        logger.info(
            "vacuumed leasejobs_job worker=%s: %d dead row versions before, %s after, in %.2f s",
            self.worker_id,
            dead_before,
            "unknown" if dead_after is None else dead_after,
            seconds,
        )

    def vacuum_off(self, why: str) -> None:
        logger.info("this worker does not vacuum leasejobs_job worker=%s: %s", self.worker_id, one_line(why))

    def vacuum_look_failed(self, exc: BaseException) -> None:
        logger.warning(
            "vacuum thread cannot read the job table's statistics worker=%s: %s; it looks again every second",
            self.worker_id,
            describe(exc),
        )

    def charts_stored(self, buckets: int, seconds: float) -> None:
        logger.debug(
            "stored %d closed buckets of the overview's charts worker=%s in %.0f ms",
            buckets,
            self.worker_id,
            seconds * 1000,
        )

    def charts_off(self, why: str) -> None:
        logger.info(
            "this worker does not store the overview charts' closed buckets worker=%s: %s; "
            "the overview computes those it finds missing",
            self.worker_id,
            one_line(why),
        )

    def charts_not_stored(self, exc: BaseException, retry_seconds: float) -> None:
        logger.warning(
            "cannot store the overview charts' closed buckets worker=%s: %s; trying again in %.0f s",
            self.worker_id,
            describe(exc),
            retry_seconds,
        )

    def vacuum_skipped(self) -> None:
        logger.debug("vacuum skipped worker=%s: leasejobs_job is being vacuumed already", self.worker_id)

    def vacuum_warned(self, message: str) -> None:
        logger.warning(
            "VACUUM of leasejobs_job worker=%s: PostgreSQL warned: %s", self.worker_id, one_line(message)
        )

    def vacuum_failed(self, exc: BaseException, retry_in: float) -> None:
        logger.warning(
            "vacuum failed worker=%s: %s; the next in %.0f s at the earliest",
            self.worker_id,
            describe(exc),
            retry_in,
        )


def describe(exc: BaseException) -> str:
    """``Class: first line of the message``, on one line (even when ``str(exc)`` raises)."""
    try:
        text = str(exc).strip().splitlines()
    except Exception:
        text = ["<the exception's message could not be read>"]
    return one_line(f"{type(exc).__name__}: {text[0] if text else ''}")
