"""The pressure bench's verdict: within the tolerance of the clean phase, and when it recovered after."""

from bench.pressure import at_or_before, holds, recovered_after, render, verdict

CLEAN = {"jobs_per_s": 1000.0, "p99_ms": 50.0}


def window(t: float, jobs_per_s: float, p99_ms: float | None) -> dict[str, float | None]:
    return {"t": t, "jobs_per_s": jobs_per_s, "p99_ms": p99_ms}


def test_holding_is_one_sided_a_faster_or_quicker_phase_holds():
    assert holds(1000.0, 60.0, CLEAN)  # p99 20 % above: on the line
    assert holds(800.0, 50.0, CLEAN)  # jobs/s 20 % below: on the line
    assert holds(1500.0, 10.0, CLEAN)  # catching up on a backlog is no failure
    assert not holds(1000.0, 60.1, CLEAN)
    assert not holds(799.0, 50.0, CLEAN)
    assert not holds(1000.0, None, CLEAN)  # no job claimed in it


def test_recovery_is_the_first_of_two_windows_in_a_row_that_hold():
    windows = [
        window(0, 700.0, 40.0),  # too slow
        window(10, 1000.0, 45.0),  # holds, but the next does not
        window(20, 1000.0, 90.0),
        window(30, 1000.0, 55.0),
        window(40, 990.0, 58.0),
        window(50, 1000.0, 200.0),  # a later spike does not undo the recovery
    ]
    assert recovered_after(windows, CLEAN) == 30.0


def test_the_last_window_may_stand_alone_and_none_is_none():
    assert recovered_after([window(0, 100.0, 500.0), window(10, 1000.0, 50.0)], CLEAN) == 10.0
    assert recovered_after([window(0, 100.0, 500.0), window(10, 100.0, 500.0)], CLEAN) is None
    assert recovered_after([], CLEAN) is None


def test_the_verdict_compares_the_pressure_phase_with_the_clean_one():
    got = verdict(CLEAN, {"jobs_per_s": 900.0, "p99_ms": 100.0}, [window(0, 1000.0, 50.0)])
    assert got["p99_ratio"] == 2.0 and got["jobs_per_s_ratio"] == 0.9
    assert not got["held"] and got["recovered_after_s"] == 0.0


def test_the_phase_end_takes_the_last_sample_before_it():
    samples = [{"at": 1.0, "dead": 1}, {"at": 2.0, "dead": 2}, {"at": 3.5, "dead": 3}]
    assert at_or_before(samples, 3.0) == {"at": 2.0, "dead": 2}
    assert at_or_before(samples, 0.5) is None


def test_the_table_names_every_index_it_was_given_and_the_verdict():
    phase = {
        "start": 0.0,
        "end": 60.0,
        "jobs_per_s": 1000.0,
        "p50_ms": 5.0,
        "p99_ms": 50.0,
        "max_ms": 80.0,
        "left_queued": 3,
        "dead_end": 1234,
        "xmin_age_max": 10,
        "table_bytes_end": 2**20,
        "indexes_end": {"some_index": 2**21, "another": 2**20},
    }
    result = {
        "pressure": "long-transaction",
        "workers": 2,
        "concurrency": 4,
        "rate": 1000.0,
        "measured_rate": 2000.0,
        "arrive_rate": 999.0,
        "arrived": 60000,
        "phases": {"clean": phase, "pressure": phase, "after": phase},
        "verdict": verdict(phase, phase, [window(0, 1000.0, 50.0)]),
        "detail": {"xid": 7},
    }
    text = render(result)
    assert "some_index: clean 2.0" in text and "another: clean 1.0" in text
    assert "within 20%" in text and "NOT" not in text
    assert "recovered 0 s after the pressure ended" in text
    assert "clean phase" not in text  # no cost read (nothing finished): no line

    cost = {
        "wal_bytes": 1168.0,
        "wal_fpi": 0.022,
        "xacts": 0.29,
        "statements": None,
        "rows_written": 3.13,
        "dead_rows": 2.23,
        "pg_cpu_us": None,
        "checkpointed": True,
    }
    text = render({**result, "clean_database": cost})
    assert "clean phase (a steady flow): WAL 1,168 B, 0.022 full-page images" in text
