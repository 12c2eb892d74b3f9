"""Fixtures of the chaos scenarios, and their figures in the terminal summary.

Each scenario records one line of figures (jobs, kills, reclaims, stale
writes rejected, duplicates found, ...). They are printed in a section of
pytest's terminal summary, so they appear in every run's log (CI included)
without ``-s``, also when the scenario failed.
"""

from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos.helpers import figures_line

FIGURES = pytest.StashKey[list[str]]()


@pytest.fixture
def record_figures(request: pytest.FixtureRequest) -> Callable[[str, dict[str, Any]], None]:
    """Keep a scenario's figures for the summary, then fail on any problem they list."""

    def record(name: str, figures: dict[str, Any]) -> None:
        request.config.stash.setdefault(FIGURES, []).append(figures_line(name, figures))
        problems = figures.get("problems") or []
        assert not problems, f"{len(problems)} problem(s), first ones: " + "; ".join(problems[:10])

    return record


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(FIGURES, [])
    if lines:
        terminalreporter.section("leasejobs chaos figures")
        for line in lines:
            terminalreporter.write_line(line)
