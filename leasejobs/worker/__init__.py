"""The leasejobs worker, one part per concern.

- ``options``: what ``runworker`` passes in;
- ``held``: the table of held jobs, keyed by attempt, with explicit phases;
- ``rules``: prefetch sizing, heartbeat interval, retry delay, timeouts, run counting (pure);
- ``claimer``: the claim loop and the prefetch buffer;
- ``runners``: the threads that run bodies; ``outcomes``: what an attempt's end becomes;
- ``heartbeat``: heartbeats and timeouts;
- ``finisher`` on ``batcher``: outcomes written in batches;
- ``listener``: NOTIFY wake-ups; ``shutdown``: the stop phases;
- ``events``: every log line;
- ``worker``: wires them together and supervises the threads.
The statements they run are behind ``leasejobs.store``.
"""

from leasejobs.worker.options import WorkerOptions, default_worker_id
from leasejobs.worker.worker import Worker

__all__ = ["Worker", "WorkerOptions", "default_worker_id"]
