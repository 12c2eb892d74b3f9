"""The argparse types of the management commands, without a database."""

import argparse

import pytest

from leasejobs.management import arguments


@pytest.mark.parametrize(
    ("parse", "text", "value"),
    [
        (arguments.positive_int, "3", 3),
        (arguments.positive_float, "0.5", 0.5),
        (arguments.lease_seconds, "1", 1.0),
        (arguments.lease_seconds, "2.5", 2.5),
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
        (arguments.lease_seconds, "0.999"),
        (arguments.lease_seconds, "0"),
        (arguments.lease_seconds, "inf"),
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


@pytest.mark.parametrize(
    ("parse", "text", "sentence"),
    [
        (arguments.positive_int, "0", "'0' is not a whole number greater than 0: give one such as 1 or 8."),
        (
            arguments.positive_float,
            "nan",
            "'nan' is not a number greater than 0: give one such as 30 or 0.5.",
        ),
        (
            arguments.non_negative_int,
            "-1",
            "'-1' is not a whole number, 0 or more: give one such as 0 or 100.",
        ),
        (arguments.non_negative_float, "x", "'x' is not a number, 0 or more: give one such as 0 or 2.5."),
        (
            arguments.lease_seconds,
            "0.5",
            "'0.5' is not a lease of at least 1 second and a day at most: "
            "give a number of seconds such as 30 or 1.5.",
        ),
        (arguments.port, "70000", "'70000' is not a port number from 1 to 65535: give one such as 9100."),
        (
            arguments.positive_ints,
            "1,0",
            "'1,0' is not a list of whole numbers greater than 0: give them separated by commas, "
            "such as 1,2,4.",
        ),
        (
            arguments.duration,
            "1x",
            "'1x' is not a duration: give a number with a unit (s, m, h, d or w), such as 7d, 12h or 30m.",
        ),
    ],
)
def test_a_refusal_is_one_sentence_saying_what_to_give(parse, text, sentence):
    with pytest.raises(arguments.BadValue) as refused:
        parse(text)
    assert str(refused.value) == sentence


def test_argparse_prints_the_sentence_as_it_is():
    parser = argparse.ArgumentParser(prog="leasejobs_prune", exit_on_error=False)
    parser.add_argument("--older-than", type=arguments.duration)
    with pytest.raises(argparse.ArgumentError) as refused:
        parser.parse_args(["--older-than", "1x"])
    assert str(refused.value) == (
        "argument --older-than: '1x' is not a duration: give a number with a unit (s, m, h, d or w), "
        "such as 7d, 12h or 30m."
    )
