"""The bench's processing figures as a PNG (``leasejobs_bench --plot``; needs matplotlib)."""

from typing import Any


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
    ax.set_xlabel("--concurrency (bodies at once per worker, one child process each)")
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


def plot_backlog(results: dict[str, Any], path: str) -> None:
    """Each backlog drain's pace (jobs/s over 2 s) against the jobs it had claimed; --no-vacuum dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backlog = results["backlog"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, r in enumerate(backlog["rounds"]):
        drains = [(r, "the worker's VACUUM", "-")]
        if "without_vacuum" in r:
            drains.append((r["without_vacuum"], "--no-vacuum", "--"))
        for drain, name, style in drains:
            points = _paces(drain["timeline"])
            ax.plot(
                [claimed / 1000 for claimed, _ in points],
                [rate for _, rate in points],
                color=colors[n % len(colors)],
                linestyle=style,
                linewidth=1,
                label=f"round {n + 1}, {name}: {drain['jobs_per_s']:,.0f} jobs/s",
            )
        if r["empty"]:
            ax.axhline(r["empty"], color=colors[n % len(colors)], linewidth=0.6, linestyle=":")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("backlog jobs claimed (thousands)")
    ax.set_ylabel("jobs/s over the last 2 s")
    m = results["machine"]
    ax.set_title(
        f"{backlog['rows']:,} queued no-op jobs drained by {backlog['workers']} workers while "
        f"{backlog['arrive_rate']:,.0f}/s arrive\n(dotted: the empty table just before; "
        f"{m['cpus']} CPUs, PostgreSQL {m['postgresql'].split()[0]})",
        fontsize=9,
    )
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _paces(timeline: list[tuple[float, int]], window: int = 4) -> list[tuple[float, float]]:
    """(claimed, jobs/s) over ``window`` samples (half a second apart), at each window's middle."""
    points = []
    for (t0, n0), (t1, n1) in zip(timeline, timeline[window:], strict=False):
        if t1 > t0:
            points.append(((n0 + n1) / 2, (n1 - n0) / (t1 - t0)))
    return points


