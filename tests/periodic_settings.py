"""Test settings for periodic jobs: the schedules come from the environment.

Worker processes of ``tests/*/test_periodic*.py`` run with
``DJANGO_SETTINGS_MODULE=tests.periodic_settings`` and their schedule set as
JSON in ``LEASEJOBS_TEST_PERIODIC``, so each test (and each "deploy" in a
test) declares its own set, and no other test's workers ever schedule.
"""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS = {**LEASEJOBS, "PERIODIC": json.loads(os.environ.get("LEASEJOBS_TEST_PERIODIC") or "[]")}
