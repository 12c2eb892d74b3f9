"""Steadiness under database pressure (``leasejobs_bench --pressure``).

The field's recurring failure is a claim that slows down while something
else pins the xmin horizon: VACUUM cannot remove the row versions the claims
and finishes leave dead, so the claim walks ever more dead index entries.
This module measures it. Real ``runworker`` processes (``Bench.workers``,
at runworker's defaults unless told otherwise) take no-op jobs offered at a
fixed rate (``Bench._arriving``: bulk inserts every 10 ms, by default half
the rate ``Bench.process`` measures first), through three phases:

- clean: nothing else on the database;
- pressure, one of:
  ``long-transaction``: one session ``BEGIN; SELECT txid_current();`` and
  idle in that transaction, holding its xid; ``analytics``: four sessions,
  each in one ``REPEATABLE READ`` snapshot for the whole phase, scanning the
  job table in a loop (``ANALYTICS_SCAN``); ``scans``: the same scans,
  each in a transaction of its own (the readers' CPU and reads without
  their snapshot: what of ``analytics`` is the machine's, not the pinned
  horizon's); ``none``: nothing (a control run: how far two phases of the
  same load differ on this machine);
- after: the pressure is gone (rolled back, committed).

Every second a sampler reads the job table's dead and live tuples, the size
of the table and of each of its indexes (their names from the catalog, so
the figures follow whatever indexes the migrations made), the age of the
oldest xid or snapshot of the database (a VACUUM's own is left out: it holds
nothing back) and what a look at the front of the claim's index costs
(``PROBE``). The jobs' own timestamps, stamped by the database, give the
rest once the run is over: pickup latency is
``started_at - run_at`` (from the enqueue's statement to the claim), grouped
by the second the claim happened; throughput is jobs finished per second.

The verdict compares the pressure phase with the clean one: p99 at most
``TOLERANCE`` above, throughput at most ``TOLERANCE`` below (one-sided: a
phase that catches up on a backlog runs faster than the load, and that is
not a failure). Recovery is the time from the end of the pressure to the
start of the first of two consecutive ``RECOVERY_WINDOW``-second windows
that both hold.
"""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import dbcost
from bench.db import CLAIM_SESSION, connect
from bench.report import database_text
from bench.run import Bench, _worker_args, median_of
from bench.tasks import QUEUE
from bench.workers import WorkerGroup

KINDS = ("none", "long-transaction", "analytics", "scans")
ANALYTICS_READERS = 4
#: What each analytics reader runs, again and again, inside one snapshot.
ANALYTICS_SCAN = "SELECT count(*), max(id) FROM leasejobs_job"
#: The pressure sessions' statements give up after this (every wait has a timeout).
SESSION_TIMEOUT = "120s"
TOLERANCE = 0.20
RECOVERY_WINDOW = 10
#: Seconds of load before the clean phase starts (workers and caches warm up).
WARMUP = 10.0

#: The probe's period, in samples (seconds).
PROBE_EVERY = 10

SAMPLE = """
SELECT extract(epoch FROM clock_timestamp())::float8, t.n_dead_tup, t.n_live_tup,
       pg_relation_size(t.relid),
       (SELECT json_object_agg(i.indexrelid::regclass::text, pg_relation_size(i.indexrelid))
        FROM pg_index i WHERE i.indrelid = t.relid),
       (SELECT max(greatest(age(backend_xid), age(backend_xmin))) FROM pg_stat_activity
        WHERE datname = current_database() AND pid NOT IN (SELECT pid FROM pg_stat_progress_vacuum))
FROM pg_stat_user_tables t WHERE t.relname = 'leasejobs_job'
"""

#: The front of the claim's index, as the first step of every claim takes it
#: (the highest priority with a job not finished): on a connection set up as
#: the worker's claim connection, its buffers and time show how many index
#: entries, dead or alive, the claims walk past. ``finished_at IS NULL``
#: keeps it on the claim's index whether that index is partial on ``status``
#: or on ``finished_at``.
PROBE = """
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT id FROM leasejobs_job WHERE status IN ('queued', 'running') AND finished_at IS NULL
ORDER BY priority DESC, run_at, id LIMIT 1
"""

