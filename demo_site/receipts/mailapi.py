"""A local mail API: it "sends" by recording the email in the outbox table.

It honours an idempotency key the way hosted APIs do. Resend's email API
takes an ``Idempotency-Key`` and, within 24 hours, answers a repeated key
with the first response without sending again
(https://resend.com/docs/dashboard/emails/idempotency-keys); Stripe saves the
first result per key and refuses a key reused with other parameters
(https://docs.stripe.com/idempotency). Here a key is remembered forever.
Without a key, every call sends: that is how the naive receipt task sends
two receipts.
"""

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from demo_site.receipts.models import Message

logger = logging.getLogger("demo_site.receipts")


class IdempotencyKeyReused(Exception):
    """An idempotency key came back with a different email than the one it first sent."""


@dataclass(frozen=True)
class Delivery:
    """The API's answer. ``replayed``: the key was seen before and nothing was sent now."""

    message_id: int
    replayed: bool


def send(
    *,
    to: str,
    subject: str,
    text: str,
    attachment_name: str,
    attachment: bytes,
    tags: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Delivery:
    """Send one email with one attachment; with a known key, send nothing and replay."""
    attachment_sha256 = hashlib.sha256(attachment).hexdigest()
    fields: dict[str, Any] = {
        "to": to,
        "subject": subject,
        "text": text,
        "attachment_name": attachment_name,
        "attachment_sha256": attachment_sha256,
        "tags": tags or {},
    }
    request_sha256 = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    fields.update(attachment=attachment, request_sha256=request_sha256)
    if idempotency_key is None:
        message, created = Message.objects.create(**fields), True
    else:
        # get_or_create retries the read when a concurrent insert wins the
        # unique key, so two racing sends with one key store one message.
        message, created = Message.objects.get_or_create(idempotency_key=idempotency_key, defaults=fields)
        if not created and message.request_sha256 != request_sha256:
            raise IdempotencyKeyReused(
                f"idempotency key {idempotency_key!r} was first used for message {message.id}, "
                "a different email; use a new key for a new email."
            )
    logger.info(
        "mail %s message=%s to=%s key=%s pdf_sha256=%s",
        "sent" if created else "replayed (key seen before, nothing sent)",
        message.id,
        to,
        idempotency_key,
        attachment_sha256[:12],
    )
    return Delivery(message_id=message.id, replayed=not created)
