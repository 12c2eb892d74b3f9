from django.apps import AppConfig


class ReceiptsConfig(AppConfig):
    """The demo shop: orders, their receipt jobs and a local mail API (the outbox)."""

    name = "demo_site.receipts"
    label = "receipts"
    verbose_name = "Receipts (the demo shop)"
    default_auto_field = "django.db.models.BigAutoField"
