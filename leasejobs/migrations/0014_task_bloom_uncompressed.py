"""The task-name bloom index sized so that its summaries are stored uncompressed (issue 32).

Migration 0012 made the index with the operator class's defaults: a filter
sized for a tenth of the most rows a range of 128 pages can hold (3,725
names, 35,696 bits). PostgreSQL compresses an index value over about 512
bytes, so each summary was stored compressed, and every job's insert and
every finish that moves its row decompressed it (4.4 kB) to add a name the
filter almost always held already: a tenth of the finish's PostgreSQL CPU
(docs/scaling.md, "What a job pays for it").

Sized for 256 names per range at the same 1 % false-positive rate, a filter
is 2,456 bits (307 bytes) and stays uncompressed. A range of 128 pages holds
a few thousand jobs; a range with more than 256 distinct task names only
makes the search read more ranges, never miss a job.

Built CONCURRENTLY under a new name while workers go on, then swapped in.
"""

from django.db import migrations

SIZED = (
    "CREATE INDEX CONCURRENTLY leasejobs_job_task_bloom_sized ON leasejobs_job"
    " USING brin (task_name text_bloom_ops(n_distinct_per_range = 256, false_positive_rate = 0.01))"
)
DEFAULT = (
    "CREATE INDEX CONCURRENTLY leasejobs_job_task_bloom_sized ON leasejobs_job"
    " USING brin (task_name text_bloom_ops)"
)


def swap(create: str) -> list[str]:
    """Build the index beside the old one, drop the old one, give the new one its name.

    The first statement clears an index left INVALID by an earlier run that
    failed half-way, so running the migration again is safe.
    """
    return [
        "DROP INDEX CONCURRENTLY IF EXISTS leasejobs_job_task_bloom_sized",
        create,
        "DROP INDEX CONCURRENTLY IF EXISTS leasejobs_job_task_bloom",
        "ALTER INDEX leasejobs_job_task_bloom_sized RENAME TO leasejobs_job_task_bloom",
    ]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("leasejobs", "0013_narrower_job_rows"),
    ]

    operations = [migrations.RunSQL(swap(SIZED), reverse_sql=swap(DEFAULT))]
