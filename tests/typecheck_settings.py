"""Settings for mypy's Django plugin: the test project's apps, and no database.

``make lint`` type-checks before any PostgreSQL is found or started, so this
module names a database that is never connected to (``tests.settings`` would
resolve one through ``localdb``).
"""

from tests.base_settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}}
