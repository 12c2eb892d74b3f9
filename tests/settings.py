"""Test settings: the demo site plus a test app whose tasks the worker runs."""

from demo_site.settings import *  # noqa: F403
from demo_site.settings import INSTALLED_APPS, LEASEJOBS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
LEASEJOBS = {**LEASEJOBS, "RETRY_BACKOFF_SECONDS": 0.2, "RETRY_BACKOFF_MAX_SECONDS": 1.0}
