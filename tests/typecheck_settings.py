"""Settings for mypy's Django plugin: the apps leasejobs' models need, and no database.

``make lint`` type-checks before any PostgreSQL is found or started, so this
module names a database that is never connected to (``tests.settings`` would
resolve one through ``localdb``).
"""

SECRET_KEY = "type-checking-only"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "leasejobs",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}}
USE_TZ = True
