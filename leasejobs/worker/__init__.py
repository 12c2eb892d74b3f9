"""The leasejobs worker, one part per concern.

- ``options``: what ``runworker`` passes in;
- ``held``: the table of held jobs, keyed by attempt, with explicit phases;
- ``rules``: the children's queue depth, claim size, heartbeat interval, timeouts (pure);
- ``claimer``: the claim loop;
- ``zygote``: the fork server of the children and the watchdog of their leases;
- ``slots``: what the worker, the zygote and the children share in memory;
- ``channel``, ``messages``: how the worker and a child talk;
- ``pool``: the worker's side of its children (jobs out, ends in, timeouts, stops, deaths);
- ``child``: a child process's loop; ``body``: one body, run the same way by
  children and ``leasejobs.testing``; ``outcomes``: what an attempt's end becomes;
- ``heartbeat``: heartbeats;
- ``finisher`` on ``batcher``: outcomes written in batches;
- ``listener``: NOTIFY wake-ups; ``shutdown``: the stop phases;
- ``events``: every log line;
- ``worker``: wires them together and supervises the threads.
The statements they run are behind ``leasejobs.db.store``.
"""

from leasejobs.worker.options import WorkerOptions, default_worker_id
from leasejobs.worker.worker import Worker

__all__ = ["Worker", "WorkerOptions", "default_worker_id"]
