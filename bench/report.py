"""The bench's results as the plain-text table ``leasejobs_bench`` prints."""

import itertools
import statistics
from typing import Any

from bench.host import STEAL_SHOWN


def _n(value: float) -> str:
    return f"{value:,.0f}"


def _ratio(enqueue: dict[str, Any], kind: str, of: str) -> float:
    """``kind``'s jobs/s over ``of``'s: the median of each run's ratio where the runs are kept
    (their kinds took turns, so each run's pair saw the same disk), else of the medians."""
    runs = enqueue.get("single_runs")
    if runs:
        return float(statistics.median(run[kind] / run[of] for run in runs))
    return float(enqueue[kind] / enqueue[of])


def _throughput_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """Jobs/s of enqueue, processing and the raw-SQL limit, and the latency."""
    rows: list[tuple[str, str]] = []
    if "enqueue" in results:
        enqueue = results["enqueue"]

        def share(kind: str, of: str = "bare_insert_django") -> str:
            return f"{_ratio(enqueue, kind, of):.0%}"

        single = _n(enqueue["single"]) + " jobs/s"
        if "bare_insert_django" in enqueue:
            single += f"  ({share('single')} of the bare INSERT"
            if "bare_insert_django_cursor_each" in enqueue:
                single += f", {share('single', 'bare_insert_django_cursor_each')} of it"
                single += " with a cursor per statement"
            single += ")"
        rows.append(("enqueue, single (task.enqueue, Django connection)", single))
        if "statement" in enqueue:
            text = _n(enqueue["statement"]) + " jobs/s"
            if "bare_insert_django" in enqueue:
                text += f"  ({share('statement')} of the bare INSERT;"
                text += f" enqueue() is {share('single', 'statement')} of it)"
            rows.append(("enqueue's own INSERT sent bare (ENQUEUE_PLAIN, one cursor)", text))
        for kind, label in (
            ("bare_insert_django", "one cursor"),
            ("bare_insert_django_cursor_each", "a cursor each"),
        ):
            if kind in enqueue:
                label = f"bare INSERT, one row per statement (same Django connection, {label})"
                rows.append((label, _n(enqueue[kind]) + " jobs/s"))
        if "bare_insert_django_notify" in enqueue:
            text = _n(enqueue["bare_insert_django_notify"]) + " jobs/s"
            if "bare_insert_django" in enqueue:
                text += f"  ({share('bare_insert_django_notify')} of the bare INSERT)"
            rows.append(("bare INSERT with enqueue's NOTIFY (same Django connection, one cursor)", text))
        rows.append(("enqueue, bulk (bulk_enqueue, 1,000 per call)", _n(enqueue["bulk"]) + " jobs/s"))
        if "bulk_ids" in enqueue:
            rows.append(
                (
                    "enqueue, bulk ids (bulk_enqueue_ids, 1,000 per call)",
                    _n(enqueue["bulk_ids"]) + " jobs/s",
                )
            )
    if "raw_insert" in results:
        raw = results["raw_insert"]
        rows.append(("raw SQL limit, INSERT one job per statement", _n(raw["single"]) + " jobs/s"))
        rows.append(("raw SQL limit, INSERT 1,000 jobs per statement", _n(raw["bulk"]) + " jobs/s"))
    for f in results["processing"]:
        label = (
            f"processing, {f['workers']} worker(s) x concurrency {f['concurrency']}, {f['log_level'].upper()}"
        )
        if f["table_rows"]:
            label += f", {f['table_rows']:,} finished rows"
        if f.get("other_queue_jobs"):
            paused = results["settings"].get("all_queues")
            label += f", {f['other_queue_jobs']:,} queued in {'a paused' if paused else 'another'} queue"
        runs = ", ".join(_n(r) for r in f["runs"])
        value = f"{_n(f['median'])} jobs/s  (runs: {runs})"
        stolen = [x for x in f.get("steal", []) if x is not None]
        if stolen and max(stolen) >= STEAL_SHOWN:
            value += f"  host steal up to {max(stolen):.0%} of all CPUs' time in a run"
        if f.get("ideal"):
            label += f", {f['workload']} jobs"
            value += f"  {f['median'] / f['ideal']:.0%} of the ideal {_n(f['ideal'])}"
        rows.append((label, value))
    for r in results.get("raw_sql", []):
        label = f"raw SQL limit, {r['batch']} per statement, {r['clients']} client(s)"
        rows.append((label, f"{_n(r['median'])} jobs/s"))
    if "backlog" in results:
        rows += _backlog_rows(results["backlog"])
    if "steps" in results:
        st = results["steps"]
        n, jobs = st["steps_per_job"], st["jobs"]

        def cost(shape: str) -> str:
            text = f"{statistics.median(st[shape]['ms']):.2f} ms of drain time"
            d = st[shape].get("database")
            if d:
                text += f", WAL {d['wal_bytes']:,.0f} B, {d['xacts']:.2f} transactions" + (
                    f", PostgreSQL CPU {d['pg_cpu_us']:,.0f} µs" if d["pg_cpu_us"] is not None else ""
                )
            return text

        where = f"({jobs:,} of each, {st['workers']}w c{st['concurrency']})"
        rows.append((f"{n} no-op jobs {where}", cost("plain")))
        rows.append((f"a chain of {n} no-op jobs, each enqueued by the one before {where}", cost("chain")))
        ratios = [
            f"{statistics.median(st['steps']['ms']) / statistics.median(st[shape]['ms']):.0%} of {label}"
            for shape, label in (("plain", f"the {n} jobs"), ("chain", "the chain"))
        ]
        rows.append((f"one job of {n} durable steps {where}", cost("steps") + "; " + ", ".join(ratios)))
    if "latency_ms" in results:
        lat = results["latency_ms"]
        rows.append(
            (
                f"latency enqueue-to-start p50 / p95 / p99 ({lat['jobs']} jobs)",
                f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f} ms"
                f" (the enqueue call itself: p50 {lat['enqueue_p50']:.1f} ms)",
            )
        )
    if "latency_scheduled_ms" in results:
        lat = results["latency_scheduled_ms"]
        rows.append(
            (
                f"latency enqueue-to-start p50 / p95 / p99 ({lat['jobs']} jobs, "
                f"{lat['scheduled']:,} others due tomorrow)",
                f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f} ms",
            )
        )
    if "latency_under_load_ms" in results:
        lat = results["latency_under_load_ms"]
        rows.append(
            (
                f"latency under load p50 / p95 / p99 ({lat['jobs']} jobs, {_n(lat['load_reached'])} jobs/s "
                f"enqueued, {lat['left_behind']:,} left queued)",
                f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f} ms",
            )
        )
    return rows


