"""URLs of the demo site: the Django admin is where leasejobs shows its jobs;
its gauges for Prometheus; ``orders/`` places an order (and queues its receipt)."""

from django.contrib import admin
from django.urls import path

import leasejobs.views
from demo_site.receipts.views import place_order

urlpatterns = [
    path("admin/", admin.site.urls),
    # The queue-wide Prometheus gauges (leasejobs[metrics]); protect it in production.
    path("metrics/leasejobs", leasejobs.views.metrics),
    path("orders/", place_order, name="place-order"),
]