#: Per window of ``width`` seconds from ``origin`` (epoch seconds), between
#: ``lo`` and ``hi``: jobs finished, jobs claimed, the claimed jobs' pickup
#: latency p50 and p99 in ms, and jobs enqueued.
WINDOWS = """
WITH j AS (
    SELECT extract(epoch FROM created_at)::float8 AS ct, extract(epoch FROM started_at)::float8 AS st,
           extract(epoch FROM finished_at)::float8 AS ft,
           1000 * extract(epoch FROM started_at - run_at)::float8 AS wait_ms
    FROM leasejobs_job WHERE queue = %(queue)s
),
claimed AS (
    SELECT floor((st - %(origin)s) / %(width)s)::int AS w, count(*) AS n,
           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY wait_ms) AS p
    FROM j WHERE st >= %(lo)s AND st < %(hi)s GROUP BY 1
)
SELECT w, sum(finished)::int, sum(claimed)::int, max(p50), max(p99), sum(enqueued)::int FROM (
    SELECT w, 0 AS finished, n AS claimed, p[1] AS p50, p[2] AS p99, 0 AS enqueued FROM claimed
    UNION ALL
    SELECT floor((ft - %(origin)s) / %(width)s)::int, 1, 0, NULL, NULL, 0
    FROM j WHERE ft >= %(lo)s AND ft < %(hi)s
    UNION ALL
    SELECT floor((ct - %(origin)s) / %(width)s)::int, 0, 0, NULL, NULL, 1
    FROM j WHERE ct >= %(lo)s AND ct < %(hi)s
) AS w GROUP BY w ORDER BY w
"""

#: Per phase (name, start, end in epoch seconds): jobs enqueued and finished in it, and
#: the pickup latency of the jobs claimed in it; and jobs enqueued and not
#: finished at its end (the queue left behind).
PHASE = """
WITH j AS (
    SELECT extract(epoch FROM created_at)::float8 AS ct, extract(epoch FROM started_at)::float8 AS st,
           extract(epoch FROM finished_at)::float8 AS ft,
           1000 * extract(epoch FROM started_at - run_at)::float8 AS wait_ms
    FROM leasejobs_job WHERE queue = %(queue)s
)
SELECT (SELECT count(*) FROM j WHERE ct >= %(lo)s AND ct < %(hi)s),
       (SELECT count(*) FROM j WHERE ft >= %(lo)s AND ft < %(hi)s),
       (SELECT count(*) FROM j WHERE st >= %(lo)s AND st < %(hi)s),
       (SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY wait_ms)
        FROM j WHERE st >= %(lo)s AND st < %(hi)s),
       (SELECT max(wait_ms) FROM j WHERE st >= %(lo)s AND st < %(hi)s),
       (SELECT count(*) FROM j WHERE ct < %(hi)s AND (ft IS NULL OR ft >= %(hi)s))
"""


@dataclass(frozen=True)
class Phases:
    """Seconds of each phase (``--phases CLEAN,PRESSURE,AFTER``)."""

    clean: float = 60.0
    pressure: float = 180.0
    after: float = 60.0


# -- the pressure


