"""URLs of the test project: the admin, where leasejobs shows its jobs; its
Prometheus gauges; and a view that enqueues (the tracing test calls it)."""

from django.contrib import admin
from django.urls import path

import leasejobs.views
from tests.testapp.views import enqueue

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/leasejobs", leasejobs.views.metrics),
    path("test/enqueue", enqueue),
]
