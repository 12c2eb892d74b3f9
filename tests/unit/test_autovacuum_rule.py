"""The autovacuum warning's sentence: said when either switch is off, and which one."""

import pytest

from leasejobs.operations.autovacuum import problem


def test_no_warning_when_the_server_and_the_table_both_vacuum():
    assert problem(server=True, table=True) is None


@pytest.mark.parametrize(
    ("server", "table", "says"),
    [
        (False, True, "does not run on this PostgreSQL server"),
        (False, False, "does not run on this PostgreSQL server"),
        (True, False, "off for leasejobs_job (autovacuum_enabled = false)"),
    ],
)
def test_the_warning_names_the_switch_that_is_off_and_what_to_do(server, table, says):
    sentence = problem(server=server, table=table)
    assert sentence is not None
    assert says in sentence
    assert "VACUUM leasejobs_job" in sentence
