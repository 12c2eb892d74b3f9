"""The demo shop in the admin: the outbox shows every receipt that went out."""

from django.contrib import admin

from demo_site.receipts.models import BodyRun, Message, Order


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "subject", "to", "idempotency_key", "attachment_name", "sent_at")
    search_fields = ("subject", "to", "idempotency_key")
    exclude = ("attachment",)
    readonly_fields = ("attachment_sha256", "request_sha256", "sent_at")


@admin.register(BodyRun)
class BodyRunAdmin(admin.ModelAdmin):
    list_display = ("job_id", "attempt", "worker_id", "outcome", "started_at", "ended_at")
    list_filter = ("outcome",)


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer_email", "item", "amount", "created_at")
