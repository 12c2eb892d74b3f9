"""App configuration of leasejobs."""

from django.apps import AppConfig


class LeaseJobsConfig(AppConfig):
    name = "leasejobs"
    verbose_name = "Lease jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from leasejobs import checks  # noqa: F401  (registers the system checks)
        from leasejobs.periodic import checks as periodic_checks  # noqa: F401
