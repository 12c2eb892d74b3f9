from django.db import migrations, models


class Migration(migrations.Migration):
    """``runs``: the attempts whose body started (issue 10, item 7).

    ``attempt`` stays the fencing token, bumped by every claim; ``runs`` is
    what ``max_attempts`` limits, so a claim that never started its body (a
    prefetched job of a killed worker, a lease given back at shutdown) costs
    the job nothing. Jobs still in the queue start from their claims so far,
    the old rule, so an upgrade never grants a poison job extra runs.
    """

    dependencies = [("leasejobs", "0002_joboverview")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="runs",
            field=models.IntegerField(
                default=0,
                db_default=0,
                help_text="Attempts whose body started; these, not claims, count toward max_attempts.",
            ),
        ),
        migrations.RunSQL(
            "UPDATE leasejobs_job SET runs = attempt WHERE status IN ('queued', 'running') AND attempt > 0",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
