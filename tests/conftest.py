"""Fixtures shared by the suite: real worker processes against the test database.

Markers follow the folders, so that no test file has to say it: ``chaos``
for everything under tests/chaos/ (it restarts PostgreSQL, cuts the network,
kills workers in storms), ``integration`` for everything under
tests/integration/ (tests that start processes or servers or commit to the
database), none for tests/unit/: ``make test-fast`` runs those (``-m "not
integration and not chaos"``). Collection stops, with one sentence, at a test
file outside the three folders, and at a unit test that uses what makes a
test an integration test (``start_worker``, ``transactional_db`` or
``django_db(transaction=True)``, ``live_server``).

Phases: ``make test`` runs pytest twice. ``--phase=parallel`` selects the
tests that can share the machine with other test processes (run under
pytest-xdist, each process with a test database of its own);
``--phase=serial`` selects those that must run alone: the chaos scenarios
that restart the PostgreSQL server, cut the network, refuse to run while
sessions of other databases are connected, or hold a clock to a bound, and
the tests marked ``alone`` (whose timing extra load upsets). The chaos storms
(marked ``storm``: kills and pauses of their own workers, checked for
correctness only) share the machine in the parallel phase. The other tests
are deselected (and counted so). Without ``--phase`` (plain ``pytest``)
every test runs.
"""

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import connection_budget
from tests.helpers import WorkerProcess, worker_env

#: Fixtures whose tests are integration tests (the fixtures they use count too).
INTEGRATION_FIXTURES = {"start_worker", "transactional_db", "live_server"}
TESTS_DIR = Path(__file__).resolve().parent
UNIT_DIR = TESTS_DIR / "unit"
INTEGRATION_DIR = TESTS_DIR / "integration"
CHAOS_DIR = TESTS_DIR / "chaos"


PHASES = ("all", "parallel", "serial")
#: The name of a chaos scenario's line of figures among its report's user properties.
CHAOS_FIGURES = "leasejobs chaos figures"
#: The files of the parallel phase's longest tests, longest first (one to four minutes
#: each on a loaded machine: the README's every block, fresh virtualenvs, a long simulation).
LONGEST = [
    INTEGRATION_DIR / name for name in ("test_readme.py", "test_quickstart.py", "test_protocol_simulation.py")
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=PHASES,
        default="all",
        help="parallel: the tests that can share the machine; serial: those that must run alone "
        "(the chaos suite); all (default): every test",
    )


def runs_alone(item: pytest.Item) -> bool:
    """A test of the serial phase: it must not share the PostgreSQL server or the machine."""
    if item.get_closest_marker("alone") is not None:
        return True
    return item.get_closest_marker("chaos") is not None and item.get_closest_marker("storm") is None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark(items)
    phase = config.getoption("phase")
    if phase == "all":
        return
    keep, drop = [], []
    for item in items:
        (keep if runs_alone(item) == (phase == "serial") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if phase == "parallel":
        # pytest-xdist hands tests out in this order: the longest first, or one
        # started last runs on alone while the other processes have nothing left.
        # Then the group of the tests that need most connections (one process runs them
        # one after another: tests/connection_budget.py), the smallest needs first, as they
        # fit beside the longest tests' own.
        rank = {path: n for n, path in enumerate(LONGEST)}
        items.sort(key=lambda item: (rank.get(Path(item.path), len(LONGEST)), _large_need(item)))


def _large_need(item: pytest.Item) -> int:
    """The test's need of connections if it is in the large group, else more than any need."""
    need = connection_budget.need_of(item)
    return need if need is not None and need > connection_budget.LARGE else connection_budget.BUDGET + 1


class GroupCheck:
    """In an xdist process under ``--dist loadgroup``: every grouped test carries its group.

    pytest-xdist marks a test's group by appending ``@group`` to its node id
    (in its own pytest_collection_modifyitems, hence trylast here), which
    pytest 9.2 no longer lets it do (pytest-xdist issue 1386): the tests of a
    group would then run at once in several processes, silently.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False):
            return
        lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist's --dist loadgroup does not group with pytest {pytest.__version__} "
                f"(pytest-xdist issue 1386), e.g. {lost[0]}; install pytest<9.2 or use TEST_WORKERS=0"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(GroupCheck(), "leasejobs-xdist-group-check")


def mark(items: list[pytest.Item]) -> None:
    """Mark each test by its folder; stop at a test in no folder or a unit test that is not one."""
    for item in items:
        path = Path(item.path)
        if CHAOS_DIR in path.parents:
            item.add_marker(pytest.mark.chaos)
        elif INTEGRATION_DIR in path.parents:
            item.add_marker(pytest.mark.integration)
        elif UNIT_DIR in path.parents:
            uses = integration_uses(item)
            if uses:
                raise pytest.UsageError(
                    f"{item.nodeid} is in tests/unit/ but uses {uses}: move it to tests/integration/."
                )
        else:
            raise pytest.UsageError(
                f"{path.relative_to(TESTS_DIR.parent)} is outside tests/unit/, tests/integration/ and "
                "tests/chaos/: move it into the folder its tests belong to."
            )


def integration_uses(item: pytest.Item) -> str:
    """What of an integration test ``item`` uses (a worker, a committed transaction, a server), or ''."""
    found = sorted(INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    db = item.get_closest_marker("django_db")
    if db is not None and db.kwargs.get("transaction"):
        found.append("django_db(transaction=True)")
    return ", ".join(found)


@pytest.fixture(autouse=True)
def connection_budget_held(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``many_connections(n)`` holds ``n`` of the parallel phase's budget while it runs.

    Autouse, so set up before the fixtures the test asks for (``start_worker``,
    ``bench_env``, ...) and torn down after them, when its workers are gone.
    See tests/connection_budget.py.
    """
    need = connection_budget.need_of(request.node)
    processes = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if need is None or processes is None:
        yield
        return
    # The directory above each xdist process's own: shared by the processes of this run only.
    path = tmp_path_factory.getbasetemp().parent / "connection-budget.json"
    with connection_budget.hold(path, need, int(processes)):
        yield


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runworker`` processes (with the given CLI args); all are killed at teardown.

    Depends on ``transactional_db`` so the jobs a test enqueues are committed
    where the worker processes can see them, and the workers are gone before
    the tables are flushed.
    """
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, prefix: Sequence[str] = ()) -> WorkerProcess:
        log = tmp_path / f"worker-{len(started) + 1}.log"
        worker = WorkerProcess(list(args), log, worker_env(**(env or {})), prefix)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The chaos scenarios' figures (tests/chaos/conftest.py), one line each, by test id.

    Read from the reports, not from the process that ran the scenario: under
    pytest-xdist that is another process, and its report is what comes back.
    """
    lines = sorted(
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for name, value in getattr(report, "user_properties", ())
        if name == CHAOS_FIGURES
    )
    if lines:
        terminalreporter.section(CHAOS_FIGURES)
        for _nodeid, line in lines:
            terminalreporter.write_line(line)
