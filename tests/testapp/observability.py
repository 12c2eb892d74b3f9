"""Test-only hooks a worker process turns on through its environment.

- ``LEASEJOBS_TEST_SPANS=<file>``: an OpenTelemetry SDK tracer provider that
  writes every finished span to ``<file>``, one JSON object per line, so a
  test can read the worker's spans (the in-memory exporter only sees its own
  process).
- ``LEASEJOBS_TEST_SIGNALS=<file>``: receivers of the three worker signals
  that append what they got to ``<file>`` and then raise, to show that a
  failing receiver never breaks the worker.
"""

import json
import os
from pathlib import Path
from typing import Any


def install() -> None:
    """Called from the test app's ``ready``: turn on what the environment asks for."""
    if spans := os.environ.get("LEASEJOBS_TEST_SPANS"):
        _export_spans_to(Path(spans))
    if signals_file := os.environ.get("LEASEJOBS_TEST_SIGNALS"):
        _connect_raising_receivers(Path(signals_file))


def _export_spans_to(path: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = path.open("a", buffering=1)  # line-buffered: each span is on disk once ended
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n"))
    )
    trace.set_tracer_provider(provider)


def _connect_raising_receivers(path: Path) -> None:
    from leasejobs import signals

    def receiver(name: str) -> Any:
        def receive(sender: Any, ctx: Any, **kwargs: Any) -> None:
            entry = {"signal": name, "job": ctx.job_id, "attempt": ctx.attempt, "queue": ctx.queue}
            entry.update({k: v for k, v in kwargs.items() if k in ("outcome", "reason")})
            if kwargs.get("exception") is not None:
                entry["exception"] = type(kwargs["exception"]).__name__
            with path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            raise RuntimeError(f"receiver of {name} fails on purpose")

        receive.__qualname__ = f"raising_{name}_receiver"
        return receive

    for name in ("job_started", "job_finished", "lease_lost"):
        getattr(signals, name).connect(receiver(name), weak=False)
