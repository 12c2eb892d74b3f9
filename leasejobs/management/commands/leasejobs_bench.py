"""``manage.py leasejobs_bench``: enqueue and process no-op jobs, print the figures.

See ``leasejobs.bench`` for what is measured and how, and docs/performance.md
for figures and how to read them.
"""

import statistics
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leasejobs import bench
from leasejobs.management.arguments import non_negative_int, positive_float, positive_int, positive_ints

#: runworker's verbosity for each log level.
VERBOSITY = {"warning": 0, "info": 1}


def _log_levels(text: str) -> list[str]:
    """An argparse type: warning, info, or both separated by a comma."""
    levels = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not levels or any(level not in VERBOSITY for level in levels):
        raise ValueError(text)
    return levels


_log_levels.__name__ = "log level (warning, info, or warning,info)"


class Command(BaseCommand):
    help = (
        "Benchmark leasejobs on this database: enqueue (single and bulk), processing no-op jobs "
        "with real runworker processes, and enqueue-to-start latency (p50, p95, p99). Run it "
        "against a database no other worker uses."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--jobs",
            type=non_negative_int,
            default=10_000,
            help="Jobs per processing run (10,000; 0 skips).",
        )
        parser.add_argument(
            "--workers",
            type=positive_ints,
            default=[1, 2],
            metavar="N[,N...]",
            help="Worker processes; a list measures each (default 1,2).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_ints,
            default=[4],
            metavar="N[,N...]",
            help="Runner threads per worker; a list measures each (default 4, runworker's default).",
        )
        parser.add_argument(
            "--prefetch", type=non_negative_int, metavar="N", help="Passed to runworker (default: its own)."
        )
        parser.add_argument(
            "--repeat",
            type=positive_int,
            default=3,
            metavar="N",
            help="Runs per figure; the median is shown (3).",
        )
        parser.add_argument(
            "--enqueue-jobs",
            type=non_negative_int,
            default=10_000,
            help="Jobs per enqueue figure (10,000; 0 skips).",
        )
        parser.add_argument(
            "--latency-jobs",
            type=non_negative_int,
            default=200,
            help="Jobs for the latency figure (200; 0 skips).",
        )
        parser.add_argument(
            "--latency-rate", type=positive_float, default=20.0, help="Latency jobs enqueued per second (20)."
        )
        parser.add_argument(
            "--raw-sql",
            action="store_true",
            help="Also measure bare claim + finish statements through psycopg: the limit in this run.",
        )
        parser.add_argument(
            "--raw-batches", type=positive_ints, default=[1, 10, 50], metavar="N[,N...]", help="(1,10,50)"
        )
        parser.add_argument(
            "--raw-clients", type=positive_ints, default=[1, 2], metavar="N[,N...]", help="(1,2)"
        )
        parser.add_argument(
            "--raw-jobs",
            type=non_negative_int,
            default=0,
            help="Jobs per raw run (default: 10,000 x batch, <= 100,000).",
        )
        parser.add_argument(
            "--table-rows",
            type=non_negative_int,
            default=0,
            metavar="N",
            help="Then insert N finished jobs and measure processing again (and show the claim plan).",
        )
        parser.add_argument(
            "--hot",
            action="store_true",
            help="Also measure HOT updates in a window where only heartbeats write (~10 s).",
        )
        parser.add_argument(
            "--worker-log-level",
            type=_log_levels,
            default=["info"],
            metavar="LEVEL[,LEVEL]",
            help="The workers' log level: info (runworker's default, one line per claim and finish, "
            "to a file) or warning (runworker -v 0); warning,info measures processing at both.",
        )
        parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
        parser.add_argument(
            "--plot",
            metavar="FILE.png",
            help="Draw processing jobs/s against concurrency, one line per worker count (needs matplotlib).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["plot"]:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise CommandError("--plot needs matplotlib: pip install matplotlib") from None
        b = bench.Bench(verbosity=VERBOSITY[options["worker_log_level"][0]], progress=not options["json"])
        try:
            results = self._run(b, options)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        finally:
            b.close()
        if options["json"]:
            self.stdout.write(bench.to_json(results))
        else:
            self.stdout.write(render(results))
        if options["plot"]:
            plot(results, options["plot"])
            self.stderr.write(f"plot written to {options['plot']}")

    def _step(self, options: dict[str, Any], text: str) -> None:
        if not options["json"] and options["verbosity"] > 0:
            self.stderr.write(f"... {text}")

    def _run(self, b: bench.Bench, options: dict[str, Any]) -> dict[str, Any]:
        repeat = options["repeat"]
        results: dict[str, Any] = {
            "machine": bench.machine(),
            "settings": {
                "jobs": options["jobs"],
                "repeat": repeat,
                "prefetch": options["prefetch"],
                "worker_log_level": options["worker_log_level"],
            },
        }
        others = b.other_workers()
        if others:
            self.stderr.write(
                f"warning: {others} other leasejobs worker(s) are connected to this database; "
                "if they listen to all queues they take bench jobs and fail them."
            )
        if options["enqueue_jobs"]:
            self._step(options, f"enqueue {options['enqueue_jobs']:,} jobs, single and bulk")
            n = options["enqueue_jobs"]
            results["enqueue"] = {
                "single": statistics.median(b.enqueue_single(n) for _ in range(repeat)),
                "bulk": statistics.median(b.enqueue_bulk(n) for _ in range(repeat)),
            }
        if options["raw_sql"] and options["enqueue_jobs"]:
            n = options["enqueue_jobs"]
            self._step(options, f"raw SQL: insert {n:,} jobs, one and 1,000 per statement")
            results["raw_insert"] = {
                "single": statistics.median(b.raw_insert(n, 1) for _ in range(repeat)),
                "bulk": statistics.median(b.raw_insert(n, 1000) for _ in range(repeat)),
            }
        if options["raw_sql"]:
            results["raw_sql"] = []
            for batch in options["raw_batches"]:
                for clients in options["raw_clients"]:
                    jobs = options["raw_jobs"] or min(100_000, 10_000 * batch)
                    self._step(options, f"raw SQL: {batch} per statement, {clients} client(s), {jobs:,} jobs")
                    runs = [b.raw_sql(batch, clients, jobs) for _ in range(repeat)]
                    results["raw_sql"].append(
                        {"batch": batch, "clients": clients, "runs": runs, "median": statistics.median(runs)}
                    )
        results["processing"] = self._processing(b, options, table_rows=0) if options["jobs"] else []
        if options["table_rows"] and options["jobs"]:
            self._step(options, f"insert {options['table_rows']:,} finished jobs")
            seconds = b.prefill(options["table_rows"])
            results["table"] = {"rows": options["table_rows"], "prefill_seconds": seconds}
            results["processing"] += self._processing(b, options, table_rows=options["table_rows"])
            results["table"]["claim_plan"] = b.claim_plan()
        if options["latency_jobs"]:
            self._step(options, f"latency: {options['latency_jobs']} jobs at {options['latency_rate']:g}/s")
            results["latency_ms"] = b.latency(
                options["latency_jobs"], options["latency_rate"], options["concurrency"][0]
            )
        if options["hot"]:
            self._step(options, "HOT updates while only heartbeats write")
            results["heartbeat_hot"] = b.heartbeat_hot()
        return results

    def _processing(self, b: bench.Bench, options: dict[str, Any], table_rows: int) -> list[dict[str, Any]]:
        figures = []
        for level in options["worker_log_level"]:
            b.verbosity = VERBOSITY[level]
            for workers in options["workers"]:
                for concurrency in options["concurrency"]:
                    self._step(
                        options,
                        f"processing {options['jobs']:,} jobs: {workers} worker(s) x concurrency "
                        f"{concurrency}, logging {level.upper()}"
                        + (f", {table_rows:,} finished rows in the table" if table_rows else ""),
                    )
                    runs = [
                        b.process(options["jobs"], workers, concurrency, options["prefetch"])
                        for _ in range(options["repeat"])
                    ]
                    figures.append(
                        {
                            "workers": workers,
                            "concurrency": concurrency,
                            "log_level": level,
                            "table_rows": table_rows,
                            "runs": [round(r["jobs_per_s"]) for r in runs],
                            "median": bench.median_of(runs),
                            "updates": sum(r["updates"] for r in runs),
                            "hot_updates": sum(r["hot_updates"] for r in runs),
                            "rss_mb": runs[-1]["rss_mb"],
                        }
                    )
        b.verbosity = VERBOSITY[options["worker_log_level"][0]]
        return figures


def _n(value: float) -> str:
    return f"{value:,.0f}"


def render(results: dict[str, Any]) -> str:
    """The results as a plain-text table."""
    m = results["machine"]
    s = results["settings"]
    rows: list[tuple[str, str]] = []
    if "enqueue" in results:
        rows.append(
            (
                "enqueue, single (task.enqueue, Django connection)",
                _n(results["enqueue"]["single"]) + " jobs/s",
            )
        )
        rows.append(
            ("enqueue, bulk (bulk_enqueue, 1,000 per call)", _n(results["enqueue"]["bulk"]) + " jobs/s")
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
        runs = ", ".join(_n(r) for r in f["runs"])
        rows.append((label, f"{_n(f['median'])} jobs/s  (runs: {runs})"))
    for r in results.get("raw_sql", []):
        label = f"raw SQL limit, {r['batch']} per statement, {r['clients']} client(s)"
        rows.append((label, f"{_n(r['median'])} jobs/s"))
    if "latency_ms" in results:
        lat = results["latency_ms"]
        rows.append(
            (
                f"latency enqueue-to-start p50 / p95 / p99 ({lat['jobs']} jobs)",
                f"{lat['p50']:.1f} / {lat['p95']:.1f} / {lat['p99']:.1f} ms",
            )
        )
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
        r = f["rss_mb"]
        rows.append(
            (
                f"worker RSS, {f['workers']}w c{f['concurrency']} {f['log_level'].upper()}"
                + (" (large table)" if f["table_rows"] else "")
                + " idle / 25% / end",
                f"{r['idle']} / {r['at_25pct'] or '-'} / {r['end']} MB",
            )
        )
    width = max(len(label) for label, _ in rows) if rows else 0
    lines = [
        f"leasejobs_bench  {m['time']}  PostgreSQL {m['postgresql']}  {m['cpus']} CPUs  "
        f"load {' '.join(str(x) for x in m['load_before'])}",
        f"{s['jobs']:,} no-op jobs per processing run, median of {s['repeat']}, workers logging at "
        f"{' and '.join(s['worker_log_level']).upper()}, "
        f"prefetch {'default' if s['prefetch'] is None else s['prefetch']}",
        "",
    ]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    if "table" in results:
        plan = results["table"]["claim_plan"]
        scans = [
            line.strip() for line in plan.splitlines() if "Scan" in line and "leasejobs_job_claim" in line
        ]
        lines += ["", "claim plan with the large table: " + (scans[0] if scans else "NO claim index scan!")]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: str) -> None:
    """Processing jobs/s against concurrency, one line per worker count, raw limits dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    figures = [f for f in results["processing"] if not f["table_rows"]]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    worker_counts = sorted({f["workers"] for f in figures})
    for workers, level in sorted(
        {(f["workers"], f["log_level"]) for f in figures}, key=lambda k: (k[1], k[0])
    ):
        points = sorted(
            (f["concurrency"], f["median"])
            for f in figures
            if (f["workers"], f["log_level"]) == (workers, level)
        )
        ax.plot(
            [c for c, _ in points],
            [v for _, v in points],
            marker="o",
            color=colors[worker_counts.index(workers) % len(colors)],
            linestyle="-" if level == "warning" else ":",
            label=f"leasejobs, {workers} worker process{'es' if workers > 1 else ''}, {level.upper()}",
        )
    ax.set_xscale("log", base=2)
    ticks = sorted({f["concurrency"] for f in figures})
    ax.set_xticks(ticks, labels=[str(t) for t in ticks])
    raw = results.get("raw_sql", [])
    clients = max((r["clients"] for r in raw), default=0)
    highest = max([f["median"] for f in figures] + [r["median"] for r in raw if r["clients"] == clients])
    ax.set_ylim(0, highest * 1.12)
    for r in raw:
        if r["clients"] == clients and r["batch"] > 1:
            ax.axhline(r["median"], linestyle="--", linewidth=0.8, color="grey")
            ax.text(
                0.01,
                r["median"],
                f"raw SQL limit, {r['batch']} jobs per statement, {clients} clients",
                transform=ax.get_yaxis_transform(),
                fontsize=7,
                color="grey",
                va="bottom",
            )
    ax.set_xlabel("--concurrency (runner threads per worker)")
    ax.set_ylabel("no-op jobs/s")
    m = results["machine"]
    ax.set_title(
        f"no-op jobs drained by runworker, {m['cpus']} CPUs, PostgreSQL {m['postgresql'].split()[0]}",
        fontsize=10,
    )
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1, 0.93))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
