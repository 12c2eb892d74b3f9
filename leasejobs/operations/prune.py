"""Deleting finished jobs in batches (``manage.py leasejobs_prune`` calls ``prune``).

A queue table that keeps every finished job grows without end; the claim
stays fast (its partial index holds only queued and running rows, see
docs/performance.md) but backups, the admin and vacuum pay for the rest.
``prune`` deletes finished jobs (done, failed, cancelled) whose
``finished_at`` is older than the cutoff, a batch per transaction so that no
lock is held long and autovacuum keeps up. Side-effect keys stay (their
``job`` becomes NULL): they are the memory that makes a side effect happen
at most once. ``side_effects=True`` deletes them too. A job's durable steps
go with it (``ON DELETE CASCADE``); events (``leasejobs.send_event``) sent
before the cutoff are deleted too: a job that waits for a pruned event's key
later waits until its timeout.
"""

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

from leasejobs.db import facade


@dataclass(frozen=True)
class Pruned:
    """What one ``prune`` call deleted."""

    cutoff: dt.datetime
    jobs: int
    side_effects: int
    batches: int
    seconds: float
    #: Events sent before the cutoff, deleted.
    events: int = 0


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
    cutoff = facade.prune_cutoff(older_than)
    jobs = effects = batches = 0
    started = time.monotonic()
    while True:
        picked, deleted, deleted_effects = facade.prune_batch(cutoff, batch_size, side_effects)
        if not picked:
            break
        jobs += deleted
        effects += deleted_effects
        batches += 1
        if on_batch is not None:
            on_batch(batches, picked)
        if pause:
            time.sleep(pause)
    if side_effects:
        while True:
            orphans = facade.prune_orphans(cutoff, batch_size)
            if orphans == 0:
                break
            effects += orphans
    events = 0
    while True:
        gone = facade.prune_events(cutoff, batch_size)
        if gone == 0:
            break
        events += gone
    return Pruned(cutoff, jobs, effects, batches, time.monotonic() - started, events)
