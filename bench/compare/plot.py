"""Draw ``compare.py --json-out`` results as one PNG: a panel per workload, and the latency.

    .venv/bin/python bench/compare/plot.py noop.json io.json cpu.json --out docs/peers.png

Runs with the project's own virtualenv and needs matplotlib (``pip install
matplotlib``; not a dependency of leasejobs). Each processing panel shows the
median jobs/s of every queue and configuration of one run, with the ideal
where the workload has one; the latency panel shows p50 and p99 of the idle
enqueue-to-start latency.
"""

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"leasejobs": "#2a7ab9", "PgQueuer 1.6": "#e08a2b", "procrastinate 3.10": "#6a9f3a"}


def processing_panel(ax: Any, run: dict[str, Any]) -> None:
    rows = [r for r in run["rows"] if r["what"] == "processing" and r["queue"] != "raw SQL limit"]
    rows.sort(key=lambda r: r["median"])
    labels = [f"{r['queue']}: {r['config']}" for r in rows]
    ax.barh(labels, [r["median"] for r in rows], color=[COLORS.get(r["queue"], "grey") for r in rows])
    ideals = {r["ideal"] for r in rows if r.get("ideal")}
    for ideal in ideals:
        ax.axvline(ideal, color="black", linestyle="--", linewidth=1)
        ax.text(ideal, len(rows) - 0.5, " ideal", va="bottom", fontsize=8)
    work = run.get("workload", {"kind": "noop"})
    title = {"noop": "no-op jobs", "io": f"jobs waiting {work.get('seconds', 0) * 1000:g} ms",
             "cpu": f"jobs computing {work.get('seconds', 0) * 1000:g} ms"}[work["kind"]]  # fmt: skip
    ax.set_title(f"{title}: jobs/s (median of {run['repeat']})", fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="x", alpha=0.3)


def latency_panel(ax: Any, latency: list[dict[str, Any]]) -> None:
    labels = [f"{r['queue']}: {r['config']}" for r in latency]
    y = range(len(latency))
    ax.barh([i + 0.2 for i in y], [r["p50"] for r in latency], height=0.4, label="p50",
            color=[COLORS.get(r["queue"], "grey") for r in latency])  # fmt: skip
    ax.barh([i - 0.2 for i in y], [r["p99"] for r in latency], height=0.4, label="p99",
            color=[COLORS.get(r["queue"], "grey") for r in latency], alpha=0.45)  # fmt: skip
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.set_title("idle enqueue-to-start latency, ms (dark p50, light p99)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="compare.py --json-out files")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = [json.loads(p.read_text()) for p in args.runs]
    latency = [r for run in runs for r in run.get("latency", [])]
    panels = len(runs) + (1 if latency else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels), dpi=110, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=False):
        processing_panel(ax, run)
    if latency:
        latency_panel(axes[-1, 0], latency)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
