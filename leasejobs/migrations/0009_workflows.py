from django.db import migrations, models

from leasejobs.db.sql.workflows import RESTORE_FUNCTION, SETTLE_FUNCTION


class Migration(migrations.Migration):
    """Workflows (issue 31): the workflow and edge tables, each job's place in one,
    and the two functions that settle and restore edges.

    ``workflow_id`` is indexed only where set, so a plain job's updates write
    nothing to that index. The functions' text is imported: a change to it
    ships as a new migration running the new ``CREATE OR REPLACE``.
    """

    dependencies = [
        ("leasejobs", "0008_slot_free_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "db_table": "leasejobs_workflow",
            },
        ),
        migrations.CreateModel(
            name="WorkflowEdge",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("parent_id", models.BigIntegerField()),
                ("child_id", models.BigIntegerField()),
                ("run_on_failure", models.BooleanField(default=False)),
                ("resolved", models.BooleanField(default=False)),
            ],
            options={
                "db_table": "leasejobs_workflowedge",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="pending_parents",
            field=models.IntegerField(
                db_default=0, default=0, help_text="Parents in its workflow not yet done."
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="workflow_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow_id__isnull", False)),
                fields=["workflow_id"],
                name="leasejobs_job_workflow",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowedge",
            index=models.Index(fields=["parent_id"], name="leasejobs_edge_parent"),
        ),
        migrations.AddConstraint(
            model_name="workflowedge",
            constraint=models.UniqueConstraint(
                fields=("child_id", "parent_id"), name="leasejobs_edge_child_parent"
            ),
        ),
        migrations.RunSQL(
            SETTLE_FUNCTION,
            "DROP FUNCTION IF EXISTS leasejobs_settle_parents(bigint[], text[], text)",
        ),
        migrations.RunSQL(
            RESTORE_FUNCTION,
            "DROP FUNCTION IF EXISTS leasejobs_restore_descendants(bigint[])",
        ),
    ]
