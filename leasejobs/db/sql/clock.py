"""The database clock as a value a test binds (``at_clock``), for the protocol simulation."""

import re

#: The parameter ``at_clock`` binds in place of the database clock.
CLOCK_PARAMETER = "clock"

#: Every spelling of "the time now" PostgreSQL accepts in these statements.
_CLOCK_CALL = re.compile(
    r"(?<![\w.])(?:pg_catalog\.)?(?:"
    r"(?:now|clock_timestamp|statement_timestamp|transaction_timestamp)\s*\(\s*\)"
    r"|(?:current_timestamp|localtimestamp)\b(?:\s*\(\s*\d+\s*\))?"
    r")",
    re.IGNORECASE,
)


def at_clock(statement: str) -> str:
    """``statement`` with every reading of the database clock replaced by ``%(clock)s``.

    For tests only (``tests/integration/test_protocol_simulation.py``): the
    statements then take their time from one bound ``timestamptz`` the test
    moves, so a lease runs out, a rate window ends or a periodic tick comes
    due when the test says, and ``now()``, ``clock_timestamp()`` and
    ``statement_timestamp()`` all read that one time. Workers never call it:
    their statements read the database clock as written.
    """
    return _CLOCK_CALL.sub(f"%({CLOCK_PARAMETER})s::timestamptz", statement)
