"""URLs of the demo site: the Django admin is where leasejobs shows its jobs; its gauges for Prometheus."""

from django.contrib import admin
from django.urls import path

import leasejobs.views

urlpatterns = [
    path("admin/", admin.site.urls),
    # The queue-wide Prometheus gauges (leasejobs[metrics]); protect it in production.
    path("metrics/leasejobs", leasejobs.views.metrics),
]
