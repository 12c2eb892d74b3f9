"""A typo in LEASEJOBS stops manage.py with one clear line, not silence."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError


def test_an_unknown_leasejobs_setting_fails_the_system_check(settings):
    settings.LEASEJOBS = {"LEASE_SECOND": 30}
    with pytest.raises(
        SystemCheckError, match=r"leasejobs.E002.*Unknown LEASEJOBS setting\(s\): LEASE_SECOND"
    ):
        call_command("check")


def test_known_settings_pass_the_system_check(settings):
    settings.LEASEJOBS = {"LEASE_SECONDS": 30, "MAX_ATTEMPTS": 3}
    call_command("check")
