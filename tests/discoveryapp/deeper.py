"""A module the tasks package imports through ``shared``."""

from leasejobs import task


@task
def deeper(n):
    return n
