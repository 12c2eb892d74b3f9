"""Narrower job rows: less WAL per job (issue 32, docs/performance.md).

``errors`` and ``worker_ids`` are stored as NULL while empty
(``leasejobs.models.JsonList``: an empty JSON array took 5 bytes in each of
a job's three row versions; Python still reads a list), and the help texts
say what the claim now writes: ``heartbeat_at`` stays empty until the
attempt's first heartbeat, and ``worker_ids`` lists the claims before the
latest, whose worker is ``leased_by``. Rows written before read the same.
Dropping NOT NULL only changes the catalog: no table rewrite, no scan.
"""

from django.db import migrations, models

import leasejobs.models


class Migration(migrations.Migration):
    dependencies = [
        ("leasejobs", "0012_task_bloom"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="errors",
            field=leasejobs.models.JsonList(
                blank=True,
                default=list,
                help_text="One entry per failed attempt, with its traceback.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="heartbeat_at",
            field=models.DateTimeField(
                blank=True, help_text="The attempt's last heartbeat; empty until its first.", null=True
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="worker_ids",
            field=leasejobs.models.JsonList(
                blank=True,
                default=list,
                help_text="Workers of the earlier attempts, in order; the latest's is leased_by.",
                null=True,
            ),
        ),
    ]
