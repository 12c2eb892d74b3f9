"""Issue 10's eight ways a worker ran a job twice or stalled, each as a user sees it.

Real ``runworker`` processes against PostgreSQL, real signals. Each test
asserts what a user observes: the job's final status, how often its body ran
and which side effects it left (the test app's ``BodyRun`` and ``Sent``
journals), the worker's exit code; log wording only where the item is about
the log. Waits are bounded and generous: the machine running them is shared.
A wait that would only end in a failure on broken code also ends as soon as a
body runs a second time, so a regression fails fast.
"""

import math

import pytest

from leasejobs import task
from leasejobs.models import Job
from tests.testapp.models import BodyRun


def runs(job: Job) -> int:
    return BodyRun.objects.filter(job_id=job.id).count()


# -- 1, 2: a side-effect block longer than the lease -------------------------------


# -- 3: a task's own short lease ---------------------------------------------------


# -- 4: one bad value fails one job, never the worker -------------------------------


@pytest.mark.parametrize("option", ["lease_seconds", "timeout_seconds"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_4_a_task_option_out_of_range_is_refused_at_definition(option, value):
    def body():
        return None

    with pytest.raises(ValueError, match=option):
        task(name=f"out-of-range-{option}-{value}", **{option: value})(body)


# -- 5: fencing matches the holder ----------------------------------------------------


# -- 6: cancels ------------------------------------------------------------------------


# -- 7: only attempts whose body started count -------------------------------------


# -- 8: edges of input --------------------------------------------------------------------
