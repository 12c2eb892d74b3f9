"""The worker's one door to observability: signals, Prometheus metrics, OpenTelemetry spans.

The worker calls these plain functions at its events and knows nothing of
what listens; each fans out to whichever of the three is on. What is on is
decided once, by ``start`` (signal receivers connected, ``--metrics-port``
given, a tracer provider set), and stored in module globals, so that with
everything off each call is a function call and a test of a global: the
worker runs tens of thousands of no-op jobs a second and must not build a
dict or take a lock per job for listeners that are not there.

In a process that never called ``start`` (the web process, ``run_jobs`` in
tests) every function here does nothing.

Call order for one attempt: ``claimed`` (with its claim statement), then in
the child that runs the body ``job_started`` ... ``job_finished`` (signals and
the attempt's span, in the body's process), then in the worker
``body_reported`` (metrics) and, from the finisher, ``outcome_written`` or
``lease_lost``. ``heartbeat`` and ``finish_statement`` are called by their
threads on their own rhythm. A child calls ``start_in_child`` as it starts:
it sends signals and makes spans, and serves no metrics.
"""

import logging
from collections.abc import Iterable
from typing import Any

from leasejobs import conf, signals
from leasejobs.db.rows import one_line
from leasejobs.jobs.context import JobContext
from leasejobs.observability import tracing

logger = logging.getLogger("leasejobs.observe")

# Decided once by ``start``; all off until then.
_metrics: Any = None  # the leasejobs.observability.metrics module when serving metrics
_tracing = False
_send_started = False
_send_finished = False
_send_lease_lost = False

#: The outcome names of ``Outcome.status`` as users read them.
_OUTCOMES = {"done": "done", "queued": "retry", "failed": "failed", "cancelled": "cancelled"}
_COUNTED = {"done": "done", "queued": "retried", "failed": "failed", "cancelled": "cancelled"}


def start(worker_id: str, concurrency: int, metrics_port: int | None = None) -> None:
    """Called once as the worker starts, before any job: decide what is on.

    ``metrics_port`` (``runworker --metrics-port``, else
    ``LEASEJOBS["METRICS_PORT"]``) starts the Prometheus endpoint; it needs
    the ``leasejobs[metrics]`` extra and says so in one sentence if missing.
    """
    global _metrics, _tracing, _send_started, _send_finished, _send_lease_lost
    _send_started = bool(signals.job_started.receivers)
    _send_finished = bool(signals.job_finished.receivers)
    _send_lease_lost = bool(signals.lease_lost.receivers)
    _tracing = tracing.enabled()
    port = metrics_port if metrics_port is not None else conf.get("METRICS_PORT")
    if port is not None:
        try:
            from leasejobs.observability import metrics
        except ImportError:
            raise RuntimeError("metrics need prometheus-client: pip install 'leasejobs[metrics]'") from None
        metrics.serve(int(port), concurrency)
        _metrics = metrics
    logger.info(
        "observability worker=%s metrics=%s tracing=%s signals=%s",
        worker_id,
        f"port {port}" if _metrics else "off",
        "on" if _tracing else "off",
        ",".join(
            name
            for name, on in (
                ("job_started", _send_started),
                ("job_finished", _send_finished),
                ("lease_lost", _send_lease_lost),
            )
            if on
        )
        or "none",
    )


def start_in_child() -> None:
    """Called once in each child that runs bodies: signals and spans, as decided where they are sent."""
    global _tracing, _send_started, _send_finished
    _send_started = bool(signals.job_started.receivers)
    _send_finished = bool(signals.job_finished.receivers)
    _tracing = tracing.enabled()


def claimed(contexts: Iterable[JobContext], seconds: float) -> None:
    """Called after every claim statement (even one that claimed nothing).

    ``contexts``: the attempts it claimed that will run (a generator is fine:
    it is only iterated when metrics are on); ``seconds``: the statement's
    time. Jobs the claim failed outright (no attempts left) are reported
    through ``outcome_written``.
    """
    m = _metrics
    if m is None:
        return
    m.claim_seconds.observe(seconds)
    for ctx in contexts:
        m.child(m.claimed, ctx.queue, ctx.task_name).inc()


