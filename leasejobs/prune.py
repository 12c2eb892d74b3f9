"""Deleting finished jobs in batches (``manage.py leasejobs_prune`` calls ``prune``).

A queue table that keeps every finished job grows without end; the claim
stays fast (its partial index holds only queued and running rows, see
docs/performance.md) but backups, the admin and vacuum pay for the rest.
``prune`` deletes finished jobs (done, failed, cancelled) whose
``finished_at`` is older than the cutoff, a batch per transaction so that no
lock is held long and autovacuum keeps up. Side-effect keys stay (their
``job`` becomes NULL): they are the memory that makes a side effect happen
at most once. ``side_effects=True`` deletes them too.
"""

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections, transaction

from leasejobs import sql
from leasejobs.conf import db_alias


@dataclass(frozen=True)
class Pruned:
    """What one ``prune`` call deleted."""

    cutoff: dt.datetime
    jobs: int
    side_effects: int
    batches: int
    seconds: float


def prune(
    older_than: float,
    *,
    batch_size: int = 1000,
    side_effects: bool = False,
    pause: float = 0.0,
    on_batch: Callable[[int, int], None] | None = None,
) -> Pruned:
    """Delete jobs finished more than ``older_than`` seconds ago, ``batch_size`` per transaction.

    The cutoff is taken from the database clock once, at the start. With
    ``side_effects``, the keys of pruned jobs go too, and so do unlinked keys
    created before the cutoff: only when no retry can still need them.
    ``pause`` sleeps between batches; ``on_batch(number, jobs)`` is called
    after each.
    """
    conn = connections[db_alias()]
    with conn.cursor() as cursor:
        cursor.execute("SELECT now() - make_interval(secs => %s)", [older_than])
        cutoff = cursor.fetchone()[0]
    jobs = effects = batches = 0
    started = time.monotonic()
    while True:
        with transaction.atomic(using=db_alias()), conn.cursor() as cursor:
            cursor.execute(sql.PRUNE_PICK, {"cutoff": cutoff, "limit": batch_size})
            ids = [row[0] for row in cursor.fetchall()]
            if not ids:
                break
            if side_effects:
                cursor.execute(sql.PRUNE_SIDE_EFFECTS, {"ids": ids})
                effects += cursor.rowcount
            cursor.execute(sql.PRUNE_JOBS, {"ids": ids})
            jobs += cursor.rowcount
        batches += 1
        if on_batch is not None:
            on_batch(batches, len(ids))
        if pause:
            time.sleep(pause)
    if side_effects:
        while True:
            with conn.cursor() as cursor:
                cursor.execute(sql.PRUNE_ORPHAN_SIDE_EFFECTS, {"cutoff": cutoff, "limit": batch_size})
                if cursor.rowcount == 0:
                    break
                effects += cursor.rowcount
    return Pruned(cutoff, jobs, effects, batches, time.monotonic() - started)
