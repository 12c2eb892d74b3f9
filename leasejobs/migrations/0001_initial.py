"""Job and SideEffect, with the storage settings of a hot queue table."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_name", models.CharField(max_length=255)),
                ("queue", models.CharField(default="default", max_length=100)),
                ("priority", models.SmallIntegerField(default=0, help_text="Higher runs first.")),
                ("args", models.JSONField(blank=True, default=list)),
                ("kwargs", models.JSONField(blank=True, default=dict)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("running", "Running"),
                            ("done", "Done"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                (
                    "attempt",
                    models.IntegerField(
                        default=0,
                        help_text="Claims so far; also the fencing token of the current claim.",
                    ),
                ),
                ("max_attempts", models.IntegerField(default=5)),
                ("run_at", models.DateTimeField(help_text="Not claimed before this time.")),
                ("lease_until", models.DateTimeField(blank=True, null=True)),
                ("leased_by", models.CharField(blank=True, default="", max_length=255)),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("cancel_requested", models.BooleanField(default=False)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                (
                    "errors",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text="One entry per failed attempt, with its traceback.",
                    ),
                ),
                (
                    "worker_ids",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text="The worker that held each attempt, in order.",
                    ),
                ),
                ("result", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "started_at",
                    models.DateTimeField(
                        blank=True, help_text="When the latest attempt was claimed.", null=True
                    ),
                ),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "leasejobs_job",
                "indexes": [
                    models.Index(
                        condition=models.Q(("status__in", ["queued", "running"])),
                        fields=["-priority", "run_at", "id"],
                        name="leasejobs_job_claim",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ["done", "failed", "cancelled"])),
                        fields=["finished_at"],
                        name="leasejobs_job_finished",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("idempotency_key",),
                        name="leasejobs_job_idempotency_key",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="SideEffect",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=255, unique=True)),
                ("fencing_token", models.IntegerField()),
                ("data", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "job",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="side_effects",
                        to="leasejobs.job",
                    ),
                ),
            ],
            options={
                "db_table": "leasejobs_sideeffect",
            },
        ),
        migrations.RunSQL(
            # Heartbeats rewrite a job row every few seconds; leaving 30 % of
            # each page free lets those be HOT updates on the same page, and
            # frequent small autovacuum runs keep dead versions from piling up
            # (table bloat is the classic queue-table failure).
            sql="""
                ALTER TABLE leasejobs_job SET (
                    fillfactor = 70,
                    autovacuum_vacuum_scale_factor = 0.02,
                    autovacuum_vacuum_threshold = 1000,
                    autovacuum_vacuum_insert_scale_factor = 0.05,
                    autovacuum_analyze_scale_factor = 0.02,
                    autovacuum_vacuum_cost_delay = 1
                );
            """,
            reverse_sql="ALTER TABLE leasejobs_job RESET (fillfactor, autovacuum_vacuum_scale_factor,"
            " autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor,"
            " autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);",
        ),
        migrations.RunSQL(
            # A side effect's key must outlive its job: deleting the job (even
            # with raw SQL, as pruning does) only unlinks it.
            sql="ALTER TABLE leasejobs_sideeffect ADD CONSTRAINT leasejobs_sideeffect_job_fk"
            " FOREIGN KEY (job_id) REFERENCES leasejobs_job (id) ON DELETE SET NULL;",
            reverse_sql="ALTER TABLE leasejobs_sideeffect DROP CONSTRAINT leasejobs_sideeffect_job_fk;",
        ),
    ]
