"""URLs of the test project: the admin, where leasejobs shows its jobs; its
Prometheus gauges; a view that enqueues (the tracing test calls it); and the
demo app's order view (tests/unit/test_example_project.py tests it as a user's
project would be tested)."""

from django.contrib import admin
from django.urls import path

import leasejobs.views
from demo_site.receipts.views import place_order
from tests.testapp.views import enqueue

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/leasejobs", leasejobs.views.metrics),
    path("test/enqueue", enqueue),
    path("orders/", place_order, name="place-order"),
]
