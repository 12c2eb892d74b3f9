"""Tests are laid out as tests/unit, tests/integration, tests/chaos; markers follow the folders."""

from pathlib import Path

import pytest

from tests import conftest

TESTS = Path(conftest.__file__).resolve().parent


class Item:
    """What ``conftest.mark`` reads of a collected test."""

    def __init__(self, path: Path, fixtures: tuple[str, ...] = (), transaction: bool = False) -> None:
        self.path = path
        self.nodeid = f"{path.relative_to(TESTS.parent)}::test_it"
        self.fixturenames = fixtures
        self.db = pytest.mark.django_db(transaction=True).mark if transaction else None
        self.markers: list[str] = []

    def get_closest_marker(self, name: str):
        return self.db if name == "django_db" else None

    def add_marker(self, marker) -> None:
        self.markers.append(marker.name)


def test_markers_follow_the_folders():
    items = [Item(TESTS / d / "test_it.py") for d in ("unit", "integration", "chaos")]
    conftest.mark(items)
    assert [i.markers for i in items] == [[], ["integration"], ["chaos"]]


def test_a_test_file_outside_the_three_folders_stops_collection_in_a_sentence():
    with pytest.raises(pytest.UsageError) as stopped:
        conftest.mark([Item(TESTS / "test_it.py")])
    assert str(stopped.value) == (
        "tests/test_it.py is outside tests/unit/, tests/integration/ and tests/chaos/: "
        "move it into the folder its tests belong to."
    )


@pytest.mark.parametrize(
    ("fixtures", "transaction", "uses"),
    [
        (("start_worker", "transactional_db"), False, "start_worker, transactional_db"),
        (("live_server",), False, "live_server"),
        ((), True, "django_db(transaction=True)"),
    ],
)
def test_a_unit_test_that_is_an_integration_test_stops_collection(fixtures, transaction, uses):
    with pytest.raises(pytest.UsageError) as stopped:
        conftest.mark([Item(TESTS / "unit" / "test_it.py", fixtures, transaction)])
    assert str(stopped.value) == (
        f"tests/unit/test_it.py::test_it is in tests/unit/ but uses {uses}: move it to tests/integration/."
    )
