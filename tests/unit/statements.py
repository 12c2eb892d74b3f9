"""Every statement text leasejobs can run, gathered from the code (issue 30).

Two sources, both read without a database: the module-level string
constants of leasejobs' modules that start like SQL (the statements and the
pieces they are built from), and the string literals passed straight to an
``execute`` call. ``python -m tests.unit.statements`` writes them to
``statements_before_issue30.json``, the snapshot taken before the statements
moved into ``leasejobs/db/``; tests/unit/test_statements.py holds the code
to it, so that a move cannot change a statement's text by one byte.

New shared fragments (``leasejobs.db.sql.fragments``) are left out: they are
pieces of the snapshotted statements, which are compared whole.
"""

import ast
import contextlib
import importlib
import json
import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("statements_before_issue30.json")
SQL = re.compile(r"\s*(WITH|SELECT|INSERT|UPDATE|DELETE|VACUUM|NOTIFY|LISTEN|SET|LOCK)\b")
LEFT_OUT = {"leasejobs.db.sql.fragments"}


def module_names() -> list[str]:
    names = []
    for path in sorted((ROOT / "leasejobs").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if name not in LEFT_OUT:
            names.append(name)
    return names


def collect() -> dict[str, str]:
    """``{where: text}`` for every statement text (where: module.NAME or file:line)."""
    found: dict[str, str] = {}
    pieces: set[str] = set()
    for left_out in LEFT_OUT:
        with contextlib.suppress(ImportError):  # before the move
            pieces.update(v for v in vars(importlib.import_module(left_out)).values() if isinstance(v, str))
    for name in module_names():
        try:
            module = importlib.import_module(name)
        except (ImportError, ImproperlyConfigured):  # the Django Tasks modules before Django 6: no statement
            continue
        for attr, value in vars(module).items():
            if (
                attr.lstrip("_").isupper()
                and isinstance(value, str)
                and SQL.match(value)
                and value not in pieces
            ):
                found[f"{name}.{attr}"] = value
        path = Path(module.__file__ or "")
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "execute"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found[f"{path.relative_to(ROOT)}:{node.lineno}"] = node.args[0].value
    return found


if __name__ == "__main__":
    import django

    django.setup()
    SNAPSHOT.write_text(json.dumps(collect(), indent=1, sort_keys=True) + "\n")
