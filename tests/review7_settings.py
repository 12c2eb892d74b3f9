"""Review 7: the test settings with a long poll, so that a worker's wake-ups can only
come from its NOTIFYs (``POLL_INTERVAL_SECONDS`` is "the idle worker's poll, besides
NOTIFY", docs/settings.md): a wake-up lost shows as a job that waits for the poll."""

from tests.settings import *  # noqa: F403

LEASEJOBS = {**LEASEJOBS, "POLL_INTERVAL_SECONDS": 30}  # noqa: F405
