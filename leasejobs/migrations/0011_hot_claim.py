from django.db import migrations, models

#: Rows written by hand (or by a bug) that break the rule the new indexes
#: rely on are set right first, so the check constraint can be added: a
#: finished job without a finish time gets its last claim's (or its
#: creation's), an unfinished one loses its finish time.
NORMALIZE = """
UPDATE leasejobs_job SET finished_at = COALESCE(started_at, created_at)
WHERE status IN ('done', 'failed', 'cancelled') AND finished_at IS NULL;
UPDATE leasejobs_job SET finished_at = NULL
WHERE status IN ('queued', 'running') AND finished_at IS NOT NULL;
"""


class Migration(migrations.Migration):
    """The claim becomes a HOT update (issue 32).

    Both partial indexes named ``status`` in their predicates, so every
    claim (queued -> running) wrote a new entry into the primary key and the
    claim index and moved the row to a new place: about a third of a job's
    WAL. Their predicates now name ``finished_at`` (NULL exactly while a job
    is queued or running), which a claim never changes; the check constraint
    makes that rule one the database enforces. Both indexes are rebuilt:
    on a large job table, run this migration at a quiet time (it scans the
    table once per index and blocks writes to it meanwhile).
    """

    dependencies = [
        ("leasejobs", "0010_steps_events"),
    ]

    operations = [
        migrations.RunSQL(NORMALIZE, reverse_sql=migrations.RunSQL.noop),
        migrations.RemoveIndex(model_name="job", name="leasejobs_job_claim"),
        migrations.RemoveIndex(model_name="job", name="leasejobs_job_finished"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(finished_at__isnull=True),
                fields=["-priority", "run_at", "id"],
                name="leasejobs_job_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(finished_at__isnull=False),
                fields=["finished_at"],
                name="leasejobs_job_finished",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(status__in=["queued", "running"], finished_at__isnull=True)
                | models.Q(status__in=["done", "failed", "cancelled"], finished_at__isnull=False),
                name="leasejobs_job_finished_iff_ended",
            ),
        ),
    ]
