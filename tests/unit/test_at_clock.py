"""``sql.at_clock``: every statement leasejobs holds, rendered at a clock the test binds.

The protocol simulation (``tests/integration/test_protocol_simulation.py``) runs the
real statements with time as a value it moves; one clock call left in a
statement would read the real clock and make the simulation lie. So every
module-level SQL string of the package is rendered here, and what is left is
read with a tokenizer of its own (not ``at_clock``'s pattern): no word of
PostgreSQL's clock is left outside comments, and no ``'now'`` literal.
"""

import importlib
import pkgutil
import re

import pytest
from django.core.exceptions import ImproperlyConfigured

import leasejobs
from leasejobs.db import sql

#: Every way PostgreSQL reads the clock, as words (``timeofday()`` and the
#: date/time ones included, though leasejobs uses none of them).
CLOCK_WORDS = {
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "current_timestamp",
    "localtimestamp",
    "current_time",
    "current_date",
    "localtime",
    "timeofday",
}

#: The modules that must hold SQL (a move of the SQL elsewhere must move these too).
MUST_HOLD_SQL = {
    "leasejobs.db.sql.claim",
    "leasejobs.db.sql.leases",
    "leasejobs.db.sql.periodic",
    "leasejobs.db.sql.queues",
    "leasejobs.db.sql.workers",
}

_STATEMENT_START = re.compile(r"^\s*(?:\(?\s*)(SELECT|INSERT|UPDATE|DELETE|WITH|VACUUM)\b", re.MULTILINE)


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(leasejobs.__path__, "leasejobs."):
        if ".migrations" in info.name or info.name.endswith("pytest_plugin"):
            continue
        names.append(info.name)
    return sorted(names)


def _statements() -> list[tuple[str, str]]:
    found = []
    for module_name in _modules():
        try:
            module = importlib.import_module(module_name)
        except (ImportError, ImproperlyConfigured):  # an extra not installed; the backend before Django 6
            continue
        for name, value in vars(module).items():
            if (
                isinstance(value, str)
                and _STATEMENT_START.search(value)
                and ("leasejobs_" in value or "now()" in value)
            ):
                found.append((f"{module_name}.{name}", value))
    return found


STATEMENTS = _statements()


def _code_words(text: str) -> tuple[set[str], list[str]]:
    """The lower-cased words of ``text`` outside comments and string literals, and its literals."""
    text = re.sub(r"--[^\n]*", " ", text)
    literals = re.findall(r"'((?:[^']|'')*)'", text)
    text = re.sub(r"'(?:[^']|'')*'", " ", text)
    text = re.sub(r"%\([a-z_]+\)s", " ", text)  # parameters: not SQL words
    return set(re.findall(r"[a-z_][a-z0-9_]*", text.lower())), literals


def test_the_statements_are_found_in_every_module_holding_sql() -> None:
    modules = {name.rsplit(".", 1)[0] for name, _ in STATEMENTS}
    assert modules >= MUST_HOLD_SQL, MUST_HOLD_SQL - modules
    assert len(STATEMENTS) >= 40


@pytest.mark.parametrize(("name", "statement"), STATEMENTS, ids=[n for n, _ in STATEMENTS])
def test_no_clock_call_is_left_at_the_clock(name: str, statement: str) -> None:
    rendered = sql.at_clock(statement)
    words, literals = _code_words(rendered)
    assert not words & CLOCK_WORDS, f"{name} still reads the clock: {sorted(words & CLOCK_WORDS)}"
    assert not {lit.strip().lower() for lit in literals} & {"now", "today"}, name
    # Only clock calls changed: the statement without its clock parameter is the original's words.
    before, _ = _code_words(statement)
    assert words | (before & CLOCK_WORDS) == before | ({"timestamptz"} if rendered != statement else set())
    if before & CLOCK_WORDS:
        assert f"%({sql.CLOCK_PARAMETER})s::timestamptz" in rendered


def test_every_spelling_is_replaced_and_nothing_else() -> None:
    text = (
        "SELECT now(), NOW( ), pg_catalog.now(), clock_timestamp(), Statement_Timestamp(),"
        " transaction_timestamp(), current_timestamp, CURRENT_TIMESTAMP(3), localtimestamp,"
        " j.now_ish, nowhere, renowned, x.current_timestamp_col"
    )
    rendered = sql.at_clock(text)
    assert rendered.count("%(clock)s::timestamptz") == 9
    assert "j.now_ish, nowhere, renowned, x.current_timestamp_col" in rendered
    assert sql.at_clock("SELECT 1 FROM leasejobs_job") == "SELECT 1 FROM leasejobs_job"


def test_production_statements_are_unchanged() -> None:
    assert "now()" in sql.HEARTBEAT and "%(clock)s" not in sql.HEARTBEAT
    assert all("%(clock)s" not in statement for _, statement in STATEMENTS)
