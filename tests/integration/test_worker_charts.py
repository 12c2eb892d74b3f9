"""Running workers keep the overview's charts warm: closed buckets stored while nobody looks.

Real ``runworker`` processes, and no page: the vacuum thread of one of them
stores every chart's closed buckets of both windows (``leasejobs.worker.charts``),
once between them, so that the page later finds them stored and reads only
the current bucket (docs/scaling.md, issue 32: a day computed cold took a
second at 10M jobs).
"""

import datetime as dt
import re

from django.db.models.functions import Now

from leasejobs.admin import charts
from leasejobs.db import chartpoints
from leasejobs.models import ChartPoint, Job
from tests.helpers import wait_until

#: Every closed bucket of both windows, for each of the four charts.
ALL_BUCKETS = len(chartpoints.CHARTS) * (59 + 95)

STORED = r"stored (\d+) closed buckets of the overview's charts worker=\S+"


def _marks() -> int:
    return ChartPoint.objects.filter(series="").count()


def test_workers_store_every_closed_bucket_once_between_them_while_nobody_looks(start_worker):
    # Finished jobs only: the workers have nothing to claim, their charts something to count.
    # 20 minutes ago or more is a closed quarter hour whatever the time, and the three are
    # 30 minutes apart or more: three quarter hours, two of them within the hour.
    for minutes in (20, 50, 300):
        Job.objects.create(
            task_name="t",
            status="done",
            attempt=1,
            run_at=Now() - dt.timedelta(minutes=minutes + 1),
            started_at=Now() - dt.timedelta(minutes=minutes + 0.5),
            finished_at=Now() - dt.timedelta(minutes=minutes),
        )
    started = [start_worker("-v", "2") for _ in range(2)]
    wait_until(lambda: _marks() >= ALL_BUCKETS, 30, what="every closed bucket stored")
    # Every bucket was computed once: the buckets the workers say they stored add up to
    # those stored (a minute may close meanwhile: read until the two agree).
    wait_until(
        lambda: sum(int(n) for worker in started for n in re.findall(STORED, worker.log())) == _marks(),
        10,
        what="the workers' stored buckets adding up to those in the table",
    )
    for worker in started:
        assert "cannot store the overview charts" not in worker.log(), worker.log()
    finished = ChartPoint.objects.filter(chart="throughput", series="finished", value__gt=0)
    assert sorted(finished.filter(step_seconds=60).values_list("value", flat=True)) == [1.0, 1.0]
    assert sorted(finished.filter(step_seconds=900).values_list("value", flat=True)) == [1.0, 1.0, 1.0]
    # The page now reads the current bucket only, and finds what the workers stored.
    _, values = charts.points("throughput", charts.WINDOWS["day"])
    assert sum(v for v in values["finished"].values() if v) == 3
