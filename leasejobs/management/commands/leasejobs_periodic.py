"""``manage.py leasejobs_periodic [--run NAME]``: list periodic schedules, or enqueue one now."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leasejobs.periodic.status import run_now, statuses
from leasejobs.periodic.ticks import ScheduleError

STAMP = "%Y-%m-%d %H:%M:%S %Z"


def _when(value: Any) -> str:
    return value.strftime(STAMP) if value else "-"


class Command(BaseCommand):
    help = (
        "List the periodic schedules: expression, zone, last tick enqueued, next tick (in its zone "
        "and UTC) and the last job's status; --run NAME enqueues one job of that schedule now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", metavar="NAME", help="Enqueue one job of this schedule now.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["run"] is not None:
            try:
                job = run_now(options["run"])
            except ScheduleError as exc:
                raise CommandError(f"{exc}.") from None
            self.stdout.write(f"enqueued job {job.id} of schedule {options['run']} ({job.task_name})")
            return
        found = statuses()
        if not found:
            self.stdout.write("No periodic schedules (see @periodic and LEASEJOBS['PERIODIC']).")
            return
        for s in found:
            last_job = f"#{s.last_job.id} {s.last_job.status}" if s.last_job else "-"
            next_local, next_utc = _when(s.next_tick_local), _when(s.next_tick)
            self.stdout.write(
                f"{s.name}\n"
                f"  task {s.task_name}, cron {s.cron!r} in {s.timezone}\n"
                f"  last tick {_when(s.last_tick)}; next {next_local} ({next_utc})\n"
                f"  last job {last_job}; {s.enqueued} enqueued, {s.skipped} skipped"
                + (f"\n  note: {s.note}" if s.note else "")
            )
