from django.db import migrations


class Migration(migrations.Migration):
    """A BRIN bloom index on ``task_name`` for the admin's search by task name (issue 32).

    Without it, a search for a task name read the whole table (9.2 s at
    10,000,000 jobs for a name nowhere). A B-tree would cost every job an
    index entry at its enqueue and at its finish; a bloom summary of 128
    pages changes only when a range first holds a name, and ``task_name``
    never changes, so claims stay HOT updates. Built CONCURRENTLY: workers
    keep claiming and finishing meanwhile (one read of the table). In SQL,
    not as a model index: Django's ``BrinIndex`` would ask every project to
    install ``django.contrib.postgres``. PostgreSQL 14 or later (bloom
    operator classes).
    """

    atomic = False

    dependencies = [
        ("leasejobs", "0011_hot_claim"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS leasejobs_job_task_bloom "
            "ON leasejobs_job USING brin (task_name text_bloom_ops)",
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS leasejobs_job_task_bloom",
        ),
    ]
