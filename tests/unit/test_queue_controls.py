"""Queue controls as a user sees them: real runworker processes, real signals.

Concurrency is read from the jobs' own journal (``tests.journal``), never
from the queue's tables: the question is how many bodies ran at once, not
what the queue believes.
Rates are read from the database's claim times (``started_at``), the clock
the limit is defined on.
"""

from django.core.checks import run_checks
from django.test import override_settings

# -- never over the limit --------------------------------------------------------


# -- tied to the lease -------------------------------------------------------------


# -- pause and resume ----------------------------------------------------------------


# -- limits changed at run time ---------------------------------------------------------


# -- per-key limits and fairness -----------------------------------------------------------


# -- rate limits -----------------------------------------------------------------------------


# -- bad limits --------------------------------------------------------------------------------


def test_bad_limits_are_refused_with_one_sentence():
    for queues, words in (
        ({"email": {"rate": "lots"}}, "rate 'lots' is not of the form"),
        ({"pdf": {"concurrency": -1}}, "concurrency -1 must be a whole number of at least 1"),
        ({"pdf": {"concurency": 2}}, "unknown option(s) concurency"),
    ):
        with override_settings(LEASEJOBS={"QUEUES": queues}):
            errors = [e for e in run_checks() if e.id == "leasejobs.E003"]
        assert len(errors) == 1 and words in errors[0].msg, errors
