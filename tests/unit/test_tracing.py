"""OpenTelemetry: a web request that enqueues and the worker's attempts are one trace.

The test process records its spans with the SDK's in-memory exporter (the
request's server span from the Django instrumentation, and the enqueue's
PRODUCER span); the worker process writes its spans to a file
(``LEASEJOBS_TEST_SPANS``, see ``tests/testapp/observability.py``).
"""

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from leasejobs.models import Job

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """This process's finished spans. The global provider can be set once per process: here."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    _exporter.clear()
    yield _exporter
    DjangoInstrumentor().uninstrument()


@pytest.mark.django_db
def test_a_bulk_enqueue_is_one_send_span_whose_context_every_job_keeps(spans):
    from tests.testapp.tasks import add

    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        jobs = add.bulk_enqueue([((i, 1), {}) for i in range(3)])
    (send,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.PRODUCER]
    assert send.name == "send default" and send.parent.span_id == request.get_span_context().span_id
    assert send.attributes["messaging.batch.message_count"] == 3
    stored = {j.trace_context["traceparent"] for j in Job.objects.filter(id__in=[j.id for j in jobs])}
    assert len(stored) == 1 and stored.pop().split("-")[2] == f"{send.context.span_id:016x}"


@pytest.mark.django_db
def test_opentelemetry_false_makes_no_span_and_stores_no_context(spans, settings):
    from tests.testapp.tasks import add

    settings.LEASEJOBS = {**settings.LEASEJOBS, "OPENTELEMETRY": False}
    job = add.enqueue(1, 2)
    assert spans.get_finished_spans() == ()
    assert Job.objects.get(id=job.id).trace_context is None
