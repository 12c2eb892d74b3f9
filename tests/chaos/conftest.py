"""Fixtures of the chaos scenarios.

Each scenario records one line of figures (jobs, kills, reclaims, stale
writes rejected, duplicates found, ...) as a property of its test report
(``CHAOS_FIGURES``), which pytest-xdist carries from the process that ran it:
tests/conftest.py prints them in a section of pytest's terminal summary, so
they appear in every run's log (CI included) without ``-s``, also when the
scenario failed, whichever phase ran it.
"""

from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos.helpers import figures_line
from tests.conftest import CHAOS_FIGURES


@pytest.fixture
def record_figures(request: pytest.FixtureRequest) -> Callable[[str, dict[str, Any]], None]:
    """Keep a scenario's figures for the summary, then fail on any problem they list."""

    def record(name: str, figures: dict[str, Any]) -> None:
        request.node.user_properties.append((CHAOS_FIGURES, figures_line(name, figures)))
        problems = figures.get("problems") or []
        assert not problems, f"{len(problems)} problem(s), first ones: " + "; ".join(problems[:10])

    return record
