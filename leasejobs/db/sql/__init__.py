"""Every statement leasejobs runs, by name: one module per table or caller.

- ``enqueue``: enqueue and the concurrency keys' places (Django's connection);
- ``claim``: the worker's claims, plain and under queue controls;
- ``leases``: heartbeat, finish and release (the worker's connections);
- ``side_effects``: the side-effect fence (Django's connection, in the body's transaction);
- ``steps``: durable steps, sleeps, waits and events (in the body's fenced
  transaction, or the sender's);
- ``admin``: the admin's and the command's fenced release, cancel and retry;
- ``prune``: pruning finished jobs; ``vacuum``: the worker's vacuum thread and
  the autovacuum check; ``charts``: the overview's charts;
- ``queues``: queue controls and figures; ``workers``: the worker rows;
- ``periodic``: the periodic scheduler; ``connections``: the one-line
  statements of connection set-up and checks;
- ``fragments``: the pieces several statements share (the fencing predicate,
  the freeing of places, the NOTIFY of queues), written once;
- ``clock``: ``at_clock``, the statements at a clock a test binds (the
  protocol simulation).

The worker's statements are also importable from this package by name
(``sql.CLAIM``), as they were from ``leasejobs.sql``.

Claim, heartbeat, finish and release run on the worker's own psycopg
connections; enqueue and the side-effect fence run on Django's connection so
they join the caller's transaction. All of them are single statements with
bound parameters (nothing is ever formatted into the SQL text) and all
timestamps come from the database clock (``now()``): worker clocks never
decide who holds a lease.

The fencing rule, in one sentence: every write made on behalf of an attempt
matches the row on ``id AND attempt = <token> AND leased_by = <worker> AND
status = 'running'``, so once another claim has bumped ``attempt`` (or the
job left ``running``, or another worker holds it) the stale attempt's write
matches nothing.

Heartbeat, finish and release must find each of their rows by primary key,
whatever the table's statistics say: those lag behind a burst of enqueued
jobs (autovacuum analyzes up to a minute later), and the planner then
believes almost no row is running. With a plain join on ``status =
'running'`` it walked the whole claim index for every batch, or scanned the
whole table (docs/performance.md has the figures).
So each looks its rows up in a LATERAL subquery, one primary-key probe per
id (the FOR UPDATE or LIMIT in it keeps the planner from flattening it into
a join). None of them names ``finished_at``, the claim index's predicate
(``finished_at IS NULL``), so the primary key is the only index left for the
probe.

Every UPDATE then writes the row versions its lookup found by their
``ctid`` (a TID scan per row), never by joining its rows back to the table
on ``id``: a VACUUM that ran while the table held no live row (a drained
queue whose history was pruned) leaves ``reltuples`` at 0, the planner then
prices a read of the whole table at one row, and the claim's UPDATE read
the table once per claimed row (25 s for a claim of 1,000 jobs; 5 December,
``tests/integration/test_stale_statistics.py``). The worker's connections
turn sequential scans off, and no index reaches a row by ``ctid``, so the
TID scan is the only plan left. A claim, a heartbeat, a finish after its
lock and a release write a version they locked themselves: nobody can
replace it before they do. (A claim's walk that finds a row changed and
committed after the statement began locks its newest version, which is
not in the statement's snapshot: that row is not written, so not claimed
now, and is claimable again when the claim commits.) ``FINISH_WAITING`` writes without a lock; a
version replaced while it waited is not written there (PostgreSQL does not
follow a TID to the newer version), and the store writes that outcome with
``FINISH``.

A claim is a HOT update: it changes no column that an index holds or that
an index's predicate names (status is in none; ``finished_at`` is, and a
claim leaves it NULL), so it writes no index entry and its new row version
stays in its page (the table's fillfactor leaves the room). The check
constraint ``leasejobs_job_finished_iff_ended`` keeps the predicate honest:
a job is queued or running exactly when ``finished_at`` is NULL.
"""

from leasejobs.db.sql.admin import ADMIN_CANCEL, ADMIN_RELEASE, ADMIN_RETRY
from leasejobs.db.sql.claim import (
    CLAIM,
    CLAIM_AFTER,
    CLAIM_LIMITED,
    FRONT_LOOK,
    LIMITS_APPLY,
    PENDING_RETRIES,
)
from leasejobs.db.sql.clock import CLOCK_PARAMETER, at_clock
from leasejobs.db.sql.enqueue import BULK_ENQUEUE, ENQUEUE, ENQUEUE_PLAIN, KEY_PLACES
from leasejobs.db.sql.leases import FINISH, FINISH_WAITING, HEARTBEAT, RELEASE, STILL_HELD
from leasejobs.db.sql.prune import PRUNE_JOBS, PRUNE_ORPHAN_SIDE_EFFECTS, PRUNE_PICK, PRUNE_SIDE_EFFECTS
from leasejobs.db.sql.side_effects import FENCE_CHECK, RECORD_SIDE_EFFECT, RENEW_LEASE
from leasejobs.db.sql.vacuum import MAY_VACUUM, VACUUM, VACUUM_LOOK

__all__ = [
    "ADMIN_CANCEL",
    "ADMIN_RELEASE",
    "ADMIN_RETRY",
    "BULK_ENQUEUE",
    "CLAIM",
    "CLAIM_AFTER",
    "CLAIM_LIMITED",
    "CLOCK_PARAMETER",
    "ENQUEUE",
    "ENQUEUE_PLAIN",
    "FENCE_CHECK",
    "FINISH",
    "FINISH_WAITING",
    "FRONT_LOOK",
    "HEARTBEAT",
    "KEY_PLACES",
    "LIMITS_APPLY",
    "MAY_VACUUM",
    "PENDING_RETRIES",
    "PRUNE_JOBS",
    "PRUNE_ORPHAN_SIDE_EFFECTS",
    "PRUNE_PICK",
    "PRUNE_SIDE_EFFECTS",
    "RECORD_SIDE_EFFECT",
    "RELEASE",
    "RENEW_LEASE",
    "STILL_HELD",
    "VACUUM",
    "VACUUM_LOOK",
    "at_clock",
]
