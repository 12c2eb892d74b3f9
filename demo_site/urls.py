"""URLs of the demo site: the Django admin is where leasejobs shows its jobs;
``orders/`` places an order (and queues its receipt)."""

from django.contrib import admin
from django.urls import path

from demo_site.receipts.views import place_order

urlpatterns = [path("admin/", admin.site.urls), path("orders/", place_order, name="place-order")]
