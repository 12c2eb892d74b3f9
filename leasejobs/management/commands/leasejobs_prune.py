"""``manage.py leasejobs_prune --older-than 7d``: delete finished jobs in batches.

A queue table that keeps every finished job grows without end; the claim
stays fast (its partial index holds only queued and running rows, see
docs/performance.md) but backups, the admin and vacuum pay for the rest.
Pruning deletes finished jobs (done, failed, cancelled) whose ``finished_at``
is older than the cutoff, a batch per transaction so that no lock is held
long and autovacuum keeps up. Side-effect keys stay (their ``job`` becomes
NULL): they are the memory that makes a side effect happen at most once.
``--side-effects`` deletes them too.
"""

import re
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections, transaction

from leasejobs import sql
from leasejobs.enqueue import db_alias
from leasejobs.management.commands.runworker import _positive

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or plain seconds, as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ValueError(text)
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


parse_age.__name__ = "age such as 7d, 12h, 30m or 45s"


class Command(BaseCommand):
    help = (
        "Delete finished jobs (done, failed, cancelled) older than --older-than, in batches. "
        "Side-effect keys are kept (unlinked from their job) unless --side-effects is given."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=parse_age,
            required=True,
            metavar="AGE",
            help="Prune jobs finished longer ago than this: 7d, 12h, 30m, 45s, 2w.",
        )
        parser.add_argument(
            "--batch-size",
            type=_positive(int),
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
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Sleep between batches, to go easy on a busy database (0).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["pause"] < 0:
            raise CommandError("--pause must not be negative.")
        batch = options["batch_size"]
        conn = connections[db_alias()]
        with conn.cursor() as cursor:
            cursor.execute("SELECT now() - make_interval(secs => %s)", [options["older_than"]])
            cutoff = cursor.fetchone()[0]
        jobs = effects = batches = 0
        started = time.monotonic()
        while True:
            with transaction.atomic(using=db_alias()), conn.cursor() as cursor:
                cursor.execute(sql.PRUNE_PICK, {"cutoff": cutoff, "limit": batch})
                ids = [row[0] for row in cursor.fetchall()]
                if not ids:
                    break
                if options["side_effects"]:
                    cursor.execute(sql.PRUNE_SIDE_EFFECTS, {"ids": ids})
                    effects += cursor.rowcount
                cursor.execute(sql.PRUNE_JOBS, {"ids": ids})
                jobs += cursor.rowcount
            batches += 1
            if options["verbosity"] > 1:
                self.stdout.write(f"batch {batches}: {len(ids)} jobs")
            if options["pause"]:
                time.sleep(options["pause"])
        if options["side_effects"]:
            while True:
                with conn.cursor() as cursor:
                    cursor.execute(sql.PRUNE_ORPHAN_SIDE_EFFECTS, {"cutoff": cutoff, "limit": batch})
                    if cursor.rowcount == 0:
                        break
                    effects += cursor.rowcount
        kept = "deleted" if options["side_effects"] else "kept"
        self.stdout.write(
            f"Pruned {jobs:,} finished job(s) finished before {cutoff:%Y-%m-%d %H:%M:%S %Z} "
            f"in {batches} batch(es) of at most {batch:,}, {time.monotonic() - started:.1f} s; "
            f"side-effect keys {kept}" + (f" ({effects:,})." if options["side_effects"] else ".")
        )
