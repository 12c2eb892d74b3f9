"""The Django admin of leasejobs, for an operator asking: what is running, who
holds it, is it stuck, what has it already done?

- ``jobs``: the job changelist (lease state at a glance, filters, search) and
  read-only job and side-effect pages;
- ``actions``: retry now, cancel, release lease, each fenced on the state the
  operator saw;
- ``overview``: jobs by queue and status, leases, workers, throughput, and
  the queue controls (paused, limits, places in use, rate used);
- ``queues``: pause and resume queues, change their limits at run time;
- ``periodic``: the periodic schedules, with links to their jobs;
- ``lease``, ``filters``, ``paginator``: the pieces that keep all of it
  correct (database clock) and cheap (no full-table count) on a big table.

See docs/admin.md.
"""

from leasejobs.admin.jobs import JobAdmin, SideEffectAdmin
from leasejobs.admin.overview import OverviewAdmin
from leasejobs.admin.periodic import PeriodicScheduleAdmin
from leasejobs.admin.queues import QueueAdmin

__all__ = ["JobAdmin", "OverviewAdmin", "PeriodicScheduleAdmin", "QueueAdmin", "SideEffectAdmin"]
