"""What ``leasejobs_periodic`` and the admin show: each schedule's state, on the database clock.

A schedule is listed if this code declares it or the database remembers it
(a schedule removed from code keeps its row, and is shown as such). What
the workers follow is the row's definition; the declared one is shown when
there is no row yet.
"""

import datetime as dt
import secrets
from dataclasses import dataclass

from leasejobs.conf import db_alias
from leasejobs.db import facade
from leasejobs.db.rows import KEY_PREFIX, TICK_FORMAT, periodic_key_prefix
from leasejobs.jobs import registry
from leasejobs.jobs.discovery import discover
from leasejobs.models import Job, PeriodicSchedule
from leasejobs.periodic.schedules import Schedule, load
from leasejobs.periodic.ticks import ScheduleError, next_tick, zone


@dataclass
class ScheduleStatus:
    name: str
    task_name: str
    cron: str
    timezone: str
    #: "", or why the workers of this code do not tick it.
    note: str
    last_tick: dt.datetime | None
    next_tick: dt.datetime | None
    last_job: Job | None
    enqueued: int
    skipped: int

    @property
    def next_tick_local(self) -> dt.datetime | None:
        return self.next_tick.astimezone(zone(self.timezone)) if self.next_tick else None

    @property
    def jobs_prefix(self) -> str:
        """The idempotency-key prefix of this schedule's jobs (what the admin link filters on)."""
        return periodic_key_prefix(self.name)


def db_now() -> dt.datetime:
    return facade.database_now()


def statuses() -> list[ScheduleStatus]:
    """Every schedule declared here or remembered by the database, by name."""
    discover()
    declared = {s.name: s for s in load()[0]}
    rows = {r.name: r for r in PeriodicSchedule.objects.using(db_alias()).all()}
    jobs = Job.objects.using(db_alias()).in_bulk([r.last_job_id for r in rows.values() if r.last_job_id])
    now = db_now()
    found = []
    for name in sorted(set(declared) | set(rows)):
        schedule, row = declared.get(name), rows.get(name)
        if row is None:
            assert schedule is not None
            note = "no worker has started with it yet"
        elif schedule is None:
            note = "not declared by this code (removed?); not ticking here"
        elif schedule.signature != row.signature:
            note = "declared differently here; the workers follow the definition shown"
        else:
            note = ""
        # What the workers follow: the row's definition, else the declared one.
        followed: PeriodicSchedule | Schedule = row if row is not None else schedule  # type: ignore[assignment]
        upcoming = None
        if schedule is not None:
            try:
                upcoming = next_tick(
                    followed.cron, zone(followed.timezone), max(now, row.last_tick) if row else now
                )
            except (ScheduleError, ValueError):
                upcoming = None
        found.append(
            ScheduleStatus(
                name=name,
                task_name=followed.task_name,
                cron=followed.cron,
                timezone=followed.timezone,
                note=note,
                last_tick=row.last_tick if row else None,
                next_tick=upcoming,
                last_job=jobs.get(row.last_job_id) if row and row.last_job_id else None,
                enqueued=row.enqueued if row else 0,
                skipped=row.skipped if row else 0,
            )
        )
    return found


def run_now(name: str) -> Job:
    """Enqueue one job of schedule ``name`` now, outside its ticks.

    Its idempotency key names the schedule, ``manual-<random>`` and the
    time, so it is listed with the schedule's jobs and ``ctx.scheduled_at``
    is the time of the request; it never takes the place of a tick's job.
    """
    discover()
    schedules: dict[str, Schedule] = {s.name: s for s in load()[0]}
    schedule = schedules.get(name)
    if schedule is None:
        known = ", ".join(sorted(schedules)) or "none"
        raise ScheduleError(f"no periodic schedule named {name!r} is declared (declared: {known})")
    task = registry.get(schedule.task_name)
    assert task is not None  # load() refuses a schedule whose task is not registered
    stamp = db_now().strftime(TICK_FORMAT)
    key = f"{KEY_PREFIX}{name}:manual-{secrets.token_hex(4)}:{stamp}"
    return task.using(idempotency_key=key).enqueue(*schedule.args, **schedule.kwargs)
