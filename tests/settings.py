"""Settings of the test project: leasejobs, a test app whose tasks the worker runs,
the demo's app (tests/test_demo.py tests it) and the benchmark's (tests/integration/test_bench.py).

The database comes from ``localdb`` (``DATABASE_URL``, else a server on
localhost, else the embedded PostgreSQL), as for the demo; nothing here
imports the demo's settings.
"""

import os
from importlib.util import find_spec

import environ

import localdb
from tests.base_settings import *  # noqa: F403

env = environ.Env()

DATABASES = {"default": env.db_url_config(localdb.database_url())}
# Worker processes keep their connections, as in production.
DATABASES["default"]["CONN_MAX_AGE"] = 600
# Through a transaction pooler (tests/integration/test_worker_pgbouncer.py): no
# server-side cursors, whose .iterator() spans transactions.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool(
    "DJANGO_DISABLE_SERVER_SIDE_CURSORS", default=False
)

# Retries come quickly so that tests of retries do not wait.
LEASEJOBS = {
    "LEASE_SECONDS": 30,
    "MAX_ATTEMPTS": 5,
    "RETRY_BACKOFF_SECONDS": 0.2,
    "RETRY_BACKOFF_MAX_SECONDS": 1.0,
    # A direct connection for LISTEN when DATABASE_URL goes through a
    # transaction pooler; unset: the worker polls.
    "LISTEN_URL": env("LEASEJOBS_LISTEN_URL", default=None),
    # The chaos scenarios' tasks: the test process enqueues them, so it must
    # know that their workers (tests/chaos/settings.py) import them.
    "TASK_MODULES": ["tests.chaos.tasks", "tests.testapp.workflow_tasks"],
}

# The worker logs its one-line events where tests read them (the worker's log file).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"leasejobs": {"handlers": ["console"], "level": env("LEASEJOBS_LOG_LEVEL", default="INFO")}},
}

# Django's Tasks framework (Django 6+ only): Django Tasks of the test app go
# through leasejobs, and django.tasks' own signal receivers log to the
# worker's log so tests can see task_started / task_finished there.
if find_spec("django.tasks") is not None:
    TASKS = {"default": {"BACKEND": "leasejobs.backend.LeaseJobsBackend", "OPTIONS": {"MAX_ATTEMPTS": 2}}}
    LEASEJOBS["TASK_MODULES"] = [*LEASEJOBS["TASK_MODULES"], "tests.testapp.django_tasks"]
    LOGGING["loggers"]["django.tasks"] = {"handlers": ["console"], "level": "INFO", "propagate": False}

# A worker started with this variable has a small payload limit, so a test can
# exceed it with a result or side-effect data of a few kilobytes.
if _max_payload := os.environ.get("LEASEJOBS_TEST_MAX_PAYLOAD_BYTES"):
    LEASEJOBS["MAX_PAYLOAD_BYTES"] = int(_max_payload)

# A worker started with this variable vacuums the job table after that many
# dead row versions, whatever its size (tests/integration/test_vacuum.py).
if _vacuum_threshold := os.environ.get("LEASEJOBS_TEST_VACUUM_THRESHOLD"):
    LEASEJOBS["VACUUM_THRESHOLD"] = int(_vacuum_threshold)
    LEASEJOBS["VACUUM_SCALE_FACTOR"] = 0.0

# A worker started with this variable makes a walk from the claim index's front itself only
# when the last took less than that many ms; 0: its front look's thread makes them all
# (tests/integration/test_claim_queues.py).
if (_inline := os.environ.get("LEASEJOBS_TEST_FRONT_WALK_INLINE_MS")) is not None:
    LEASEJOBS["FRONT_WALK_INLINE_MS"] = float(_inline)

# A worker started with this variable says what it did this often (tests/integration/test_worker_says.py).
if _summary_seconds := os.environ.get("LEASEJOBS_TEST_SUMMARY_SECONDS"):
    LEASEJOBS["SUMMARY_SECONDS"] = float(_summary_seconds)