@contextlib.contextmanager
def long_transaction(seconds: float = 900.0) -> Iterator[dict[str, Any]]:
    """One session idle in a transaction that holds an xid, until the block ends (then ROLLBACK).

    Should the bench hang, the server ends the transaction a minute after ``seconds``.
    """
    idle = f"{int(seconds) + 60}s"
    conn = connect(f"-c statement_timeout={SESSION_TIMEOUT} -c idle_in_transaction_session_timeout={idle}")
    try:
        conn.execute("BEGIN")
        row = conn.execute("SELECT txid_current()").fetchone()
        assert row is not None
        yield {"xid": int(row[0]), "pid": conn.info.backend_pid}
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextlib.contextmanager
def analytics(readers: int = ANALYTICS_READERS, *, snapshot: bool = True) -> Iterator[dict[str, Any]]:
    """``readers`` sessions, each in one REPEATABLE READ snapshot, running ``ANALYTICS_SCAN`` in a loop.

    Without ``snapshot`` each scan is a transaction of its own (autocommit):
    the same CPU and reads, but no snapshot held from one scan to the next.
    """
    stop = threading.Event()
    scans = [0] * readers
    errors: list[BaseException] = []
    conns = [connect(f"-c statement_timeout={SESSION_TIMEOUT}") for _ in range(readers)]

    def read(n: int) -> None:
        conn = conns[n]
        try:
            if snapshot:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            while not stop.is_set():
                conn.execute(ANALYTICS_SCAN).fetchone()
                scans[n] += 1
            if snapshot:
                conn.execute("COMMIT")
        except psycopg.Error as exc:
            if not stop.is_set():
                errors.append(exc)

    threads = [threading.Thread(target=read, args=(n,), name=f"bench-analytics-{n}") for n in range(readers)]
    detail: dict[str, Any] = {"readers": readers, "scans": scans, "errors": errors}
    try:
        for thread in threads:
            thread.start()
        yield detail
    finally:
        stop.set()
        for conn, thread in zip(conns, threads, strict=True):
            thread.join(timeout=30)
            if thread.is_alive():  # a scan that would not end: cancel it
                conn.cancel()
                thread.join(timeout=10)
        for conn in conns:
            conn.close()
        detail["errors"] = [str(e) for e in errors]


@contextlib.contextmanager
def nothing() -> Iterator[dict[str, Any]]:
    """No pressure: the control run."""
    yield {}


#: Each kind's pressure, given the seconds it is to last.
PRESSURES: dict[str, Callable[[float], contextlib.AbstractContextManager[dict[str, Any]]]] = {
    "none": lambda seconds: nothing(),
    "long-transaction": long_transaction,
    "analytics": lambda seconds: analytics(),
    "scans": lambda seconds: analytics(snapshot=False),
}


# -- the sampler


@contextlib.contextmanager
def sampling(every: float = 1.0, probe_every: int = PROBE_EVERY) -> Iterator[list[dict[str, Any]]]:
    """Reads ``SAMPLE`` every ``every`` seconds on a connection of its own, from a thread, and
    ``PROBE`` with every ``probe_every``-th sample (the others carry no probe figures).

    The probe walks the claim index's front as a claim would, and under a pinned
    horizon that walk is the costly one: every second it took about 15 % of one
    of the two cores from the run it measures (docs/performance.md).
    """
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    conn = connect(f"{CLAIM_SESSION} -c statement_timeout=10s")

    def sample() -> None:
        next_at = time.monotonic()
        count = 0
        while not stop.is_set():
            row = conn.execute(SAMPLE).fetchone()
            if row is not None:
                sample = {
                    "at": row[0],
                    "dead": int(row[1]),
                    "live": int(row[2]),
                    "table_bytes": int(row[3]),
                    "indexes": {name: int(size) for name, size in (row[4] or {}).items()},
                    "xmin_age": None if row[5] is None else int(row[5]),
                }
                probe = conn.execute(PROBE).fetchone() if count % probe_every == 0 else None
                if probe is not None:
                    plan = probe[0][0]
                    sample["probe_ms"] = float(plan["Execution Time"])
                    sample["probe_buffers"] = int(
                        plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
                    )
                samples.append(sample)
            count += 1
            next_at += every
            stop.wait(max(0.0, next_at - time.monotonic()))

    thread = threading.Thread(target=sample, name="bench-sampler")
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=15)
        conn.close()


# -- the run


def fresh_table(b: Bench) -> bool:
    """Empty the bench's jobs; if the table is then empty, rebuild it and its indexes (VACUUM FULL)
    so that each run's sizes start from the same place. False if other rows are in it."""
    b.clear(history=True)
    row = b.conn.execute("SELECT NOT EXISTS (SELECT 1 FROM leasejobs_job)").fetchone()
    if row and row[0]:
        b.conn.execute("VACUUM FULL leasejobs_job")
        b.conn.execute("ANALYZE leasejobs_job")
        return True
    return False


