"""The demo shop tested as a user of leasejobs would: the public helpers only.

The ``job_queue`` fixture comes from the plugin leasejobs installs (no
conftest, no settings); everything happens in the test's transaction.
"""

from demo_site.receipts.models import Message
from demo_site.receipts.tasks import send_receipt


def test_placing_an_order_queues_its_receipt_and_running_it_sends_one_email(client, job_queue):
    response = client.post("/orders/", {"email": "ada@example.com", "item": "Tea", "amount": "4.50"})
    assert response.status_code == 201
    order_id = response.json()["order"]

    job_queue.assert_enqueued(send_receipt, args=[order_id])
    assert Message.objects.count() == 0  # queued, not run

    ran = job_queue.run_jobs(queue="receipts")

    assert [(r.task_name, r.outcome, r.result) for r in ran] == [
        (send_receipt.name, "done", {"order": order_id, "sent": True})
    ]
    email = Message.objects.get()
    assert (email.to, email.idempotency_key) == ("ada@example.com", f"receipt:{order_id}")
    job_queue.assert_not_enqueued(send_receipt)


def test_a_refused_order_queues_nothing(client, job_queue):
    response = client.post("/orders/", {"email": "ada@example.com", "item": "Tea", "amount": "lots"})
    assert response.status_code == 400
    job_queue.assert_not_enqueued(send_receipt)
    assert job_queue.run_jobs() == []
