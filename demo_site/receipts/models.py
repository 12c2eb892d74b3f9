"""The demo shop's tables: orders, the mail API's outbox, and one row per run
of a receipt job's body, so the demo counts from the database what happened.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Order(models.Model):
    """What a receipt is for.

    The demo makes a fresh order per scenario: a side effect's key
    (``receipt:<order id>``) is remembered forever, so a second demo run on
    the same database must not reuse an order.
    """

    customer_email = models.EmailField()
    item = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order #{self.id} ({self.item}, {self.amount})"


class Message(models.Model):
    """One email the local mail API accepted: its outbox, one row per email sent.

    ``idempotency_key`` is unique when given, which is what makes a keyed send
    happen at most once; ``request_sha256`` lets the API refuse a key reused
    for a different email, as real mail and payment APIs do.
    """

    to = models.EmailField()
    subject = models.CharField(max_length=200)
    text = models.TextField()
    attachment_name = models.CharField(max_length=100)
    attachment = models.BinaryField(help_text="The PDF, as sent.")
    attachment_sha256 = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_sha256 = models.CharField(max_length=64)
    tags = models.JSONField(default=dict, blank=True, help_text="The sender's metadata, e.g. the order.")
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                name="receipts_message_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject} to {self.to}"


class BodyRun(models.Model):
    """One run of a receipt task's body: which attempt, on which worker, and how it ended.

    Written by the body itself (an attempt fenced off still writes its own
    run row), so the demo counts runs and rejected stale writes from here.
    """

    class Outcome(models.TextChoices):
        RUNNING = "running"
        SENT = "sent"
        ALREADY_SENT = "already sent"
        REJECTED = "stale write rejected"
        RAISED = "raised"
        #: Its process was killed (the demo writes this: the body could not).
        STOPPED = "stopped by its worker"

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=255)
    outcome = models.CharField(max_length=32, choices=Outcome.choices, default=Outcome.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job_id"], name="receipts_bodyrun_job")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on {self.worker_id}: {self.outcome}"

    def end(self, outcome: "BodyRun.Outcome") -> None:
        """Record how this run ended (database time, like every lease)."""
        BodyRun.objects.filter(pk=self.pk).update(outcome=outcome, ended_at=Now())
