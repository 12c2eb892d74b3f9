"""Every test docs/guarantees.md names as the attack on a promise exists.

A promise whose test was renamed or removed would still read as proved;
this keeps the page honest as the suite changes. It checks names only: a
file by its name under tests/, a test function by its name in any test file.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "guarantees.md"
#: A code span that names a test file, a test, or both: `test_x.py`, `chaos/test_x.py::test_y`, `::test_y`.
REFERENCE = re.compile(r"`([^`\s]*?test_\w*\.py)?(?:::(test_\w+)(?:\[[^\]`]*\])?)?`")


def _suite() -> tuple[set[str], set[str]]:
    files = {p.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return files, names


def test_every_test_the_guarantees_name_exists():
    files, names = _suite()
    missing: list[str] = []
    for match in REFERENCE.finditer(DOC.read_text()):
        file, name = match.groups()
        if file is None and name is None:
            continue
        if file is not None:
            pattern = file.removeprefix("tests/").replace("*", "[^/]*")
            if not any(re.fullmatch(f"(.*/)?{pattern}", f) for f in files):
                missing.append(file)
        if name is not None and name not in names:
            missing.append(f"::{name}")
    assert not missing, f"docs/guarantees.md names tests that do not exist: {sorted(set(missing))}"
