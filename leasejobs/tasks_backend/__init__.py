"""leasejobs as a backend of Django's Tasks framework (``django.tasks``, Django 6+).

- ``backend``: ``LeaseJobsBackend`` and ``LeaseJobsTask`` (configured by their
  public path ``leasejobs.backend.LeaseJobsBackend``), and the discovery of the
  Django Tasks the worker may run;
- ``results``: a job seen as Django's ``TaskResult``;
- ``runner``: one attempt of a Django Task inside leasejobs' worker.

This package imports nothing at import time, so ``register_from`` can be
called on Django 5.2 too, where it does nothing.
"""

from collections.abc import Iterable
from types import ModuleType


def register_from(modules: Iterable[ModuleType]) -> None:
    """Register the Django Tasks of a LeaseJobsBackend defined in ``modules``.

    ``discovery.discover()`` calls it with the modules ``registry.autodiscover()``
    imported: at a worker's start, and wherever tasks are looked up by name.
    Without ``django.tasks`` (Django 5.2) there are none: it does nothing.
    """
    try:
        import django.tasks  # noqa: F401
    except ImportError:
        return
    from leasejobs.tasks_backend import backend

    backend.register_from(modules)
