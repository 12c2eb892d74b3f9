"""The integration half of tests/unit/test_tracing.py: its tests that start workers or commit."""

import json

from django.test import Client
from opentelemetry.trace import SpanKind

from leasejobs.models import Job
from tests.helpers import wait_until
from tests.unit.test_tracing import spans  # noqa: F401 (a fixture, shared with the unit half)


def test_a_request_that_enqueues_and_the_attempts_that_run_it_are_one_trace(spans, start_worker, tmp_path):  # noqa: F811
    response = Client().get("/test/enqueue")
    assert response.status_code == 200
    add_id, flaky_id = response.json()["ids"]

    local = spans.get_finished_spans()
    (server,) = [s for s in local if s.kind == SpanKind.SERVER]
    sends = [s for s in local if s.kind == SpanKind.PRODUCER]
    assert [s.name for s in sends] == ["send default", "send default"]
    trace_id = server.context.trace_id
    for send, job_id in zip(sends, (add_id, flaky_id), strict=True):
        assert send.context.trace_id == trace_id
        assert send.parent.span_id == server.context.span_id
        assert send.attributes["messaging.system"] == "leasejobs"
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.destination.name"] == "default"
        assert send.attributes["messaging.message.id"] == str(job_id)
        stored = Job.objects.get(id=job_id).trace_context
        assert stored["traceparent"].startswith(f"00-{trace_id:032x}-{send.context.span_id:016x}-")

    exported = tmp_path / "worker-spans.jsonl"
    worker = start_worker("--heartbeat", "0.5", "--lease", "3", env={"LEASEJOBS_TEST_SPANS": str(exported)})
    both = Job.objects.filter(id__in=[add_id, flaky_id], status="done")
    wait_until(lambda: both.count() == 2, 60, what="jobs done")

    def process_spans() -> list[dict]:
        if not exported.exists():
            return []
        found = [json.loads(line) for line in exported.read_text().splitlines()]
        return found if len(found) >= 3 else []

    found = wait_until(process_spans, 20, what="three process spans in the worker's file")
    assert all(s["name"] == "process default" and s["kind"] == "SpanKind.CONSUMER" for s in found)
    assert {s["context"]["trace_id"] for s in found} == {f"0x{trace_id:032x}"}
    by_job = {}
    for s in found:
        by_job.setdefault(s["attributes"]["messaging.message.id"], []).append(s)
    (run,) = by_job[str(add_id)]
    assert run["parent_id"] == f"0x{sends[0].context.span_id:016x}"
    assert run["attributes"]["leasejobs.outcome"] == "done"
    assert run["attributes"]["messaging.operation.type"] == "process"
    assert run["attributes"]["leasejobs.worker_id"] in worker.log()
    # The retry is a sibling of its failed first attempt, under the same enqueue.
    attempts = sorted(by_job[str(flaky_id)], key=lambda s: s["attributes"]["leasejobs.attempt"])
    assert [a["attributes"]["leasejobs.attempt"] for a in attempts] == [1, 2]
    assert {a["parent_id"] for a in attempts} == {f"0x{sends[1].context.span_id:016x}"}
    assert attempts[0]["status"]["status_code"] == "ERROR"
    assert attempts[0]["attributes"]["leasejobs.outcome"] == "retry"
    assert attempts[0]["events"][0]["name"] == "exception"
    assert attempts[1]["attributes"]["leasejobs.outcome"] == "done"
