"""``manage.py leasejobs_jobs list|retry|cancel``: find jobs by filter, change them fenced.

``list`` prints the matching jobs; ``retry`` and ``cancel`` change every
matching job the way the admin actions do, each fenced on the status and
attempt it was matched with (see ``leasejobs.operations.bulk``): a job a worker claimed
or finished meanwhile is left alone and counted. ``--dry-run`` prints how
many jobs would change and changes nothing. ``--workflow ID`` matches the
jobs of one workflow; ``cancel --workflow ID`` with no ``--status`` cancels
every unfinished job of it, running ones through a cancel request (what
``leasejobs.cancel_workflow`` does).
"""

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet
from django.db.models.functions import Now

from leasejobs.management.arguments import duration, positive_int, refusing
from leasejobs.models import Job
from leasejobs.operations import bulk

#: What ``retry`` and ``cancel`` change when no --status is given.
DEFAULT_STATUS: dict[str, list[str]] = {"retry": [Job.Status.FAILED], "cancel": [Job.Status.QUEUED]}


@refusing("a job status", f"{', '.join(Job.Status.values)}, or several with commas")
def statuses(text: str) -> list[str]:
    """A comma-separated list of job statuses."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(names) - set(Job.Status.values))
    if not names or unknown:
        raise ValueError(text)
    return names


#: The first line of ``list``: the columns, tab-separated like the rows.
HEADER = "id\tstatus\tattempt\tqueue\ttask\tcreated (UTC)\tlast error"


class Command(BaseCommand):
    help = (
        "List, retry or cancel the jobs matching filters. retry and cancel are fenced like the admin "
        "actions: a job that changed since it was matched is left alone. --dry-run only counts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "retry", "cancel"])
        parser.add_argument(
            "--status",
            type=statuses,
            metavar="STATUS",
            help="queued, running, done, failed, cancelled; several with commas. "
            "Default: all for list, failed for retry, queued for cancel.",
        )
        parser.add_argument("--task", help="The exact task name.")
        parser.add_argument("--queue", help="The queue name.")
        parser.add_argument(
            "--older-than", type=duration, metavar="AGE", help="Created longer ago than this: 7d, 12h, 30m."
        )
        parser.add_argument(
            "--newer-than", type=duration, metavar="AGE", help="Created within this: 7d, 12h, 30m."
        )
        parser.add_argument("--error", metavar="TEXT", help="The last error contains TEXT (any case).")
        parser.add_argument(
            "--workflow",
            type=positive_int,
            metavar="ID",
            help="The jobs of this workflow (cancel: queued and running ones unless --status is given).",
        )
        parser.add_argument(
            "--all", action="store_true", help="retry/cancel: allow no filter but the default status."
        )
        parser.add_argument("--dry-run", action="store_true", help="Print how many jobs would change.")
        parser.add_argument(
            "--limit", type=positive_int, default=100, metavar="N", help="list: at most N jobs (100)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        narrowed = any(
            options[k] is not None
            for k in ("status", "task", "queue", "older_than", "newer_than", "error", "workflow")
        )
        if action != "list" and not narrowed and not options["all"]:
            raise CommandError(
                f"{action} changes every {DEFAULT_STATUS[action][0]} job when no filter is given; "
                "give a filter (--status, --task, --queue, --older-than, --newer-than, --error, --workflow) "
                "or --all."
            )
        default = DEFAULT_STATUS.get(action)
        if action == "cancel" and options["workflow"] is not None:
            default = [Job.Status.QUEUED, Job.Status.RUNNING]
        jobs = self.matching(options, default)
        if action == "list":
            self.list(jobs, options["limit"], options["dry_run"])
            return
        targets = bulk.eligible(action, jobs)
        if options["dry_run"]:
            self.stdout.write(f"{targets.count()} job(s) would be {bulk.CHANGES[action].verb} (dry run).")
            return
        outcome = bulk.apply(action, jobs, by="leasejobs_jobs")
        line = f"{len(outcome.changed)} job(s) {bulk.CHANGES[action].verb} of {outcome.matched} matched."
        if outcome.moved_on:
            line += f" {outcome.moved_on} changed since they were matched and were left alone."
        self.stdout.write(line)

    @staticmethod
    def matching(options: dict[str, Any], default_status: list[str] | None) -> QuerySet[Job]:
        jobs = Job.objects.all()
        status = options["status"] or default_status
        if status:
            jobs = jobs.filter(status__in=status)
        if options["task"] is not None:
            jobs = jobs.filter(task_name=options["task"])
        if options["queue"] is not None:
            jobs = jobs.filter(queue=options["queue"])
        if options["older_than"] is not None:
            jobs = jobs.filter(created_at__lt=Now() - dt.timedelta(seconds=options["older_than"]))
        if options["newer_than"] is not None:
            jobs = jobs.filter(created_at__gte=Now() - dt.timedelta(seconds=options["newer_than"]))
        if options["error"] is not None:
            jobs = jobs.filter(last_error__icontains=options["error"])
        if options["workflow"] is not None:
            jobs = jobs.filter(workflow_id=options["workflow"])
        return jobs

    def list(self, jobs: QuerySet[Job], limit: int, dry_run: bool) -> None:
        if dry_run:
            self.stdout.write(f"{jobs.count()} job(s) match.")
            return
        rows = jobs.order_by("-id").only(
            "id", "task_name", "queue", "status", "attempt", "max_attempts", "created_at", "last_error"
        )[:limit]
        self.stdout.write(HEADER)
        for job in rows:
            error = job.last_error.splitlines()[0][:100] if job.last_error else ""
            self.stdout.write(
                f"{job.id}\t{job.status}\t{job.attempt}/{job.max_attempts}\t{job.queue}\t{job.task_name}\t"
                f"{job.created_at:%Y-%m-%d %H:%M:%S}\t{error}"
            )
        self.stdout.write(f"{jobs.count()} job(s) match; the newest {min(limit, len(rows))} shown.")
