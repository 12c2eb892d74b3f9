"""``leasejobs.views.metrics``: the queue-wide Prometheus gauges (extra ``leasejobs[metrics]``).

Mount it where your Prometheus scrapes, and protect it as you would any
internal endpoint (it shows queue names)::

    path("metrics/leasejobs", leasejobs.views.metrics)

One cheap query per scrape (``leasejobs.queues.stats``). The workers' own
counters and histograms are served by each worker (``runworker
--metrics-port``); these gauges are the same whichever process serves them,
so one web process is enough.
"""

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from leasejobs.queues import stats as queuestats


class _Collector:
    """Turns one ``queuestats.read()`` into gauge families."""

    def collect(self) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        stats = queuestats.read()
        jobs = GaugeMetricFamily(
            "leasejobs_queue_jobs",
            "Queued and running jobs, by queue and status.",
            labels=["queue", "status"],
        )
        for (queue, status), n in sorted(stats.jobs.items()):
            jobs.add_metric([queue, status], n)
        oldest = GaugeMetricFamily(
            "leasejobs_queue_oldest_due_age_seconds",
            "Age of the oldest due job not yet claimed, by queue (0 when none is waiting).",
            labels=["queue"],
        )
        expired = GaugeMetricFamily(
            "leasejobs_queue_expired_leases",
            "Running jobs whose lease ran out (worker dead or paused), by queue.",
            labels=["queue"],
        )
        for queue in sorted({q for q, _ in stats.jobs}):
            oldest.add_metric([queue], stats.oldest_due_age.get(queue, 0.0))
            expired.add_metric([queue], stats.expired_leases.get(queue, 0))
        workers = GaugeMetricFamily(
            "leasejobs_live_workers", "Workers whose heartbeat is fresh.", value=stats.live_workers
        )
        return [jobs, oldest, expired, workers]


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """The gauges in the Prometheus text format."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder
    except ImportError:
        return HttpResponse(
            "leasejobs.views.metrics needs prometheus-client: pip install 'leasejobs[metrics]'\n",
            status=501,
            content_type="text/plain",
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    # The format the scraper asks for (text 0.0.4, or OpenMetrics), as the workers' endpoint does.
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)
