"""Test settings with the queue in a database of its own (``tests/unit/test_two_databases.py``).

``APP_DATABASE_URL`` holds the test app's rows, ``QUEUE_DATABASE_URL`` the
queue, routed there by ``leasejobs.routers.QueueRouter``.
"""

import environ

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

env = environ.Env()
DATABASES = {"default": env.db_url("APP_DATABASE_URL"), "queue": env.db_url("QUEUE_DATABASE_URL")}
DATABASE_ROUTERS = ["leasejobs.routers.QueueRouter"]
LEASEJOBS = {**LEASEJOBS, "DATABASE": "queue"}
