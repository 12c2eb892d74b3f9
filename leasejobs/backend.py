"""The public path of leasejobs' Django Tasks backend (Django 6+).

``TASKS = {"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend"}}``.
The code lives in ``leasejobs.tasks_backend``; on Django 5.2 importing this
module raises ``ImproperlyConfigured`` with what to do.
"""

from leasejobs.tasks_backend.backend import JobFailed, LeaseJobsBackend, LeaseJobsTask

__all__ = ["JobFailed", "LeaseJobsBackend", "LeaseJobsTask"]
