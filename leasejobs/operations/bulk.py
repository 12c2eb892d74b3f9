"""Fenced changes to every job a filter matches: ``manage.py leasejobs_jobs
retry|cancel`` and the admin's "retry all N failed jobs matching this filter".

The same rule as the admin actions (``leasejobs.admin.actions``): a job is
changed only while it still has the status and attempt it was matched with.
The matching rows are read (id, status, attempt) in id order, a batch at a
time, and each batch goes to the admin's own statement (``ADMIN_RETRY``,
``ADMIN_CANCEL``), whose WHERE re-checks both: a job claimed, finished or
retried between the read and the write is left alone and counted as
changed since. Each batch commits on its own, so changing a million jobs
holds no lock for long and a worker's finish never waits on the whole run.
"""

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from leasejobs import conf
from leasejobs.db import facade, sql
from leasejobs.models import Job

logger = logging.getLogger("leasejobs.bulk")

#: Jobs per statement (and per transaction).
BATCH = 1000


@dataclass(frozen=True)
class Change:
    """One fenced change: its statement, the statuses it applies to, and its wording."""

    statement: str
    eligible: frozenset[str]
    notifies: bool
    verb: str


CHANGES = {
    "retry": Change(
        sql.ADMIN_RETRY,
        frozenset({Job.Status.QUEUED, Job.Status.FAILED, Job.Status.CANCELLED}),
        notifies=True,
        verb="retried",
    ),
    "cancel": Change(
        sql.ADMIN_CANCEL, frozenset({Job.Status.QUEUED, Job.Status.RUNNING}), notifies=True, verb="cancelled"
    ),
}


@dataclass
class Changed:
    """How many jobs matched, and the rows of those changed: (id, attempt, worker, ...)."""

    matched: int = 0
    changed: list[tuple] = field(default_factory=list)

    @property
    def moved_on(self) -> int:
        """Matched jobs left alone: they changed between the read and the write."""
        return self.matched - len(self.changed)


def eligible(action: str, jobs: QuerySet[Job]) -> QuerySet[Job]:
    """The jobs of ``jobs`` that ``action`` applies to (a retry never touches a running job)."""
    return jobs.filter(status__in=CHANGES[action].eligible)


def apply(action: str, jobs: QuerySet[Job], by: str, batch: int = BATCH) -> Changed:
    """Retry or cancel every eligible job of ``jobs``, each fenced on the state it was read in.

    ``by`` names who asked (a user, the command), for the log line of each job.
    """
    change = CHANGES[action]
    outcome = Changed()
    last_id = 0
    while True:
        rows = list(
            eligible(action, jobs)
            .filter(pk__gt=last_id)
            .order_by("pk")
            .values_list("pk", "status", "attempt")[:batch]
        )
        if not rows:
            return outcome
        last_id = rows[-1][0]
        params: dict[str, Any] = {
            "ids": [r[0] for r in rows],
            "statuses": [r[1] for r in rows],
            "attempts": [r[2] for r in rows],
        }
        if change.notifies:
            params["channel"] = conf.get("NOTIFY_CHANNEL")
        changed = facade.bulk_change(change.statement, params)
        outcome.matched += len(rows)
        outcome.changed.extend(changed)
        for job_id, attempt, worker, *_ in changed:
            logger.info(
                "bulk %s job=%s attempt=%s worker=%s by=%s", change.verb, job_id, attempt, worker or "-", by
            )
