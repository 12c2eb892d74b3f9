"""The bench table's single-enqueue shares pair each run's figures, which took turns on the same disk."""

from bench.report import _ratio


def test_a_share_is_the_median_of_each_runs_own_ratio_not_a_ratio_of_medians():
    runs = [
        {"single": 100.0, "bare_insert_django": 200.0},  # a slow disk: 50 %
        {"single": 300.0, "bare_insert_django": 400.0},  # 75 %
        {"single": 700.0, "bare_insert_django": 1000.0},  # a fast one: 70 %
    ]
    enqueue = {"single": 300.0, "bare_insert_django": 400.0, "single_runs": runs}
    assert _ratio(enqueue, "single", "bare_insert_django") == 0.7  # the medians would say 0.75


def test_without_the_runs_a_share_is_the_ratio_of_the_medians():
    assert _ratio({"single": 30.0, "statement": 40.0}, "single", "statement") == 0.75
