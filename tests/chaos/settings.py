"""Settings of the worker processes the chaos and reliability tests start.

The test settings plus ``tests.chaos.tasks``. A worker started with
``CHAOS_WORKER_ID`` in its environment names the Django connections its job
bodies use ``leasejobs body <worker id>``, so a scenario can terminate a body's
own connection mid-job with ``pg_terminate_backend`` and never touch a
backend it did not start.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, LEASEJOBS

LEASEJOBS = {**LEASEJOBS, "TASK_MODULES": [*LEASEJOBS.get("TASK_MODULES", []), "tests.chaos.tasks"]}

if worker_id := os.environ.get("CHAOS_WORKER_ID"):
    _default = DATABASES["default"]
    DATABASES = {
        **DATABASES,
        "default": {
            **_default,
            "OPTIONS": {**_default.get("OPTIONS", {}), "application_name": f"leasejobs body {worker_id}"},
        },
    }
