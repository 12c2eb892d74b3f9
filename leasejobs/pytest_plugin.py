"""The pytest plugin of leasejobs (registered as ``leasejobs`` in the pytest11 entry point).

Gives pytest-django users the ``job_queue`` fixture with no configuration.
"""

from types import ModuleType

import pytest


@pytest.fixture
def job_queue(db: None) -> ModuleType:
    """``leasejobs.testing`` with the test database enabled.

    ``job_queue.assert_enqueued(send_receipt, args=[order.id])``,
    ``job_queue.run_jobs()``, ``job_queue.run_job(job.id)``, and so on: the
    jobs live in the test's transaction and are rolled back with it.
    """
    from leasejobs import testing

    return testing
