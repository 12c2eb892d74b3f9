"""URLs of the test project: the admin, where leasejobs shows its jobs."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