def plot_pressure(result: dict[str, Any], path: str) -> None:
    """A ``--pressure`` run over time: pickup latency, throughput, dead tuples, the cost of a look at
    the front of the claim's index, table and index sizes, one panel each, the pressure phase shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]
    seconds = [s for s in result["per_second"] if s["t"] >= 0]
    samples = [s for s in result["samples"] if s["t"] >= 0]
    fig, axes = plt.subplots(5, 1, figsize=(8, 10.5), dpi=110, sharex=True)
    latency, throughput, dead, probe, sizes = axes
    latency.plot([s["t"] for s in seconds], [s["p99_ms"] for s in seconds], linewidth=0.8, label="p99")
    latency.plot([s["t"] for s in seconds], [s["p50_ms"] for s in seconds], linewidth=0.8, label="p50")
    latency.set_yscale("log")
    latency.set_ylabel("pickup latency, ms\n(per second)")
    throughput.plot(
        [s["t"] for s in seconds], [s["finished"] for s in seconds], linewidth=0.8, label="finished"
    )
    if seconds and "enqueued" in seconds[0]:
        throughput.plot(
            [s["t"] for s in seconds],
            [s["enqueued"] for s in seconds],
            linewidth=0.6,
            color="grey",
            label="enqueued",
        )
    throughput.axhline(result["rate"], color="k", linestyle=":", linewidth=0.8, label="offered")
    throughput.set_ylim(bottom=0)
    throughput.set_ylabel("jobs/s")
    dead.plot([s["t"] for s in samples], [s["dead"] for s in samples], linewidth=0.9, color="C3")
    dead.set_ylim(bottom=0)
    dead.set_ylabel("n_dead_tup\nof leasejobs_job")
    probed = [s for s in samples if "probe_buffers" in s]
    probe.plot([s["t"] for s in probed], [s["probe_buffers"] for s in probed], linewidth=0.9, color="C4")
    probe.set_yscale("log")
    probe.set_ylabel("buffers a look at\nthe claim index's\nfront touches")
    sizes.plot(
        [s["t"] for s in samples],
        [s["table_bytes"] / 2**20 for s in samples],
        linewidth=0.9,
        label="table",
        color="k",
    )
    # Indexes that stay empty (no row has their column) are left out.
    grown = {name for s in samples for name, size in s["indexes"].items() if size > 64 * 1024}
    for name in sorted(grown):
        sizes.plot(
            [s["t"] for s in samples],
            [s["indexes"].get(name, 0) / 2**20 for s in samples],
            linewidth=0.9,
            label=name,
        )
    sizes.set_yscale("log")
    sizes.set_ylabel("MB")
    sizes.set_xlabel("seconds from the start of the clean phase")
    for ax in axes:
        ax.axvspan(phases["pressure"]["start"], phases["pressure"]["end"], color="orange", alpha=0.15)
        if phases["after"]["end"] >= phases["after"]["start"] + 60:
            ax.axvline(phases["after"]["start"] + 60, color="grey", linewidth=0.6, linestyle="--")
        ax.grid(True, linewidth=0.3)
    for ax in (latency, throughput, sizes):
        ax.legend(fontsize=7, loc="upper left")
    v = result["verdict"]
    latency.set_title(
        f"pressure: {result['pressure']} (shaded); {result['workers']} workers, jobs offered at "
        f"{result['rate']:,.0f}/s\npressure p99 {v['p99_ratio'] or 0:.2f}x clean, jobs/s "
        f"{v['jobs_per_s_ratio'] or 0:.2f}x; dashed: one minute after the pressure ended",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_offered(result: dict[str, Any], path: str) -> None:
    """An ``--offered-load`` run: per level, the pickup latency p50, p95, p99 per window of arrival
    (the sustainable rate's bound dashed; dotted, the p99 to the claim alone) and the jobs enqueued and
    finished per second."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["levels"]
    fig, axes = plt.subplots(
        len(levels), 2, figsize=(10, 2.6 * len(levels) + 0.8), dpi=110, squeeze=False, sharex=True
    )
    highest = max((w["p99_ms"] or 0 for level in levels for w in level["windows"]), default=1.0)
    for (latency, throughput), level in zip(axes, levels, strict=True):
        t = [w["t"] for w in level["windows"]]
        for key, label in (("p99_ms", "p99"), ("p95_ms", "p95"), ("p50_ms", "p50")):
            latency.plot(t, [w[key] for w in level["windows"]], linewidth=0.9, label=label)
        claims = [w["claim"]["p99_ms"] for w in level["windows"]]
        latency.plot(t, claims, linewidth=0.7, linestyle=":", color="grey", label="p99 to the claim")
        latency.axhline(result["limit_ms"], color="k", linestyle="--", linewidth=0.7)
        latency.set_yscale("log")
        latency.set_ylim(top=max(highest, result["limit_ms"]) * 1.5)
        latency.set_ylabel(f"{level['percent']} %: {level['rate']:,.0f}/s\npickup latency, ms")
        throughput.plot(
            t, [w["in_per_s"] for w in level["windows"]], linewidth=0.6, color="grey", label="enqueued"
        )
        throughput.plot(t, [w["done_per_s"] for w in level["windows"]], linewidth=0.9, label="finished")
        throughput.axhline(level["rate"], color="k", linestyle=":", linewidth=0.8, label="offered")
        throughput.set_ylim(bottom=0)
        throughput.set_ylabel("jobs/s")
        for ax in (latency, throughput):
            ax.grid(True, linewidth=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    axes[0][1].legend(fontsize=7, loc="lower left")
    axes[-1][0].set_xlabel(f"seconds (window of arrival, {result['window_s']:g} s)")
    axes[-1][1].set_xlabel("seconds")
    m = result["machine"]
    how = "given" if result["rate_given"] else f"p99 < {result['limit_ms']:g} ms"
    fig.suptitle(
        f"{result['job_seconds'] * 1000:g} ms jobs, {result['payload_bytes']}-byte payload, offered by bulk "
        f"inserts to {result['workers']} runworker processes; "
        f"sustainable {result['sustainable_rate']:,.0f}/s "
        f"({how})\n{m['cpus']} CPUs, PostgreSQL {m['postgresql'].split()[0]}, load average before "
        f"{m['load_before'][0]:.1f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
