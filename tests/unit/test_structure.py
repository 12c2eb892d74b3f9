"""docs/architecture.md cannot drift from the code (issue 30).

``python docs/structure.py --check`` holds the page's layers and module
tables to the code; this runs it on the repository, then plants each kind
of drift on a copy and sees the check say so.
"""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "structure.py"

spec = importlib.util.spec_from_file_location("structure", SCRIPT)
assert spec is not None and spec.loader is not None
structure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(structure)


def test_the_architecture_page_matches_the_code():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, "docs/architecture.md matches the code.\n")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "leasejobs", tmp_path / "leasejobs", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "architecture.md", tmp_path / "docs" / "architecture.md")
    assert structure.problems(tmp_path) == []
    return tmp_path


def _doc(root: Path) -> Path:
    return root / "docs" / "architecture.md"


def _row(module: str, layer: str, imports: str = "—") -> str:
    return f"| `{module}` | {layer} | planted | {imports} |\n"


def _add_row(root: Path, row: str) -> None:
    text = _doc(root).read_text()
    at = text.index("| `conf` |")
    _doc(root).write_text(text[:at] + row + text[at:])


def test_a_module_the_page_does_not_list(copy: Path):
    (copy / "leasejobs" / "db" / "planted.py").write_text('"""Planted."""\n')
    assert structure.problems(copy) == [
        "db.planted: a module of the code that docs/architecture.md does not list"
    ]


def test_a_row_for_a_module_that_is_gone(copy: Path):
    _add_row(copy, _row("db.gone", "database"))
    assert structure.problems(copy) == ["db.gone: listed in docs/architecture.md but no such module"]


def test_an_imports_column_that_is_wrong(copy: Path):
    path = copy / "leasejobs" / "jobs" / "binding.py"
    path.write_text(path.read_text() + "\nfrom leasejobs import conf  # noqa\n")
    assert structure.problems(copy) == [
        "jobs.binding: its imports column misses ['conf'] and names [] wrongly"
    ]


def test_a_module_without_a_known_layer(copy: Path):
    (copy / "leasejobs" / "db" / "planted.py").write_text('"""Planted."""\n')
    _add_row(copy, _row("db.planted", "nowhere"))
    assert structure.problems(copy) == ["db.planted: its layer 'nowhere' is not in the layers table"]


def test_an_import_circle(copy: Path):
    (copy / "leasejobs" / "db" / "one.py").write_text("from leasejobs.db import two  # noqa\n")
    (copy / "leasejobs" / "db" / "two.py").write_text("from leasejobs.db import one  # noqa\n")
    _add_row(copy, _row("db.one", "database", "`db.two`"))
    _add_row(copy, _row("db.two", "database", "`db.one`"))
    assert structure.problems(copy) == ["import circle: db.one <-> db.two"]


def test_an_import_to_a_higher_layer(copy: Path):
    (copy / "leasejobs" / "db" / "planted.py").write_text("from leasejobs.worker import rules  # noqa\n")
    _add_row(copy, _row("db.planted", "database", "`worker.rules`"))
    assert structure.problems(copy) == ["db.planted imports worker.rules, of a higher layer"]


def test_a_module_over_the_line_limit(copy: Path):
    (copy / "leasejobs" / "db" / "planted.py").write_text("x = 1\n" * (structure.MAX_LINES + 1))
    _add_row(copy, _row("db.planted", "database"))
    assert structure.problems(copy) == [f"db.planted: {structure.MAX_LINES + 1} lines, over 600"]
