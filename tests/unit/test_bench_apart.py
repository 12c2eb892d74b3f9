"""The benchmark lives beside the library: a user's project, which installs leasejobs alone, never sees it."""

import ast
from pathlib import Path

from django.core.management import find_commands, get_commands

import leasejobs

LIBRARY = Path(leasejobs.__file__).parent
#: Repository code that is not shipped in the wheel, so the library must not need it.
OUTSIDE = {"bench", "localworkers", "localdb", "tests", "demo_site"}


def test_leasejobs_bench_comes_from_the_bench_app_not_from_the_library():
    assert "leasejobs_bench" not in find_commands(str(LIBRARY / "management"))
    assert "runworker" in find_commands(str(LIBRARY / "management"))  # the lookup itself works
    assert get_commands()["leasejobs_bench"] == "bench"  # installed by this repository's settings


def test_the_library_imports_nothing_from_the_repository_around_it():
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.relative_to(LIBRARY)}: {n}" for n in names if n.split(".")[0] in OUTSIDE]
    assert found == []
