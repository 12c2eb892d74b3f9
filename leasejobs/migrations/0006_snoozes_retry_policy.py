"""Job.snoozes (Snooze from a body) and Job.retry_policy (.using(retry=...)).

``snoozes`` has a database default, so rows inserted by statements that do
not name it (an older worker during a rolling deploy) still get 0.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("leasejobs", "0005_observability"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(
                db_default=0,
                default=0,
                help_text="Times the body raised Snooze; those claims do not count toward max_attempts.",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="retry_policy",
            field=models.JSONField(
                blank=True,
                help_text="A retry policy given with .using(retry=...); else the task's.",
                null=True,
            ),
        ),
    ]
