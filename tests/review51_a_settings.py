"""The test settings plus the hostile bodies of tests/integration/test_review51_a.py."""

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS["TASK_MODULES"], "tests.review51_a_tasks"]