def _cost_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    """What the figures cost: HOT updates of the jobs table, the workers' memory."""
    rows: list[tuple[str, str]] = []
    for f in results["processing"]:
        if f["updates"]:
            rows.append(
                (
                    f"HOT updates / updates, processing {f['workers']}w c{f['concurrency']} "
                    f"{f['log_level'].upper()}" + (" (large table)" if f["table_rows"] else ""),
                    f"{f['hot_updates']:,} / {f['updates']:,}",
                )
            )
    if "heartbeat_hot" in results:
        h = results["heartbeat_hot"]
        ratio = h["hot_updates"] / h["updates"] if h["updates"] else float("nan")
        rows.append(
            (
                "HOT updates / updates, heartbeats only",
                f"{h['hot_updates']:,} / {h['updates']:,} = {ratio:.0%}",
            )
        )
    for f in results["processing"]:
        d = f.get("database")
        if d:
            rows.append(
                (
                    f"database per job, processing {f['workers']}w c{f['concurrency']} "
                    f"{f['log_level'].upper()}" + (" (large table)" if f["table_rows"] else ""),
                    database_text(d),
                )
            )
    for f in results["processing"]:
        r = f["rss_mb"]
        rows.append(
            (
                f"worker RSS, {f['workers']}w c{f['concurrency']} {f['log_level'].upper()}"
                + (" (large table)" if f["table_rows"] else "")
                + " idle / 25% / end",
                f"{r['idle']} / {r['at_25pct'] or '-'} / {r['end']} MB",
            )
        )
    return rows


def database_text(d: dict[str, Any]) -> str:
    """One processing run's cost to PostgreSQL per job (bench/dbcost.py says how it is read)."""
    parts = [f"WAL {d['wal_bytes']:,.0f} B" + ("" if d["checkpointed"] else " (no checkpoint before)")]
    if d["wal_fpi"] is not None:
        parts.append(f"{d['wal_fpi']:.3f} full-page images")
    parts.append(f"{d['xacts']:.2f} transactions")
    if d["statements"] is not None:
        parts.append(f"{d['statements']:.2f} statements")
    parts.append(f"{d['rows_written']:.2f} row versions written ({d['dead_rows']:.2f} left dead)")
    if d["pg_cpu_us"] is not None:
        parts.append(f"PostgreSQL CPU {d['pg_cpu_us']:.1f} µs")
    return ", ".join(parts)


