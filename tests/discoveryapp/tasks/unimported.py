"""A submodule the tasks package does not import: a worker never loads it."""

from leasejobs import task


@task
def orphan(n):
    return n
