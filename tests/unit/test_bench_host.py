"""The bench's reading of the CPU time the host takes (steal) from /proc/stat."""

import pathlib

import pytest

from bench import host
from bench.report import render


def test_the_share_is_the_steal_ticks_over_all_ticks_between_two_readings():
    assert host.steal_share((10, 1_000), (60, 2_000)) == pytest.approx(0.05)
    assert host.steal_share((10, 1_000), (10, 1_500)) == 0.0


def test_no_share_without_two_readings_or_without_time_between_them():
    assert host.steal_share(None, (1, 2)) is None
    assert host.steal_share((1, 2), None) is None
    assert host.steal_share((5, 100), (5, 100)) is None


@pytest.mark.skipif(not pathlib.Path("/proc/stat").exists(), reason="Linux's /proc/stat is not here")
def test_the_reading_counts_steal_within_all_cpu_time_and_both_only_grow():
    first = host.cpu_ticks()
    assert first is not None
    sum(range(200_000))  # some CPU time between the readings
    second = host.cpu_ticks()
    assert second is not None
    assert 0 <= first[0] <= first[1]
    assert second[0] >= first[0] and second[1] >= first[1]


def test_the_table_shows_the_steal_of_the_run_and_beside_a_figure_that_lost_cpu():
    results = {
        "machine": {
            "time": "now", "postgresql": "15", "cpus": 2, "load_before": [0.1, 0.1, 0.1], "steal": 0.031,
        },
        "settings": {"jobs": 10, "repeat": 2, "worker_log_level": ["info"], "prefetch": None},
        "processing": [
            {"workers": w, "concurrency": 4, "log_level": "info", "table_rows": 0, "runs": [100, 90],
             "median": 95, "steal": steal, "updates": 0, "hot_updates": 0,
             "rss_mb": {"idle": 80, "at_25pct": 81, "end": 81}}
            for w, steal in ((1, [0.0, 0.01]), (2, [0.0, 0.13]))
        ],
    }  # fmt: skip
    table = render(results)
    assert "CPU time taken by the host (steal) during the whole run: 3.1% of all CPUs' time" in table
    one, two = (line for line in table.splitlines() if line.startswith("processing"))
    assert "steal" not in one
    assert two.endswith("host steal up to 13% of all CPUs' time in a run")