def server_now(b: Bench) -> float:
    row = b.conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def hold(seconds: float, check: Callable[[], None]) -> None:
    """Wait ``seconds``, calling ``check`` (which raises on trouble) every half second."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        check()
        time.sleep(min(0.5, left))


def wait_drained(b: Bench, group: WorkerGroup, timeout: float = 120.0) -> None:
    """Until no bench job is left unfinished (the load has stopped); raises after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while b._queued():
        group.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{b._queued()} bench jobs still queued {timeout:.0f} s after the load stopped"
            )
        time.sleep(0.2)


def run_phases(
    b: Bench,
    kind: str,
    rate: float,
    workers: int,
    concurrency: int,
    prefetch: int | None,
    phases: Phases,
    step: Callable[[str], None],
) -> dict[str, Any]:
    """One run: workers take jobs offered at ``rate``/s through the clean, pressure and after phases."""
    rebuilt = fresh_table(b)
    detail: dict[str, Any] = {}
    with b.workers(workers, _worker_args(concurrency, prefetch)) as group:
        with sampling() as samples, b._arriving(rate) as arrivals:
            hold(WARMUP, group.check_alive)
            checkpointed = dbcost.checkpoint(b.conn)
            before = dbcost.read(b.conn)
            marks = {"clean": server_now(b)}
            step(f"clean: {phases.clean:g} s at {rate:,.0f} jobs/s")
            hold(phases.clean, group.check_alive)
            marks["pressure"] = server_now(b)
            after = dbcost.read(b.conn)
            step(f"pressure ({kind}): {phases.pressure:g} s")
            with PRESSURES[kind](phases.pressure) as detail:
                hold(phases.pressure, group.check_alive)
            marks["after"] = server_now(b)
            step(f"after: {phases.after:g} s")
            hold(phases.after, group.check_alive)
            marks["end"] = server_now(b)
        wait_drained(b, group)  # the jobs offered until the end, finished before the workers stop
    step("reading the run's figures from the jobs' timestamps")
    result = _figures(b, marks, samples)
    # The clean phase's jobs arrive and leave at the same rate: its cost per
    # job finished is the cost of a job in a steady flow, as production runs
    # them (a bulk enqueue drained at once, leasejobs_bench's processing
    # runs, fills pages first and claims after). CPU is not read here: the
    # sampler's and the arrivals' backends run beside the workers'.
    finished = round(result["phases"]["clean"]["jobs_per_s"] * phases.clean)
    result["clean_database"] = (
        dbcost.per_job(before, after, {}, {}, finished, checkpointed=checkpointed) if finished else None
    )
    result.update(
        pressure=kind,
        detail=dict(detail),
        rate=rate,
        arrived=arrivals.count,
        arrive_rate=arrivals.rate,
        workers=workers,
        concurrency=concurrency,
        prefetch=prefetch,
        phase_seconds={"clean": phases.clean, "pressure": phases.pressure, "after": phases.after},
        table_rebuilt=rebuilt,
    )
    b.clear()
    return result


