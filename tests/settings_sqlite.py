"""The test project on Django's default database, SQLite, as ``django-admin startproject`` sets it.

``manage.py check`` must refuse it with leasejobs' sentence
(tests/unit/test_checks.py), before ``migrate`` gets to leasejobs' first
PostgreSQL statement.
"""

from tests.base_settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
