"""A typo in LEASEJOBS, or a database leasejobs cannot use, stops manage.py with one clear line."""

import subprocess
import sys
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from leasejobs import checks
from tests.helpers import ROOT, worker_env

#: What plain ``manage.py check`` says of a project on SQLite, Django's default.
NOT_POSTGRESQL = (
    "?: (leasejobs.E005) leasejobs needs PostgreSQL, but DATABASES['default'] uses "
    "django.db.backends.sqlite3: set its ENGINE to 'django.db.backends.postgresql' and point it at a "
    "PostgreSQL database."
)


def test_an_unknown_leasejobs_setting_fails_the_system_check(settings):
    settings.LEASEJOBS = {"LEASE_SECOND": 30}
    with pytest.raises(
        SystemCheckError, match=r"leasejobs.E002.*Unknown LEASEJOBS setting\(s\): LEASE_SECOND"
    ):
        call_command("check")


def test_known_settings_pass_the_system_check(settings):
    settings.LEASEJOBS = {"LEASE_SECONDS": 30, "MAX_ATTEMPTS": 3}
    call_command("check")


@pytest.mark.parametrize("command", ["check", "migrate"])
def test_a_database_that_is_not_postgresql_fails_plain_check_and_migrate_before_any_sql(command):
    done = subprocess.run(
        [sys.executable, "manage.py", command],
        cwd=ROOT,
        env=worker_env(DJANGO_SETTINGS_MODULE="tests.settings_sqlite"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert NOT_POSTGRESQL in done.stderr.splitlines(), done.stderr
    assert "Traceback" not in done.stderr and "syntax error" not in done.stderr


def test_a_queue_database_alias_that_is_not_in_databases_fails_the_check(settings):
    settings.LEASEJOBS = {"DATABASE": "queue"}
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert (
        "?: (leasejobs.E005) LEASEJOBS['DATABASE'] is 'queue', which is not in DATABASES: add that alias "
        "to DATABASES or set LEASEJOBS['DATABASE'] to one that is there."
    ) in str(refused.value).splitlines()


#: A bad value of each key leasejobs.E006 checks, and the one line ``manage.py check`` prints for it.
BAD_VALUES = [
    (
        "LEASE_SECONDS",
        -1,
        "must be a number of seconds, at least 1 and a day at most, not -1: a shorter lease",
    ),
    ("LEASE_SECONDS", "abc", "must be a number of seconds, at least 1 and a day at most, not 'abc'."),
    (
        "LEASE_SECONDS",
        0.5,
        "must be a number of seconds, at least 1 and a day at most, not 0.5: a shorter lease",
    ),
    ("MAX_ATTEMPTS", 0, "must be a whole number of at least 1, not 0."),
    ("RETRY_BACKOFF_SECONDS", -1, "must be a finite number of seconds, 0 or more, not -1."),
    ("RETRY_BACKOFF_MAX_SECONDS", "x", "must be a finite number of seconds, 0 or more, not 'x'."),
    ("MAX_SNOOZES", -1, "must be a whole number of at least 0, not -1."),
    (
        "TASK_MODULES",
        "myapp.tasks",
        "must be a list of module paths, such as ['myapp.jobs'], not 'myapp.tasks'.",
    ),
    ("MAX_PAYLOAD_BYTES", 0, "must be a whole number of at least 1, not 0."),
    ("POLL_INTERVAL_SECONDS", 0, "must be a number of seconds, more than 0 and a day at most, not 0."),
    # "Never poll" written as a large number: Python's waits refuse it.
    (
        "POLL_INTERVAL_SECONDS",
        1e10,
        "must be a number of seconds, more than 0 and a day at most, not 10000000000.0.",
    ),
    ("NOTIFY_CHANNEL", "", "must be a channel name of 1 to 63 bytes, PostgreSQL's longest, not ''."),
    ("NOTIFY_CHANNEL", "c" * 64, "must be a channel name of 1 to 63 bytes, PostgreSQL's longest, not 'ccc"),
    ("PREFETCH", -1, "must be a whole number of at least 0, not -1."),
    ("PREFETCH_BYTES", 1.5, "must be a whole number of at least 0, not 1.5."),
    ("STOP_GRACE_SECONDS", "five", "must be a number of seconds, 0 or more and a day at most, not 'five'."),
    ("STOP_GRACE_SECONDS", -1, "must be a number of seconds, 0 or more and a day at most, not -1."),
    ("METRICS_PORT", 70000, "must be None (no metrics) or a port number from 1 to 65535, not 70000."),
    ("OPENTELEMETRY", "no", "must be None (spans when a tracer provider is set) or False (none), not 'no'."),
    ("SUMMARY_SECONDS", float("nan"), "must be a number of seconds, more than 0 and a day at most, not nan."),
    ("LOG_FORMAT", "xml", "must be one of 'text', 'json', not 'xml'."),
    ("LISTEN_URL", 5, "must be None or a string, not 5."),
]


#: Values the worker reads through ``float()`` or ``int()`` as a project writes them: from
#: the environment (a string), a ``Decimal``, bytes in a float's notation (found by review 6).
READ_AS_THE_WORKER_READS = [
    ("LEASE_SECONDS", "60"),
    ("LEASE_SECONDS", Decimal("30")),
    ("PREFETCH_BYTES", 64e6),
    ("POLL_INTERVAL_SECONDS", "0.5"),
    ("STOP_GRACE_SECONDS", "5"),
    ("MAX_PAYLOAD_BYTES", "1048576"),
]


@pytest.mark.parametrize(("key", "value"), READ_AS_THE_WORKER_READS)
def test_a_value_the_worker_reads_as_a_number_passes(settings, key, value):
    settings.LEASEJOBS = {key: value}
    assert checks.bad_value(key) is None


@pytest.mark.parametrize(("key", "value", "sentence"), BAD_VALUES)
def test_a_bad_value_fails_the_check_in_one_line_naming_key_value_and_rule(settings, key, value, sentence):
    settings.LEASEJOBS = {key: value}
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    lines = [line for line in str(refused.value).splitlines() if "leasejobs.E006" in line]
    assert len(lines) == 1, str(refused.value)
    assert lines[0].startswith(f"?: (leasejobs.E006) LEASEJOBS[{key!r}] {sentence}"), lines[0]


def test_every_setting_without_a_check_of_its_own_has_a_rule():
    """A new key of DEFAULTS gets a rule here, or is named as checked elsewhere."""
    from leasejobs.checks import VALUE_RULES
    from leasejobs.conf import DEFAULTS

    elsewhere = {
        "QUEUES",
        "PERIODIC",
        "DATABASE",
        "VACUUM_THRESHOLD",
        "VACUUM_SCALE_FACTOR",
        "FRONT_WALK_INLINE_MS",
    }
    assert set(VALUE_RULES) == set(DEFAULTS) - elsewhere


def test_the_defaults_and_every_good_edge_pass(settings):
    from leasejobs.conf import DEFAULTS

    settings.LEASEJOBS = dict(DEFAULTS)
    call_command("check")
    settings.LEASEJOBS = {
        "LEASE_SECONDS": 1,
        "MAX_SNOOZES": 0,
        "PREFETCH": 0,
        "PREFETCH_BYTES": 0,
        "STOP_GRACE_SECONDS": 0,
        "RETRY_BACKOFF_SECONDS": 0,
        "NOTIFY_CHANNEL": "c" * 63,
        "TASK_MODULES": ("tests.testapp.tasks",),
        "METRICS_PORT": 9100,
        "OPENTELEMETRY": False,
        "LOG_FORMAT": "json",
        "LISTEN_URL": None,
    }
    call_command("check")


def test_a_task_modules_string_is_not_imported_letter_by_letter(settings):
    """Discovery (leasejobs.E011, runworker) says the same sentence, not ``No module named 'm'``."""
    settings.LEASEJOBS = {"TASK_MODULES": "myapp.tasks"}
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert "No module named" not in str(refused.value)