def _figures(b: Bench, marks: dict[str, float], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-second series, phase summaries and the verdict, from the jobs' rows and the samples."""
    t0, ends = marks["clean"], {"clean": marks["pressure"], "pressure": marks["after"], "after": marks["end"]}
    per_second = [
        {"t": w, "finished": n_done, "claimed": n_claimed, "p50_ms": p50, "p99_ms": p99, "enqueued": n_in}
        for w, n_done, n_claimed, p50, p99, n_in in b.conn.execute(
            # whole seconds only
            WINDOWS,
            {"queue": QUEUE, "origin": t0, "width": 1, "lo": t0 - WARMUP, "hi": t0 + int(marks["end"] - t0)},
        ).fetchall()
    ]
    phases: dict[str, dict[str, Any]] = {}
    for name, start in (
        ("clean", marks["clean"]),
        ("pressure", marks["pressure"]),
        ("after", marks["after"]),
    ):
        end = ends[name]
        row = b.conn.execute(PHASE, {"queue": QUEUE, "lo": start, "hi": end}).fetchone()
        assert row is not None
        enqueued, finished, claimed, p, worst, left = row
        last = at_or_before(samples, end)
        phases[name] = {
            "start": start - t0,
            "end": end - t0,
            "enqueued_per_s": int(enqueued) / (end - start),
            "jobs_per_s": int(finished) / (end - start),
            "claimed": int(claimed),
            "p50_ms": p[0] if p else None,
            "p99_ms": p[1] if p else None,
            "max_ms": worst,
            "left_queued": int(left),
            "dead_end": last["dead"] if last else None,
            "table_bytes_end": last["table_bytes"] if last else None,
            "indexes_end": last["indexes"] if last else {},
            "probe_buffers_end": next(
                (s["probe_buffers"] for s in reversed(samples) if "probe_buffers" in s and s["at"] <= end),
                None,
            ),
            "xmin_age_max": max(
                (s["xmin_age"] or 0 for s in samples if start <= s["at"] < end), default=None
            ),
        }
    recovery = [
        {"t": w * RECOVERY_WINDOW, "jobs_per_s": n_done / RECOVERY_WINDOW, "p99_ms": p99}
        for w, n_done, _, _, p99, _ in b.conn.execute(
            WINDOWS,
            {
                "queue": QUEUE,
                "origin": marks["after"],
                "width": RECOVERY_WINDOW,
                "lo": marks["after"],
                # whole windows only
                "hi": marks["after"]
                + RECOVERY_WINDOW * int((marks["end"] - marks["after"]) // RECOVERY_WINDOW),
            },
        ).fetchall()
    ]
    return {
        "phases": phases,
        "per_second": per_second,
        "samples": [{**s, "t": s["at"] - t0} for s in samples],
        "recovery_windows": recovery,
        "verdict": verdict(phases["clean"], phases["pressure"], recovery),
    }


def at_or_before(samples: list[dict[str, Any]], at: float) -> dict[str, Any] | None:
    """The last sample taken at or before ``at`` (epoch seconds), or None."""
    found = None
    for sample in samples:
        if sample["at"] <= at:
            found = sample
    return found


def holds(
    jobs_per_s: float, p99_ms: float | None, clean: dict[str, Any], tolerance: float = TOLERANCE
) -> bool:
    """Whether a phase or window is within ``tolerance`` of the clean phase: p99 no more than that
    above, throughput no more than that below."""
    reference: float | None = clean["p99_ms"]
    if p99_ms is None or reference is None:
        return False
    return p99_ms <= reference * (1 + tolerance) and jobs_per_s >= float(clean["jobs_per_s"]) * (
        1 - tolerance
    )


def recovered_after(
    windows: list[dict[str, Any]], clean: dict[str, Any], tolerance: float = TOLERANCE
) -> float | None:
    """Seconds from the end of the pressure to the first of two consecutive windows that hold
    (``windows``: ``t`` from the end of the pressure, ``jobs_per_s``, ``p99_ms``, in order); None if
    no two do. The last window may stand alone: a run cannot see past its end."""
    ok = [holds(w["jobs_per_s"], w["p99_ms"], clean, tolerance) for w in windows]
    for n, good in enumerate(ok):
        if good and (n + 1 == len(ok) or ok[n + 1]):
            return float(windows[n]["t"])
    return None


def verdict(
    clean: dict[str, Any],
    pressure: dict[str, Any],
    windows: list[dict[str, Any]],
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """The pressure phase against the clean one, and when the after phase recovered."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    return {
        "p99_ratio": ratio(pressure["p99_ms"], clean["p99_ms"]),
        "jobs_per_s_ratio": ratio(pressure["jobs_per_s"], clean["jobs_per_s"]),
        "held": holds(pressure["jobs_per_s"], pressure["p99_ms"], clean, tolerance),
        "recovered_after_s": recovered_after(windows, clean, tolerance),
        "tolerance": tolerance,
    }


def run(b: Bench, options: dict[str, Any], step: Callable[[str], None]) -> dict[str, Any]:
    """``--pressure KIND``: the offered rate (``--rate``, or half the drain rate measured now), then
    the run."""
    workers, concurrency = max(options["workers"]), options["concurrency"][0]
    measured = None
    rate = options.get("rate")
    if not rate:
        step(
            f"measuring the drain rate: {options['repeat']} x {options['jobs']:,} no-op jobs, "
            f"{workers} worker(s)"
        )
        measured = median_of(
            [
                b.process(options["jobs"], workers, concurrency, options["prefetch"])
                for _ in range(options["repeat"])
            ]
        )
        rate = measured / 2
    clean, pressure, after = options["phases"]
    result = run_phases(
        b,
        options["pressure"],
        rate,
        workers,
        concurrency,
        options["prefetch"],
        Phases(clean, pressure, after),
        step,
    )
    result["measured_rate"] = measured
    return result


# -- the table


def show_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


#: The table's columns: heading, width, and how a phase shows in it.
COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
    ("seconds", 8, lambda p: f"{p['end'] - p['start']:.0f}"),
    ("in/s", 7, lambda p: f"{p['enqueued_per_s']:,.0f}" if "enqueued_per_s" in p else "-"),
    ("jobs/s", 7, lambda p: f"{p['jobs_per_s']:,.0f}"),
    ("p50 ms", 9, lambda p: show_ms(p["p50_ms"])),
    ("p99 ms", 9, lambda p: show_ms(p["p99_ms"])),
    ("max ms", 9, lambda p: show_ms(p["max_ms"])),
    ("left", 8, lambda p: f"{p['left_queued']:,}"),
    ("dead", 9, lambda p: show_count(p["dead_end"])),
    ("xid age", 8, lambda p: show_count(p["xmin_age_max"])),
    ("table MB", 9, lambda p: _mb(p["table_bytes_end"])),
    ("probe buf", 10, lambda p: show_count(p.get("probe_buffers_end"))),
]


def show_count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def render(result: dict[str, Any]) -> str:
    """The run as a plain-text table per phase, and the verdict."""
    phases = result["phases"]
    names = sorted({name for p in phases.values() for name in p["indexes_end"]})
    measured = result.get("measured_rate")
    lines = [
        f"pressure: {result['pressure']}; {result['workers']} worker(s) x concurrency "
        f"{result['concurrency']}; offered {result['rate']:,.0f} jobs/s"
        + (f" (half the {measured:,.0f} measured)" if measured else "")
        + f", reached {result['arrive_rate']:,.0f} ({result['arrived']:,} jobs)",
        "",
        "phase    " + "".join(f"{heading:>{width}}" for heading, width, _ in COLUMNS),
    ]
    for name, p in phases.items():
        lines.append(f"{name:<9}" + "".join(f"{show(p):>{width}}" for _, width, show in COLUMNS))
    lines += [
        "(in/s: jobs enqueued per second; left: jobs enqueued and not finished at the phase's end;",
        " dead: n_dead_tup then; xid age: the oldest xid or snapshot of the database, the most in the",
        " phase; probe buf: buffers one look at the front of the claim's index touched at the end)",
        "",
        "index MB at each phase's end:",
    ]
    for name in names:
        sizes = "  ".join(f"{phase} {_mb(p['indexes_end'].get(name))}" for phase, p in phases.items())
        lines.append(f"  {name}: {sizes}")
    v = result["verdict"]
    pct = f"{v['tolerance']:.0%}"
    lines += [
        "",
        f"pressure against clean: p99 {_ratio(v['p99_ratio'])}, jobs/s {_ratio(v['jobs_per_s_ratio'])}: "
        + ("within " if v["held"] else "NOT within ")
        + pct,
        "recovered "
        + (
            f"{v['recovered_after_s']:.0f} s after the pressure ended"
            if v["recovered_after_s"] is not None
            else "NOT within the after phase"
        )
        + f" ({RECOVERY_WINDOW} s windows: p99 and jobs/s within {pct} of clean, two in a row)",
    ]
    if cost := result.get("clean_database"):
        lines.append(f"database per job finished in the clean phase (a steady flow): {database_text(cost)}")
    if result["detail"]:
        lines.append(f"pressure sessions: {result['detail']}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
