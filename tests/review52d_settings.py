"""The test settings plus the bodies of tests/integration/test_review52d.py."""

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS["TASK_MODULES"], "tests.review52d_tasks"]
