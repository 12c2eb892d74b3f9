"""The test settings plus the bodies of tests/integration/test_review51_b.py (``tests.review51_b_tasks``)."""

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS["TASK_MODULES"], "tests.review51_b_tasks"]
