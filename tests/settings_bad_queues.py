"""Test settings with a bad rate limit: runworker must refuse to start."""

from tests.settings import *  # noqa: F403
from tests.settings import LEASEJOBS

LEASEJOBS = {**LEASEJOBS, "QUEUES": {"email": {"rate": "lots"}}}
