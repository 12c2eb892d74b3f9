"""``manage.py leasejobs_prune --older-than 7d``: delete finished jobs in batches.

The work is ``leasejobs.operations.prune.prune``; this command parses its options and
prints one line of what it deleted.
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from leasejobs.management.arguments import duration, non_negative_float, positive_int
from leasejobs.operations.prune import prune


class Command(BaseCommand):
    help = (
        "Delete finished jobs (done, failed, cancelled) older than --older-than, in batches. "
        "Side-effect keys are kept (unlinked from their job) unless --side-effects is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=duration,
            required=True,
            metavar="AGE",
            help="Prune jobs finished longer ago than this: 7d, 12h, 30m, 45s, 2w.",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            metavar="N",
            help="Jobs per transaction (1000).",
        )
        parser.add_argument(
            "--side-effects",
            action="store_true",
            help="Also delete the side-effect keys of pruned jobs, and unlinked keys older than the "
            "cutoff. Only when no retry can still need them.",
        )
        parser.add_argument(
            "--pause",
            type=non_negative_float,
            default=0.0,
            metavar="SECONDS",
            help="Sleep between batches, to go easy on a busy database (0).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        def say_batch(number: int, jobs: int) -> None:
            if options["verbosity"] > 1:
                self.stdout.write(f"batch {number}: {jobs} jobs")

        batch = options["batch_size"]
        done = prune(
            options["older_than"],
            batch_size=batch,
            side_effects=options["side_effects"],
            pause=options["pause"],
            on_batch=say_batch,
        )
        kept = f"deleted ({done.side_effects:,})" if options["side_effects"] else "kept"
        self.stdout.write(
            f"Pruned {done.jobs:,} finished job(s) finished before {done.cutoff:%Y-%m-%d %H:%M:%S %Z} "
            f"in {done.batches} batch(es) of at most {batch:,}, {done.seconds:.1f} s; "
            f"side-effect keys {kept}; {done.events:,} event(s) sent before the cutoff deleted."
        )
