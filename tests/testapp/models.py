"""Tables the test tasks write to, so tests can see what bodies did."""

from django.db import models


class BodyRun(models.Model):
    """One row per time a task body started: counts the runs of a job."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)


class Sent(models.Model):
    """A receipt 'emailed' by a test task; deliberately not unique."""

    job_id = models.BigIntegerField()
    key = models.CharField(max_length=255)
    attempt = models.IntegerField()
