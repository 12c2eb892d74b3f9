"""The story's receipt job, written two ways.

``send_receipt`` is the way leasejobs asks for: the email goes out inside
``ctx.side_effect``, which checks the fencing token and records the key in
one transaction, and the mail API gets the same key as its idempotency key.
``send_receipt_naive`` sends straight away, as most job code does: a worker
that lost its lease without knowing it sends a second receipt.

Both render the PDF first, slowly on the first attempt only (the story's
slow PDF service), and record each body run in ``BodyRun``.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from demo_site.receipts import mailapi
from demo_site.receipts.models import BodyRun, Order
from demo_site.receipts.pdf import render_receipt
from leasejobs import JobContext, LeaseLost, task


@contextmanager
def _body_run(ctx: JobContext) -> Iterator[BodyRun]:
    """Record this run of the body, and how it ended if it ended with an exception."""
    run = BodyRun.objects.create(job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
    try:
        yield run
    except LeaseLost:
        run.end(BodyRun.Outcome.REJECTED)
        raise
    except BaseException:
        run.end(BodyRun.Outcome.RAISED)
        raise


def _receipt_email(ctx: JobContext, order_id: int, slow_first_attempt: float) -> dict[str, Any]:
    """Render the order's receipt (slowly on the first attempt) into the email to send."""
    order = Order.objects.get(pk=order_id)
    pdf = render_receipt(order, delay=slow_first_attempt if ctx.attempt == 1 else 0.0)
    return {
        "to": order.customer_email,
        "subject": f"Your receipt for order #{order.id}",
        "text": f"Thank you for your order #{order.id}. Your receipt is attached.",
        "attachment_name": f"receipt-{order.id}.pdf",
        "attachment": pdf,
        "tags": {"order": order.id},
    }


@task(queue="receipts", takes_context=True)
def send_receipt(ctx: JobContext, order_id: int, slow_first_attempt: float = 0.0) -> dict[str, Any]:
    """Email the receipt of an order at most once, whatever the workers do."""
    with _body_run(ctx) as run:
        email = _receipt_email(ctx, order_id, slow_first_attempt)
        with ctx.side_effect(f"receipt:{order_id}") as effect:
            if effect.created:
                mailapi.send(**email, idempotency_key=effect.key)
        run.end(BodyRun.Outcome.SENT if effect.created else BodyRun.Outcome.ALREADY_SENT)
    return {"order": order_id, "sent": effect.created}


@task(queue="receipts", takes_context=True)
def send_receipt_naive(ctx: JobContext, order_id: int, slow_first_attempt: float = 0.0) -> dict[str, Any]:
    """Email the receipt of an order with no fencing and no idempotency key."""
    with _body_run(ctx) as run:
        mailapi.send(**_receipt_email(ctx, order_id, slow_first_attempt))
        run.end(BodyRun.Outcome.SENT)
    return {"order": order_id, "sent": True}
