"""A typo in LEASEJOBS, or a database leasejobs cannot use, stops manage.py with one clear line."""

import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

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