def _workload_text(workload: dict[str, Any] | None) -> str:
    if not workload or workload["kind"] == "noop":
        return "no-op"
    what = "waiting" if workload["kind"] == "io" else "CPU-bound"
    return f"{what} ({workload['seconds'] * 1000:g} ms)"


def render(results: dict[str, Any]) -> str:
    """The results as a plain-text table."""
    m = results["machine"]
    s = results["settings"]
    rows = _throughput_rows(results) + _cost_rows(results)
    width = max(len(label) for label, _ in rows) if rows else 0
    lines = [
        f"leasejobs_bench  {m['time']}  PostgreSQL {m['postgresql']}  {m['cpus']} CPUs  "
        f"load {' '.join(str(x) for x in m['load_before'])}"
        + ("  autovacuum off" if m.get("autovacuum") == "off" else ""),
        f"{s['jobs']:,} {_workload_text(s.get('workload'))} jobs per processing run, "
        f"median of {s['repeat']}, workers logging at "
        f"{' and '.join(s['worker_log_level']).upper()}, "
        f"prefetch {'default' if s['prefetch'] is None else s['prefetch']}, "
        f"workers claiming from {'every queue' if s.get('all_queues') else 'the bench queue'}",
        "",
    ]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    if m.get("steal") is not None:
        lines += [
            "",
            f"CPU time taken by the host (steal) during the whole run: {m['steal']:.1%} of all CPUs' time "
            "(CPU only: it says nothing of the disk)",
        ]
    if "table" in results:
        plan = results["table"]["claim_plan"]
        scans = [
            line.strip() for line in plan.splitlines() if "Scan" in line and "leasejobs_job_claim" in line
        ]
        lines += ["", "claim plan with the large table: " + (scans[0] if scans else "NO claim index scan!")]
    return "\n".join(lines) + "\n"


def _backlog_rows(bl: dict[str, Any]) -> list[tuple[str, str]]:
    """The backlog's line (the medians of its rounds), then a line per round when there are several."""
    rounds = bl["rounds"]
    label = (
        f"backlog of {bl['rows']:,} queued jobs, {bl['workers']} worker(s) x concurrency "
        f"{bl['concurrency']}, {bl['arrived']:,} enqueued meanwhile"
    )
    if len(rounds) > 1:
        label += f", median of {len(rounds)} rounds"
    value = f"{_n(bl['jobs_per_s'])} jobs/s"
    if bl["of_empty"] is not None:
        value += f"  ({bl['of_empty']:.0%} of the empty table's just before)"
    lines = [(label, value)]
    if (without := bl.get("without_vacuum")) is not None:
        value = f"{_n(without['jobs_per_s'])} jobs/s"
        if without["of_empty"] is not None:
            value += f"  ({without['of_empty']:.0%} of the empty table's)"
        lines.append(("the same, the workers with --no-vacuum", value))
    if len(rounds) > 1 or without is not None:
        for n, r in enumerate(rounds, 1):
            lines.append((f"  backlog round {n}", _drain(r, bl["rows"])))
            if "without_vacuum" in r:
                lines.append((f"  backlog round {n}, --no-vacuum", _drain(r["without_vacuum"], bl["rows"])))
    return lines


def _drain(r: dict[str, Any], rows: int) -> str:
    """One drain: jobs/s against its empty-table figure, and its pace early and late."""
    text = f"{_n(r['jobs_per_s'])} jobs/s"
    if r["empty"] is not None:
        text += f" against {_n(r['empty'])} empty ({r['of_empty']:.0%})"
    timeline = r.get("timeline") or []
    early, late = pace(timeline, rows, (0.1, 0.2)), pace(timeline, rows, (0.8, 0.9))
    if early is not None and late is not None:
        text += f"; {_n(early)} jobs/s in its 2nd tenth, {_n(late)} in its 9th"
    return text


def pace(timeline: list[tuple[float, int]], rows: int, between: tuple[float, float]) -> float | None:
    """Jobs/s of a drain of ``rows`` between two shares of them, from its (seconds, claimed) samples."""
    times = [_when(timeline, share * rows) for share in between]
    if times[0] is None or times[1] is None or times[1] <= times[0]:
        return None
    return (between[1] - between[0]) * rows / (times[1] - times[0])


def _when(timeline: list[tuple[float, int]], claimed: float) -> float | None:
    """When the drain had claimed ``claimed`` jobs, interpolated between samples."""
    for (t0, n0), (t1, n1) in itertools.pairwise(timeline):
        if n0 <= claimed <= n1 and n1 > n0:
            return t0 + (t1 - t0) * (claimed - n0) / (n1 - n0)
    return None
