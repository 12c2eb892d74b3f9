"""The argparse types of the management commands, without a database."""

import pytest

from leasejobs.management import arguments


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (arguments.positive_int, "3", 3),
        (arguments.positive_float, "0.5", 0.5),
        (arguments.non_negative_int, "0", 0),
        (arguments.non_negative_float, "0", 0.0),
        (arguments.positive_ints, "1, 2,4", [1, 2, 4]),
        (arguments.duration, "45", 45.0),
        (arguments.duration, "1.5h", 5400.0),
        (arguments.duration, "7d", 7 * 86400.0),
        (arguments.duration, "2w", 14 * 86400.0),
    ],
)
def test_good_words_parse(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (arguments.positive_int, "0"),
        (arguments.positive_int, "2.5"),
        (arguments.positive_float, "nan"),
        (arguments.positive_float, "inf"),
        (arguments.positive_float, "-1"),
        (arguments.non_negative_int, "-1"),
        (arguments.non_negative_float, "nan"),
        (arguments.non_negative_float, "-0.1"),
        (arguments.positive_ints, ","),
        (arguments.positive_ints, "1,0"),
        (arguments.duration, "-1d"),
        (arguments.duration, "7y"),
        (arguments.duration, "soon"),
    ],
)
def test_bad_words_are_refused(parse, text):
    with pytest.raises(ValueError):
        parse(text)


def test_argparse_names_what_was_expected():
    names = [arguments.positive_int.__name__, arguments.non_negative_float.__name__]
    assert names == ["positive int", "non-negative number"]
