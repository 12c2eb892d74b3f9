"""The shop's one view: placing an order queues its receipt in the same transaction.

It is what ``tests/unit/test_example_project.py`` and docs/tasks.md's "Testing
your tasks" test: a view that enqueues, tested with the public helpers only.
"""

from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from demo_site.receipts.models import Order
from demo_site.receipts.tasks import send_receipt


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create the order and queue its receipt: both or neither."""
    try:
        amount = Decimal(request.POST.get("amount", ""))
    except InvalidOperation:
        return JsonResponse({"error": "amount must be a number"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(
            customer_email=request.POST["email"], item=request.POST["item"], amount=amount
        )
        send_receipt.enqueue(order.id)
    return JsonResponse({"order": order.id}, status=201)
