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
