"""Tasks the tests enqueue and their worker processes run."""
import time

from leasejobs import task


@task
def add(a, b):
    return a + b


@task(takes_context=True, lease_seconds=2)
def slow_receipt(ctx, order_id, seconds):
    time.sleep(seconds)
    with ctx.side_effect(f"receipt:{order_id}") as effect:
        return {"created": effect.created, "attempt": ctx.attempt}
