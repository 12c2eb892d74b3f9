"""The job changelist's search by task name, with no index on the hot path.

A substring match (``task_name ILIKE '%term%'``) reads every row of the
table: 9.2 s for a term that is in no name at 10,000,000 jobs, and every
search page runs it twice (the bounded count, then the rows). A B-tree on
``task_name`` would serve it, but every job would then write one more index
entry at its enqueue and at its finish: a third more WAL per job, measured
(docs/scaling.md). So the term is matched here, in Python, against the
names the project knows:

- the tasks registered in this process (``@task`` functions and Django
  Tasks, as a worker finds them);
- the periodic schedules' tasks;
- the names most common in the table, from its last ANALYZE's sample
  (``pg_stats``), which include old tasks no longer in the code;
- and the term itself, as an exact name (the full name of a task removed
  from the code still finds its jobs).

The jobs are then found by those exact names: the BRIN bloom index
``leasejobs_job_task_bloom`` tells, per 128 pages, whether a name may be
there, so a rare name reads only the pages that may hold it, and a common
name is found in the newest rows of the primary key. A bloom summary
changes only when a range first holds a name, so a job writes no index
entry for it in a steady flow (docs/scaling.md).
"""

from django.db.models import QuerySet

from leasejobs.db import facade
from leasejobs.jobs import discovery, registry
from leasejobs.models import Job, PeriodicSchedule


def known_names(db: str) -> set[str]:
    """The task names this project knows of: registered, scheduled, or common in the table."""
    discovery.discover()
    names = set(registry.all_tasks())
    names.update(PeriodicSchedule.objects.using(db).values_list("task_name", flat=True))
    names.update(facade.common_values(db, Job._meta.db_table, "task_name"))
    return names


def matching_names(term: str, known: set[str]) -> list[str]:
    """The known names that contain ``term`` (case aside), then ``term`` itself as a full name."""
    folded = term.casefold()
    found = sorted(name for name in known if folded in name.casefold())
    if term not in found:
        found.append(term)
    return found


def by_task_name(queryset: QuerySet[Job], term: str) -> QuerySet[Job]:
    """The jobs of every known task whose name contains ``term``, or whose name is ``term``."""
    return queryset.filter(task_name__in=matching_names(term, known_names(queryset.db)))
