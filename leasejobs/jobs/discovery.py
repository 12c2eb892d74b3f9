"""What a worker registers at start: the tasks modules' ``@task`` functions, then their Django Tasks.

A periodic schedule may name a Django Task by its module path, so the
system check, the schedules' status and ``run_now`` need what the worker
has, not only the ``@task`` functions (with ``registry.autodiscover`` alone
the check refused such a schedule, and ``runworker`` would not start). A
module of its own: ``registry`` stays below ``tasks_backend``, which builds on it.
"""

from leasejobs import tasks_backend
from leasejobs.jobs import registry


def discover() -> None:
    """Import every tasks module (``registry.autodiscover``) and register the Django Tasks in them."""
    tasks_backend.register_from(registry.autodiscover())
