"""The cost of periodic scheduling per tick: the TICK statement, timed against a real database.

Run: ``DJANGO_SETTINGS_MODULE=tests.settings DATABASE_URL=... python bench/periodic/cost.py``
(it migrates nothing: run ``manage.py migrate`` first). It declares one
schedule, then times ``Scheduler.run_due()`` (cronsim plus one TICK
statement, round trip included) in the three cases a worker meets:

- "wins": the tick is due and this worker inserts its job;
- "loses": another worker already enqueued the tick (the row's last tick is
  past it), so the statement changes nothing;
- "early": the worker woke a little before the database clock reached the tick.

and, for comparison, a bare ``SELECT 1`` round trip on the same connection.
The schedule, its row and its jobs are deleted at the end.
"""

import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from leasejobs.jobs import registry  # noqa: E402
from leasejobs.models import Job, PeriodicSchedule  # noqa: E402
from leasejobs.periodic.scheduler import Scheduler  # noqa: E402
from leasejobs.periodic.schedules import _check  # noqa: E402

ROUNDS = 500
NAME = "bench-periodic-cost"


def timed(setup: Callable[[], object], action: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(ROUNDS):
        setup()
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    registry.autodiscover()
    schedule = _check({"task": "tests.testapp.tasks.add", "cron": "* * * * *", "name": NAME, "args": [1, 2]})
    scheduler = Scheduler("bench", [schedule])
    scheduler.run_due()
    state = scheduler._state[NAME]
    row = PeriodicSchedule.objects.filter(name=NAME)

    def due_now() -> None:
        # The row one minute back and the worker's idea of it the same: one tick due.
        row.update(last_tick=scheduler.db_now().replace(second=0, microsecond=0) - dt.timedelta(minutes=1))
        state.last_tick = row.get().last_tick
        state.next_due = state.last_tick + dt.timedelta(minutes=1)

    def already_done() -> None:
        # This worker still believes the previous tick is the last; the row is past it.
        state.last_tick = row.get().last_tick - dt.timedelta(minutes=1)
        state.next_due = state.last_tick + dt.timedelta(minutes=1)

    def too_early() -> None:
        state.next_due = scheduler.db_now() - dt.timedelta(seconds=0.001)
        state.last_tick = row.get().last_tick

    def select_1() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    try:
        results = {
            "wins (inserts the tick's job)": timed(due_now, scheduler.run_due),
            "loses (tick already enqueued)": timed(already_done, scheduler.run_due),
            "early (tick not due by the database clock)": timed(too_early, scheduler.run_due),
            "SELECT 1 round trip": timed(lambda: None, select_1),
        }
    finally:
        Job.objects.filter(idempotency_key__startswith=f"periodic:{NAME}:").delete()
        row.delete()
    print(f"{ROUNDS} rounds each; milliseconds per run_due() (one TICK statement) on this machine")
    print(f"{'case':45} {'p50':>6} {'p95':>6} {'mean':>6}")
    for case, times in results.items():
        q = statistics.quantiles(times, n=20)
        print(f"{case:45} {statistics.median(times):6.2f} {q[18]:6.2f} {statistics.fmean(times):6.2f}")


if __name__ == "__main__":
    main()
