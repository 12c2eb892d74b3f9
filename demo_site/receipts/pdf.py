"""The receipt PDF, rendered with fpdf2 (https://py-pdf.github.io/fpdf2/).

The same order always renders to the same bytes (the creation date is the
order's, not the clock's), so a retried send with an idempotency key is the
same request as the first one.

fpdf2 is imported where a receipt is rendered, not with the module: it takes
about 0.2 s to import (numpy and fontTools with it), which every
``runworker`` and ``manage.py`` command of the demo would otherwise pay at
start, whether or not it renders a receipt.
"""

import time

from demo_site.receipts.models import Order


def render_receipt(order: Order, delay: float = 0.0) -> bytes:
    """Render the receipt of ``order``; ``delay`` stands for a slow PDF service."""
    from fpdf import FPDF

    time.sleep(delay)
    pdf = FPDF()
    pdf.set_creation_date(order.created_at)
    pdf.set_title(f"Receipt for order #{order.id}")
    pdf.set_author("leasejobs demo shop")
    pdf.add_page()
    pdf.set_font("Helvetica", style="B", size=18)
    pdf.cell(text="Receipt", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=11)
    for paragraph in (
        ("leasejobs demo shop", f"Order #{order.id}, {order.created_at:%Y-%m-%d %H:%M} UTC"),
        (f"Billed to {order.customer_email}", f"{order.item}: EUR {order.amount}"),
        ("Thank you for your order.",),
    ):
        for line in paragraph:
            pdf.cell(text=line, new_x="LMARGIN", new_y="NEXT")
        pdf.ln()
    return bytes(pdf.output())
