"""OpenTelemetry spans for enqueue and for each attempt (extra ``leasejobs[otel]``).

Follows the messaging semantic conventions: the enqueue is a PRODUCER span
``send <queue>`` (``messaging.operation.type = send``), each attempt a
CONSUMER span ``process <queue>`` (``process``), both with
``messaging.system = leasejobs``, ``messaging.destination.name`` (the
queue) and ``messaging.message.id`` (the job id).

The enqueue span's W3C trace context (``traceparent``, ``tracestate``) is
stored in the job's ``trace_context`` column, so every attempt is a child
of it: the request that enqueued the job, the enqueue and all its attempts
(retries and takeovers included, each with ``leasejobs.attempt``) are one
trace. A job enqueued outside any trace starts a trace of its own at its
enqueue.

Spans are made only when ``opentelemetry-api`` is importable, a tracer
provider has been set (the API's default does nothing and would only cost
time) and ``LEASEJOBS["OPENTELEMETRY"]`` is not False.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from leasejobs import conf

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]

SYSTEM = "leasejobs"


def enabled() -> bool:
    """Whether spans are worth making now (see the module docstring)."""
    if trace is None or conf.get("OPENTELEMETRY") is False:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer() -> Any:
    return trace.get_tracer("leasejobs")


@contextmanager
def enqueue_span(queue: str, count: int) -> Iterator[tuple[Any, dict[str, str]]]:
    """A ``send <queue>`` span around an insert; yields it and the carrier to store."""
    attributes: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with _tracer().start_as_current_span(
        f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield span, carrier


def set_message_ids(span: Any, ids: list[int]) -> None:
    """Name the job(s) the enqueue made, once their ids are known."""
    if len(ids) == 1:
        span.set_attribute("messaging.message.id", str(ids[0]))


class AttemptSpan:
    """The span of one attempt, current in the body's process while the body runs."""

    __slots__ = ("span", "token")

    def __init__(self, ctx: Any, trace_context: dict[str, str] | None) -> None:
        parent = propagate.extract(trace_context) if trace_context else None
        self.span = _tracer().start_span(
            f"process {ctx.queue}",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": ctx.queue,
                "messaging.message.id": str(ctx.job_id),
                "leasejobs.task": ctx.task_name,
                "leasejobs.attempt": ctx.attempt,
                "leasejobs.worker_id": ctx.worker_id,
            },
        )
        self.token = otel_context.attach(trace.set_span_in_context(self.span))

    def end(self, outcome: str, exception: BaseException | None) -> None:
        """End the span with the attempt's outcome; an exception marks it as an error."""
        otel_context.detach(self.token)
        self.span.set_attribute("leasejobs.outcome", outcome)
        if exception is not None:
            self.span.record_exception(exception)
            self.span.set_status(trace.StatusCode.ERROR, f"{type(exception).__name__}: {exception}")
        self.span.end()
