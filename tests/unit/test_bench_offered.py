"""The offered-load bench's pure part: latency over windows of arrival, and the search for the
sustainable rate."""

from typing import Any

import pytest

from bench.offered import latencies, next_rate, passes, render, summary, sustainable, windows


def test_summary_percentiles_and_none_without_jobs():
    got = summary([float(n) for n in range(1, 101)])
    assert got["jobs"] == 100 and got["max_ms"] == 100.0
    assert got["p50_ms"] == pytest.approx(50.5)
    assert got["p95_ms"] == pytest.approx(95.05)
    assert got["p99_ms"] == pytest.approx(99.01)
    assert summary([]) == {"jobs": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}


def test_latency_counts_from_the_arrival_to_the_body_and_to_the_claim():
    # (arrived, claimed, started, finished)
    jobs = [(10.0, 10.002, 10.005, 10.007), (10.5, 10.51, 10.53, 10.54), (11.0, 11.1, None, None)]
    got = latencies(jobs, 10.0, 11.0)
    assert got["jobs"] == 2 and got["max_ms"] == pytest.approx(30.0)
    assert got["claim"]["jobs"] == 2 and got["claim"]["max_ms"] == pytest.approx(10.0)
    late = latencies(jobs, 11.0, 12.0)  # claimed, its body not started yet: in the claim's only
    assert late["jobs"] == 0 and late["claim"]["jobs"] == 1


def test_windows_group_latency_by_arrival_and_finishes_by_finish():
    jobs = [
        (100.2, 100.21, 100.25, 100.26),
        (100.9, 101.5, 101.6, 101.7),  # arrived in window 0, claimed, started and finished in 1
        (101.1, 101.11, 101.12, 101.13),
        (102.5, 102.6, 102.7, 102.8),  # after the end: left out
        (99.0, 99.1, 99.2, 100.5),  # arrived before: only its finish counts
    ]
    got = windows(jobs, origin=100.0, end=102.4, width=1.0)  # two whole windows
    assert [w["t"] for w in got] == [0.0, 1.0]
    assert [w["in_per_s"] for w in got] == [2.0, 1.0]
    assert [w["done_per_s"] for w in got] == [2.0, 2.0]
    assert got[0]["max_ms"] == pytest.approx(700.0) and got[0]["claim"]["max_ms"] == pytest.approx(600.0)
    assert got[1]["jobs"] == 1 and got[1]["p50_ms"] == pytest.approx(20.0)


def test_an_empty_window_has_no_percentiles():
    got = windows([(100.5, 100.6, 100.7, 100.8)], origin=100.0, end=105.0, width=2.5)
    assert [w["jobs"] for w in got] == [1, 0] and got[1]["p99_ms"] is None


def test_a_probe_passes_under_the_bound_at_the_rate_offered():
    assert passes({"p99_ms": 99.0, "in_per_s": 1000.0}, 1000.0)
    assert not passes({"p99_ms": 100.0, "in_per_s": 1000.0}, 1000.0)  # the bound itself fails
    assert not passes({"p99_ms": 20.0, "in_per_s": 900.0}, 1000.0)  # the producer fell short
    assert not passes({"p99_ms": None, "in_per_s": 1000.0}, 1000.0)


def run_search(limit: float, start: float) -> list[float]:
    """The rates the search probes against a queue that sustains exactly ``limit``."""
    trials: list[tuple[float, bool]] = []
    while (rate := next_rate(trials, start)) is not None:
        trials.append((rate, rate <= limit))
    return [rate for rate, _ in trials]


def test_the_search_steps_down_from_the_drain_rate_then_narrows_the_gap():
    rates = run_search(limit=700.0, start=1000.0)
    assert rates[:3] == [1000.0, 800.0, 640.0]  # down by 1.25 until one passes
    assert len(rates) <= 8
    found = sustainable([(r, r <= 700.0) for r in rates])
    assert found is not None and 700.0 / 1.1 <= found <= 700.0


def test_the_search_steps_up_while_probes_pass():
    rates = run_search(limit=1500.0, start=1000.0)
    assert rates[:3] == [1000.0, 1250.0, 1562.5]
    found = sustainable([(r, r <= 1500.0) for r in rates])
    assert found is not None and 1500.0 / 1.1 <= found <= 1500.0


def test_the_search_ends_after_the_most_probes_and_may_find_nothing():
    rates = run_search(limit=0.0, start=1000.0)
    assert len(rates) == 8 and rates[-1] == pytest.approx(1000.0 / 1.25**7)
    assert sustainable([(r, False) for r in rates]) is None


def test_a_noisy_failure_below_a_pass_does_not_bound_the_gap():
    # 800 passed, 1000 and 894 failed above it, 600 failed by noise below it: the gap is 800 to 894
    trials = [(1000.0, False), (800.0, True), (894.4, False), (600.0, False)]
    assert next_rate(trials, 1000.0) == pytest.approx((800.0 * 894.4) ** 0.5)
    assert sustainable(trials) == 800.0


def run_figures(rate: float, p99: float, in_per_s: float) -> dict[str, Any]:
    return {
        "rate": rate,
        "in_per_s": in_per_s,
        "done_per_s": in_per_s,
        "p50_ms": 5.0,
        "p95_ms": 20.0,
        "p99_ms": p99,
        "max_ms": 2 * p99,
        "claim": {"p99_ms": p99 / 2},
        "left_queued": 12,
        "drain_s": 0.4,
        "dead_max": 3456,
    }


def test_the_table_shows_the_search_and_each_level():
    result = {
        "workers": 2,
        "concurrency": 4,
        "job_seconds": 0.001,
        "payload_bytes": 256,
        "limit_ms": 100.0,
        "warmup_s": 5.0,
        "rate_given": False,
        "drain_rate": 2000.0,
        "probes": [
            {**run_figures(2000.0, 900.0, 2000.0), "ok": False},
            {**run_figures(1600.0, 40.0, 1200.0), "ok": False},
            {**run_figures(1280.0, 40.0, 1280.0), "ok": True},
        ],
        "sustainable_rate": 1280.0,
        "levels": [{"percent": 50, **run_figures(640.0, 30.0, 640.0)}],
    }
    text = render(result)
    assert "drain rate (Bench.process, these jobs): 2,000 jobs/s" in text
    assert "no, offered short" in text and text.count("  yes") == 1
    assert "sustainable rate: 1,280 jobs/s" in text
    assert any(line.startswith("50 %") and "640" in line and "30.0" in line for line in text.splitlines())
    result.update(probes=[result["probes"][0]], sustainable_rate=None, levels=[])
    assert "no probe passed: no levels run" in render(result)
