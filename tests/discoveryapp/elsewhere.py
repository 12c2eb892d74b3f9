"""A module no tasks module imports (as a project's views.py would be)."""

from leasejobs import task


@task
def not_found(n):
    return n
