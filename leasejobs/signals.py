"""Signals the worker sends, for integrations (Sentry, audit logs, metrics of your own).

Each is sent with ``sender=JobContext`` (the class) and the attempt's ``ctx``
(a ``leasejobs.jobs.context.JobContext``: ``job_id``, ``attempt``, ``worker_id``,
``task_name``, ``queue``). They are sent through ``Signal.send_robust``: a
receiver that raises is logged (``leasejobs.signals``, with the job, attempt
and worker) and the worker goes on; it can never fail, retry or stall a job.

Receivers run in the worker's threads, inline: keep them quick. The worker
looks for receivers once, when it starts (``leasejobs.observability.observe.start``), so
connect them at import time (an ``AppConfig.ready`` or a module the worker
imports, such as your ``tasks`` module); one connected later is not called.
"""

from django.dispatch import Signal

#: Sent in the body's process (a worker's child) just before the body runs: ``ctx``.
job_started = Signal()

#: Sent in the body's process right after the body returned or raised: ``ctx``,
#: ``outcome`` (``"done"``, ``"retry"``, ``"failed"``, ``"cancelled"`` or
#: ``"lease_lost"``: the outcome the attempt asks for; a stale one is still
#: dropped by the fenced finish, which then sends ``lease_lost``),
#: ``exception`` (what the body raised, or None) and ``run_seconds``.
job_finished = Signal()

#: Sent when the worker learns that an attempt no longer holds its job (a
#: heartbeat or finish matched no row, or a fence check raised ``LeaseLost``):
#: ``ctx`` and ``reason`` (one sentence).
lease_lost = Signal()
