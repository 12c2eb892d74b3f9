"""A module the tasks package imports (a web process may import it first)."""

import tests.discoveryapp.deeper  # noqa: F401  (its tasks)
from leasejobs import task


@task
def shared(n):
    return n
