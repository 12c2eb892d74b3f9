"""Pickup latency at a fixed offered load (``leasejobs_bench --offered-load 50,100,150``).

Issue 32's independent-benchmark shape: jobs that each take 1 ms (``time.sleep``:
the bench task ``pause``) and carry a 256-byte payload in their arguments,
offered at a fixed rate by a bulk producer (``Bench._arriving``: one thread,
a bulk insert every 10 ms, catching up after one that ran late), to real
``runworker`` processes (``Bench.workers``, at runworker's defaults unless
told otherwise), at 50 %, 100 % and 150 % of the sustainable rate: the
highest rate at which the pickup latency's p99 stays under ``LIMIT_MS``.

The sustainable rate is searched for first (``search``): from the drain rate
``Bench.process`` measures with these jobs, a probe (as long as a level
unless ``--probe-seconds`` says otherwise) at each rate ``next_rate`` picks,
up by ``STEP`` while probes pass and down while they fail, then halving the
gap (geometrically) between the highest rate that passed and the lowest
above it that failed until it is within ``PRECISION``. A probe passes if
its p99 is under ``LIMIT_MS`` and the producer offered at least ``REACHED``
of the rate (a rate the bench cannot offer is not one the queue was shown to
sustain).

Each probe and each level is the same run (``offer``): the bench's jobs
deleted, the load offered for ``WARMUP`` seconds and then for the measured
seconds, the load stopped, the queue drained. Its figures are those of the
jobs that arrived in the measured seconds, wherever they were claimed (a
backlog's jobs count when they are claimed after the load stopped), per level
and per ``WINDOW``-second window of arrival. Pickup latency is from the
enqueue's statement (``run_at``) to the start of the job's body (the body's
``time.time()``, its result; the same host's clock as the database's): it
includes the time a job claimed ahead waits inside the worker (prefetch) for
a child process. The claim's latency (``started_at - run_at``, as
``bench.pressure`` reads it) is kept beside it. ``bench.pressure.sampling`` reads the
job table's dead tuples and the cost of a look at the front of the claim's
index every second meanwhile.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

from bench.pressure import hold, sampling, server_now, show_count, show_ms, wait_drained
from bench.run import Bench, Workload, _worker_args, median_of, percentile
from bench.tasks import QUEUE
from bench.workers import WorkerGroup

#: The pickup latency's p99 under which a rate is sustainable.
LIMIT_MS = 100.0
JOB_SECONDS = 0.001
PAYLOAD_BYTES = 256
#: Each job: ``time.sleep(JOB_SECONDS)``, with a ``PAYLOAD_BYTES`` string beside it in its arguments.
WORKLOAD = Workload("pause", JOB_SECONDS, payload="x" * PAYLOAD_BYTES)
#: Seconds of load before each probe's or level's measured seconds.
WARMUP = 5.0
#: Seconds of each window of the latency over time.
WINDOW = 1.0
#: The search's step up and down, the gap at which it stops, and the most probes it runs.
STEP = 1.25
PRECISION = 0.10
MOST_PROBES = 8
#: A probe counts only if the producer offered at least this share of its rate.
REACHED = 0.95
#: Seconds a probe's or a level's backlog may take to drain once the load stops.
DRAIN_TIMEOUT = 300.0

#: Each bench job's arrival (its enqueue's statement), claim, body's start and finish, in epoch seconds.
JOBS = """
SELECT extract(epoch FROM run_at)::float8, extract(epoch FROM started_at)::float8,
       (result #>> '{}')::float8, extract(epoch FROM finished_at)::float8
FROM leasejobs_job WHERE queue = %s
"""

#: A job's (arrived, claimed, started, finished), epoch seconds; None: not yet.
Job = tuple[float, float | None, float | None, float | None]


# -- the pure part: percentiles, windows, the search


def summary(waits_ms: Sequence[float]) -> dict[str, Any]:
    """Jobs, and the pickup latency's p50, p95, p99 and max in ms (None without jobs)."""
    if not waits_ms:
        return {"jobs": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(waits_ms)
    return {
        "jobs": len(ordered),
        "p50_ms": percentile(ordered, 50),
        "p95_ms": percentile(ordered, 95),
        "p99_ms": percentile(ordered, 99),
        "max_ms": ordered[-1],
    }


def latencies(jobs: Sequence[Job], origin: float, end: float) -> dict[str, Any]:
    """The pickup latency (to the body's start) of the jobs that arrived from ``origin`` to ``end``
    (``summary``), and under ``claim`` that of their claims; a job not started counts in neither."""
    arrived = [j for j in jobs if origin <= j[0] < end]
    return {
        **summary([1000 * (started - at) for at, _, started, _ in arrived if started is not None]),
        "claim": summary([1000 * (claimed - at) for at, claimed, _, _ in arrived if claimed is not None]),
    }


def windows(jobs: Sequence[Job], origin: float, end: float, width: float = WINDOW) -> list[dict[str, Any]]:
    """Per window of ``width`` seconds from ``origin`` to ``end`` (whole windows only): its start
    ``t`` (seconds from ``origin``), jobs arrived and finished per second in it, and the latencies of
    the jobs that arrived in it (``latencies``)."""
    count = max(0, int((end - origin) // width))
    arrived: list[list[Job]] = [[] for _ in range(count)]
    finished = [0] * count
    for job in jobs:
        if 0 <= (w := math.floor((job[0] - origin) / width)) < count:
            arrived[w].append(job)
        if job[3] is not None and 0 <= (f := math.floor((job[3] - origin) / width)) < count:
            finished[f] += 1
    return [
        {
            "t": w * width,
            "in_per_s": len(arrived[w]) / width,
            "done_per_s": finished[w] / width,
            **latencies(arrived[w], origin + w * width, origin + (w + 1) * width),
        }
        for w in range(count)
    ]


def passes(figures: dict[str, Any], rate: float) -> bool:
    """Whether a probe at ``rate`` shows that rate sustainable: p99 under ``LIMIT_MS`` at no less
    than ``REACHED`` of the rate offered."""
    p99 = figures["p99_ms"]
    return p99 is not None and p99 < LIMIT_MS and figures["in_per_s"] >= REACHED * rate


def next_rate(
    trials: Sequence[tuple[float, bool]],
    start: float,
    step: float = STEP,
    precision: float = PRECISION,
    most: int = MOST_PROBES,
) -> float | None:
    """The next rate to probe, given the probes so far (rate, passed) in order; None when done.

    From ``start``: up by ``step`` from the highest rate that passed while
    none above it failed, down by ``step`` from the lowest tried while none
    passed, else the geometric middle of the highest that passed and the
    lowest above it that failed, until they are within ``precision`` of
    each other; at most ``most`` probes.
    """
    if not trials:
        return start
    if len(trials) >= most:
        return None
    passed = [rate for rate, ok in trials if ok]
    if not passed:
        return min(rate for rate, _ in trials) / step
    low = max(passed)
    failed_above = [rate for rate, ok in trials if not ok and rate > low]
    if not failed_above:
        return low * step
    high = min(failed_above)
    if high <= low * (1 + precision):
        return None
    return math.sqrt(low * high)


def sustainable(trials: Sequence[tuple[float, bool]]) -> float | None:
    """The highest rate that passed, or None."""
    return max((rate for rate, ok in trials if ok), default=None)


# -- the runs


def offer(b: Bench, group: WorkerGroup, rate: float, seconds: float) -> dict[str, Any]:
    """The workers of ``group`` take ``WORKLOAD`` jobs offered at ``rate``/s for ``WARMUP`` and then
    ``seconds`` seconds; the figures of the jobs that arrived in those ``seconds``."""
    b.clear()
    with sampling() as samples, b._arriving(rate, WORKLOAD, catch_up=True) as arrivals:
        hold(WARMUP, group.check_alive)
        start = server_now(b)
        hold(seconds, group.check_alive)
        end = server_now(b)
    left = b._queued()
    wait_drained(b, group, timeout=DRAIN_TIMEOUT)
    drained = server_now(b)
    jobs: list[Job] = b.conn.execute(JOBS, [QUEUE]).fetchall()
    finished = sum(1 for *_, ft in jobs if ft is not None and start <= ft < end)
    arrived = sum(1 for at, *_ in jobs if start <= at < end)
    during = [s for s in samples if start <= s["at"] < end]
    b.clear()
    return {
        "rate": rate,
        # The database's clock (epoch seconds) at the first measured second: each window's
        # ``t`` counts from here, to be laid beside the server's own logs and monitoring.
        "origin": start,
        "seconds": end - start,
        "in_per_s": arrived / (end - start),
        "done_per_s": finished / (end - start),
        "producer_rate": arrivals.rate,
        **latencies(jobs, start, end),
        "left_queued": left,
        "drain_s": drained - end,
        "dead_max": max((s["dead"] for s in during), default=None),
        "probe_buffers_max": max((s["probe_buffers"] for s in during if "probe_buffers" in s), default=None),
        "windows": windows(jobs, start, end),
    }


def search(
    b: Bench, group: WorkerGroup, start: float, seconds: float, step: Callable[[str], None]
) -> tuple[float | None, list[dict[str, Any]]]:
    """The sustainable rate (None if no probe passed) and the probes, from ``start``."""
    probes: list[dict[str, Any]] = []
    while (rate := next_rate([(p["rate"], p["ok"]) for p in probes], start)) is not None:
        step(f"probe {len(probes) + 1}: {rate:,.0f} jobs/s for {WARMUP:g} + {seconds:g} s")
        figures = offer(b, group, rate, seconds)
        del figures["windows"]
        probes.append({**figures, "ok": passes(figures, rate)})
    return sustainable([(p["rate"], p["ok"]) for p in probes]), probes


def run(b: Bench, options: dict[str, Any], step: Callable[[str], None]) -> dict[str, Any]:
    """``--offered-load P[,P...]``: the drain rate and the search (unless ``--rate`` gives the
    sustainable rate), then each level, P % of the sustainable rate, with the same workers."""
    workers, concurrency, prefetch = max(options["workers"]), options["concurrency"][0], options["prefetch"]
    level_seconds = options["level_seconds"]
    probe_seconds = options["probe_seconds"] or level_seconds
    drain = None
    rate: float | None = options.get("rate")
    probes: list[dict[str, Any]] = []
    if not rate:
        step(
            f"measuring the drain rate: {options['repeat']} x {options['jobs']:,} jobs of "
            f"{JOB_SECONDS * 1000:g} ms, {workers} worker(s)"
        )
        drain = median_of(
            [
                b.process(options["jobs"], workers, concurrency, prefetch, workload=WORKLOAD)
                for _ in range(options["repeat"])
            ]
        )
    levels = []
    with b.workers(workers, _worker_args(concurrency, prefetch)) as group:
        if drain is not None:
            rate, probes = search(b, group, drain, probe_seconds, step)
        for percent in options["offered_load"] if rate else []:  # none if no probe passed
            step(
                f"level {percent} %: {rate * percent / 100:,.0f} jobs/s for {WARMUP:g} + {level_seconds:g} s"
            )
            levels.append({"percent": percent, **offer(b, group, rate * percent / 100, level_seconds)})
    return {
        "workers": workers,
        "concurrency": concurrency,
        "prefetch": prefetch,
        "job_seconds": JOB_SECONDS,
        "payload_bytes": PAYLOAD_BYTES,
        "limit_ms": LIMIT_MS,
        "warmup_s": WARMUP,
        "window_s": WINDOW,
        "drain_rate": drain,
        "probes": probes,
        "sustainable_rate": rate,
        "rate_given": drain is None,
        "levels": levels,
    }


# -- the table


#: The columns of the probes' and the levels' tables: heading, width, and how a run shows in it.
COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str]]] = [
    ("offered/s", 10, lambda r: f"{r['rate']:,.0f}"),
    ("in/s", 8, lambda r: f"{r['in_per_s']:,.0f}"),
    ("done/s", 8, lambda r: f"{r['done_per_s']:,.0f}"),
    ("p50 ms", 9, lambda r: show_ms(r["p50_ms"])),
    ("p95 ms", 9, lambda r: show_ms(r["p95_ms"])),
    ("p99 ms", 9, lambda r: show_ms(r["p99_ms"])),
    ("max ms", 9, lambda r: show_ms(r["max_ms"])),
    ("claim p99", 10, lambda r: show_ms(r["claim"]["p99_ms"])),
    ("left", 8, lambda r: f"{r['left_queued']:,}"),
    ("drain s", 8, lambda r: f"{r['drain_s']:.1f}"),
    ("dead", 9, lambda r: show_count(r["dead_max"])),
]


def _row(first: str, r: dict[str, Any]) -> str:
    return f"{first:<8}" + "".join(f"{show(r):>{width}}" for _, width, show in COLUMNS)


def render(result: dict[str, Any]) -> str:
    """The search and the levels as plain-text tables."""
    header = "        " + "".join(f"{heading:>{width}}" for heading, width, _ in COLUMNS)
    lines = [
        f"offered load: {result['workers']} worker(s) x concurrency {result['concurrency']}; jobs of "
        f"{result['job_seconds'] * 1000:g} ms (time.sleep) carrying {result['payload_bytes']} bytes, "
        "bulk inserts every 10 ms",
    ]
    if result["rate_given"]:
        lines.append(f"sustainable rate given: {result['sustainable_rate']:,.0f} jobs/s (no search)")
    else:
        lines += [
            f"drain rate (Bench.process, these jobs): {result['drain_rate']:,.0f} jobs/s",
            "",
            f"search: p99 under {result['limit_ms']:g} ms, at least {REACHED:.0%} of the rate offered",
            header.replace("        ", "probe   ", 1) + "  ok",
        ]
        for n, p in enumerate(result["probes"], 1):
            short = p["in_per_s"] < REACHED * p["rate"]
            lines.append(
                _row(str(n), p) + ("  yes" if p["ok"] else "  no, offered short" if short else "  no")
            )
        found = result["sustainable_rate"]
        lines += ["", f"sustainable rate: {found:,.0f} jobs/s" if found else "no probe passed: no levels run"]
    lines += ["", header.replace("        ", "level   ", 1)]
    for level in result["levels"]:
        lines.append(_row(f"{level['percent']} %", level))
    lines += [
        f"(each run: {result['warmup_s']:g} s of load first, then the figures of the jobs that arrived in",
        " the measured seconds, wherever claimed; in/s: jobs enqueued per second; done/s: finished;",
        " p50 to max: pickup latency, from the enqueue to the body's start; claim p99: to the claim",
        " (started_at); left: jobs unfinished when the load stopped;",
        " drain s: until none was; dead: n_dead_tup of the job table, the most sampled)",
    ]
    return "\n".join(lines)
