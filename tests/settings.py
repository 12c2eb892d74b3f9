"""Test settings: the demo site plus a test app whose tasks the worker runs."""

import os
from importlib.util import find_spec

from demo_site.settings import *  # noqa: F403
from demo_site.settings import INSTALLED_APPS, LEASEJOBS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
ROOT_URLCONF = "tests.urls"
LEASEJOBS = {**LEASEJOBS, "RETRY_BACKOFF_SECONDS": 0.2, "RETRY_BACKOFF_MAX_SECONDS": 1.0}

# Django's Tasks framework (Django 6+ only): Django Tasks of the test app go
# through leasejobs, and django.tasks' own signal receivers log to the
# worker's log so tests can see task_started / task_finished there.
if find_spec("django.tasks") is not None:
    from demo_site.settings import LOGGING

    TASKS = {"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend", "OPTIONS": {"MAX_ATTEMPTS": 2}}}
    LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS.get("TASK_MODULES", []), "tests.testapp.django_tasks"]
    LOGGING = {
        **LOGGING,
        "loggers": {
            **LOGGING["loggers"],
            "django.tasks": {"handlers": ["console"], "level": "INFO", "propagate": False},
        },
    }

# A worker started with this variable has a small payload limit, so a test can
# exceed it with a result or side-effect data of a few kilobytes.
if _max_payload := os.environ.get("LEASEJOBS_TEST_MAX_PAYLOAD_BYTES"):
    LEASEJOBS["MAX_PAYLOAD_BYTES"] = int(_max_payload)
