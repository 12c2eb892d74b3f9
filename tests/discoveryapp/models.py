"""Imported while Django sets up (in a worker too): a task defined here is found."""

from leasejobs import task


@task
def set_up_with_django(n):
    return n
