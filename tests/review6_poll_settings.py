"""Review 6: a poll interval E006 accepts (finite, positive) that no wait can take:
``POLL_INTERVAL_SECONDS`` past ``threading.TIMEOUT_MAX`` (about 292 years), the
"never poll, LISTEN wakes us" a project writes once ``float("inf")`` is refused."""

from tests.settings import *  # noqa: F403

LEASEJOBS = {**LEASEJOBS, "POLL_INTERVAL_SECONDS": 1e10}  # noqa: F405
