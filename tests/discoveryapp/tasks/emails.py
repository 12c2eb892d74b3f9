"""A submodule the tasks package imports."""

from leasejobs import task


@task
def welcome(address):
    return address
