"""The ``LEASEJOBS`` setting, with its defaults.

Read at call time (not import time) so ``override_settings`` works in tests.
Unknown keys are reported by the system check ``leasejobs.E002`` (see
``leasejobs.checks``), once at start-up, not on every enqueue.
"""

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # How long a claim holds a job before another worker may take it over.
    "LEASE_SECONDS": 30,
    # Claims a job may have before a failure (or an expired lease) is final.
    "MAX_ATTEMPTS": 5,
    # Retry delay: RETRY_BACKOFF_SECONDS * 2**(attempt-1), jittered, capped.
    "RETRY_BACKOFF_SECONDS": 2.0,
    "RETRY_BACKOFF_MAX_SECONDS": 3600.0,
    # Extra modules to import for tasks, besides the ``tasks`` module of each app.
    "TASK_MODULES": [],
    # Encoded args + kwargs larger than this are refused at enqueue.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # How often an idle worker looks for due jobs when no NOTIFY arrives
    # (delayed jobs and retries become due without a notification).
    "POLL_INTERVAL_SECONDS": 1.0,
    # The LISTEN/NOTIFY channel that wakes workers on enqueue.
    "NOTIFY_CHANNEL": "leasejobs",
    # Most jobs a worker claims ahead of its free runner slots (runworker
    # --prefetch). The worker shrinks it as jobs get slower, so that a
    # buffered job starts within 0.1 s (and a tenth of its lease): 1000 only
    # for jobs of 0.4 ms or less at concurrency 4. 0 claims free slots only.
    "PREFETCH": 1000,
    # Default limits per queue, across all workers (docs/queue-controls.md):
    # {"pdf": {"concurrency": 2}, "email": {"rate": "100/m"}}. Limits changed
    # at run time (admin, leasejobs.set_limits) win over these.
    "QUEUES": {},
}


def get(name: str) -> Any:
    """Return one LEASEJOBS setting, falling back to its default."""
    user = getattr(settings, "LEASEJOBS", None) or {}
    return user.get(name, DEFAULTS[name])


def unknown_keys() -> list[str]:
    """Keys of LEASEJOBS that leasejobs does not know (typos, most likely)."""
    return sorted(set(getattr(settings, "LEASEJOBS", None) or {}) - set(DEFAULTS))
