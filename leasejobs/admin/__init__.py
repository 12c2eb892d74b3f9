"""The Django admin of leasejobs, for an operator asking: what is running, who
holds it, is it stuck, what has it already done?

- ``jobs``: the job changelist (lease state at a glance, filters, search,
  readable at 1280 px) and read-only job and side-effect pages;
- ``job_page``: what a job's page shows, in the order an operator asks
  (the failure first, times and durations, the attempts and why each ended);
- ``actions``: retry now, cancel, release lease, each fenced on the state the
  operator saw, a healthy lease released only after a question;
- ``page_actions``: the same actions as buttons on a job's page;
- ``overview``: workers, stuck jobs, jobs by queue and status, leases,
  throughput, the controlled queues, then the charts;
- ``queues``: the Queues page: every queue with jobs, paused or limited or
  not, with its Pause/Resume and Limit controls;
- ``periodic``: the periodic schedules, with links to their jobs;
- ``workflows``: a workflow's page: its graph as SVG, counts, timings and
  the path that failed, with a button that cancels it;
- ``lease``, ``filters``, ``paginator``: the pieces that keep all of it
  correct (database clock) and cheap (no full-table count) on a big table.

See docs/admin.md.
"""

from leasejobs.admin.jobs import JobAdmin, SideEffectAdmin
from leasejobs.admin.overview import OverviewAdmin
from leasejobs.admin.periodic import PeriodicScheduleAdmin
from leasejobs.admin.queues import QueueAdmin
from leasejobs.admin.workflows import WorkflowAdmin

__all__ = [
    "JobAdmin",
    "OverviewAdmin",
    "PeriodicScheduleAdmin",
    "QueueAdmin",
    "SideEffectAdmin",
    "WorkflowAdmin",
]
