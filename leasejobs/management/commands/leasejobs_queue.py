"""``manage.py leasejobs_queue pause|resume|limit|list|sync``: queue controls from a shell.

An operator in an incident pauses a queue from the command line without
opening the admin; ``list`` shows what every worker's claim sees now.
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leasejobs.queues import controls


class Command(BaseCommand):
    help = "Pause or resume a queue, change its limits, or list the queues' controls."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        for action, text in (
            ("pause", "Stop claiming the queue's jobs (running jobs finish)."),
            ("resume", "Claim the queue's jobs again."),
        ):
            sub = actions.add_parser(action, help=text)
            sub.add_argument("queue")
        limit = actions.add_parser("limit", help="Set a queue's limits at run time (they win over settings).")
        limit.add_argument("queue")
        limit.add_argument("--concurrency", type=int, default=None, help="Most jobs running at once.")
        limit.add_argument("--rate", default=None, help="Most claims per window: 100/m, 20/10s.")
        actions.add_parser("list", help="Every controlled queue: paused, limits, places in use.")
        actions.add_parser(
            "sync", help="Write LEASEJOBS['QUEUES'] to the queue table (workers do it at start)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "pause":
                controls.pause_queue(options["queue"])
                self.stdout.write(f"queue {options['queue']} paused")
            elif action == "resume":
                controls.resume_queue(options["queue"])
                self.stdout.write(f"queue {options['queue']} resumed")
            elif action == "limit":
                limits = controls.set_limits(
                    options["queue"], concurrency=options["concurrency"], rate=options["rate"]
                )
                conc, rate = limits.concurrency or "-", limits.rate or "-"
                self.stdout.write(f"queue {options['queue']}: concurrency={conc} rate={rate}")
            elif action == "sync":
                controls.sync_settings()
                self.stdout.write("LEASEJOBS['QUEUES'] written to the queue table")
            else:
                self._list()
        except ValueError as exc:
            raise CommandError(str(exc)) from None

    def _list(self) -> None:
        self.stdout.write(f"{'queue':<20} {'state':<7} {'concurrency':<12} {'rate':<12} {'queued':>7}")
        for q in controls.states():
            conc = f"{q.running}/{q.limits.concurrency}" if q.limits.concurrency else "-"
            rate = f"{q.rate_used} of {q.limits.rate}" if q.limits.rate else "-"
            state = "paused" if q.paused else "active"
            self.stdout.write(f"{q.name:<20} {state:<7} {conc:<12} {rate:<12} {q.queued:>7}")
