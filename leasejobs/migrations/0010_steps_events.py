import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Durable steps and events (issue 31): ``leasejobs_step`` and ``leasejobs_event``.

    A step row is deleted with its job at the database level (``ON DELETE
    CASCADE``), so pruning, which deletes jobs with raw SQL, takes them too.
    """

    dependencies = [
        ("leasejobs", "0009_workflows"),
    ]

    operations = [
        migrations.CreateModel(
            name="Step",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "name", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("kind", models.CharField(max_length=8)),
                ("attempt", models.IntegerField(help_text="The attempt that wrote it.")),
                ("result", models.JSONField(blank=True, null=True)),
                ("event_key", models.CharField(blank=True, max_length=255, null=True)),
                ("event_id", models.BigIntegerField(blank=True, null=True)),
                ("wake_at", models.DateTimeField(blank=True, null=True)),
                ("done", models.BooleanField(default=True)),
                ("created_at", models.DateTimeField()),
                ("done_at", models.DateTimeField(blank=True, null=True)),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="leasejobs.job",
                    ),
                ),
            ],
            options={
                "db_table": "leasejobs_step",
                "indexes": [
                    models.Index(
                        condition=models.Q(("done", False), ("kind", "wait")),
                        fields=["event_key"],
                        name="leasejobs_step_waiting",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=255, unique=True)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "db_table": "leasejobs_event",
            },
        ),
        migrations.RunSQL(
            sql="ALTER TABLE leasejobs_step ADD CONSTRAINT leasejobs_step_job_fk"
            " FOREIGN KEY (job_id) REFERENCES leasejobs_job (id) ON DELETE CASCADE;",
            reverse_sql="ALTER TABLE leasejobs_step DROP CONSTRAINT leasejobs_step_job_fk;",
        ),
    ]