def job_started(ctx: JobContext, trace_context: dict[str, str] | None) -> Any:
    """Called in the body's process just before the body, after ``ctx`` is activated.

    ``trace_context``: the job's stored W3C trace context (or None). Returns
    a handle to pass to ``job_finished`` (the attempt's span, or None).
    """
    if _send_started:
        _send(signals.job_started, ctx)
    return tracing.AttemptSpan(ctx, trace_context) if _tracing else None


def job_finished(
    handle: Any, ctx: JobContext, status: str, run_seconds: float, exception: BaseException | None
) -> None:
    """Called in the body's process right after the body returned or raised, once per ``job_started``.

    ``status``: the outcome the attempt asks for, as ``Outcome.status``
    (``done``, ``queued`` for a retry, ``failed``, ``cancelled``) or
    ``lease_lost`` when the body stopped on ``LeaseLost`` (or was stopped);
    ``exception``: what the body raised, or None.
    """
    if handle is None and not _send_finished:
        return
    outcome = _OUTCOMES.get(status, status)
    if handle is not None:
        handle.end(outcome, exception)
    if _send_finished:
        _send(signals.job_finished, ctx, outcome=outcome, exception=exception, run_seconds=run_seconds)


def body_reported(queue: str, task_name: str, waited: float, run_seconds: float, stale_writes: int) -> None:
    """Called in the worker when a child reports a body's end: its queue time at the claim,
    its run time, and the writes its fence refused."""
    if (m := _metrics) is None:
        return
    m.child(m.queue_seconds, queue, task_name).observe(max(0.0, waited))
    m.child(m.run_seconds, queue, task_name).observe(run_seconds)
    if stale_writes:
        m.child(m.stale_writes, queue, task_name).inc(stale_writes)


def bodies_running(count: int) -> None:
    """Called by the worker's pool thread as it looks at its children: bodies running now."""
    if (m := _metrics) is not None:
        m.threads_busy.set(count)


def child_died() -> None:
    """Called when a child died holding jobs (not when it left on its own)."""
    if (m := _metrics) is not None:
        m.child_deaths.inc()


def outcome_written(queue: str, task_name: str, status: str) -> None:
    """Called by the finisher for each outcome its fenced FINISH wrote (``status`` as ``Outcome.status``),
    and by the claim for each job it failed because no attempt was left (``failed``)."""
    if (m := _metrics) is not None:
        m.outcome_child(queue, task_name, _COUNTED.get(status, status)).inc()


def lease_lost(ctx: JobContext, reason: str, *, stale_write: bool = False) -> None:
    """Called once when the worker learns an attempt no longer holds its job.

    From a heartbeat that found the job taken over, a body that stopped on
    ``LeaseLost``, or a finish that matched no row; ``stale_write`` is True
    in that last case (the dropped finish is a stale write the fence refused).
    """
    if (m := _metrics) is not None:
        m.child(m.leases_lost, ctx.queue, ctx.task_name).inc()
        if stale_write:
            m.child(m.stale_writes, ctx.queue, ctx.task_name).inc()
    if _send_lease_lost:
        _send(signals.lease_lost, ctx, reason=reason)


def heartbeat(seconds: float, lag: float) -> None:
    """Called after each heartbeat statement: its time, and how late the tick ran after it was due."""
    if (m := _metrics) is not None:
        m.heartbeat_seconds.observe(seconds)
        m.heartbeat_lag.observe(max(0.0, lag))


def finish_statement(seconds: float) -> None:
    """Called after each FINISH statement with its time."""
    if (m := _metrics) is not None:
        m.finish_seconds.observe(seconds)


def vacuumed(seconds: float) -> None:
    """Called after each VACUUM the worker ran on the job table, with its time."""
    if (m := _metrics) is not None:
        m.vacuum_seconds.observe(seconds)


def _send(signal: Any, ctx: JobContext, **kwargs: Any) -> None:
    """Send ``signal``; a receiver that raises is logged, never passed on."""
    for receiver, result in signal.send_robust(sender=JobContext, ctx=ctx, **kwargs):
        if isinstance(result, Exception):
            logger.error(
                "signal receiver %s raised job=%s attempt=%s worker=%s: %s: %s",
                getattr(receiver, "__qualname__", receiver),
                ctx.job_id,
                ctx.attempt,
                ctx.worker_id,
                type(result).__name__,
                one_line(str(result)),
            )
