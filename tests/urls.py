"""The demo site's URLs plus a view the tracing test calls."""

from django.urls import path

from demo_site.urls import urlpatterns as demo_urlpatterns
from tests.testapp.views import enqueue

urlpatterns = [*demo_urlpatterns, path("test/enqueue", enqueue)]
