"""The test settings plus the hostile bodies of tests/test_hostile_review.py (``tests.hostile_tasks``)."""

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS["TASK_MODULES"], "tests.hostile_tasks"]
