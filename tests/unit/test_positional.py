"""Statements run with ``$n`` placeholders converted once (``leasejobs.db.connection.positional``)."""

import psycopg
import pytest

from leasejobs.db.connection import connection_params, positional, run


def test_names_become_numbers_in_order_of_first_use_and_percent_signs_unescape():
    text, names = positional("SELECT %(a)s, %(b)s, %(a)s WHERE x LIKE 'y%%'")
    assert (text, names) == ("SELECT $1, $2, $1 WHERE x LIKE 'y%'", ("a", "b"))
    assert positional("SELECT 1") == ("SELECT 1", ())


@pytest.mark.django_db
def test_a_statement_answers_as_it_does_through_psycopgs_own_placeholders():
    query = "SELECT %(n)s::int + %(m)s::int, %(n)s::int, %(words)s::text[], 'a%%' LIKE 'a%%'"
    params = {"n": 2, "m": 40, "words": ["x", "y"], "unused": object()}
    with psycopg.connect(**connection_params(), autocommit=True) as conn:
        expected = conn.execute(query, params).fetchall()
        assert run(conn, query, params).fetchall() == expected == [(42, 2, ["x", "y"], True)]
