"""Without ``django.tasks`` (Django 5.2) the backend module says it needs Django 6; the rest works.

On Django 5.2 this is the real thing; on Django 6 ``django.tasks`` is hidden
from the import system for the duration of each test, so both CI runs check it.
"""

import re
import sys
from importlib import import_module

import pytest
from django.core.exceptions import ImproperlyConfigured

from leasejobs import tasks_backend
from leasejobs.jobs import registry
from tests.testapp import tasks as leasejobs_tasks


@pytest.fixture
def no_django_tasks(monkeypatch):
    """Import leasejobs' Django Tasks modules afresh as if django.tasks did not exist.

    monkeypatch puts back the original modules, and the package attributes a
    fresh import rebinds, at teardown.
    """
    for name in [n for n in sys.modules if n == "django.tasks" or n.startswith("django.tasks.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "django.tasks", None)
    for name in ("leasejobs.backend", "leasejobs.tasks_backend.backend"):
        if name in sys.modules:
            package, _, module = name.rpartition(".")
            monkeypatch.setattr(sys.modules[package], module, sys.modules[name])
            monkeypatch.delitem(sys.modules, name)


def test_the_backend_module_says_it_needs_django_6(no_django_tasks):
    message = "leasejobs.backend.LeaseJobsBackend needs Django 6.0 or newer (django.tasks); this is Django "
    with pytest.raises(ImproperlyConfigured, match="^" + re.escape(message)):
        import_module("leasejobs.backend")


def test_task_discovery_skips_django_tasks_and_keeps_leasejobs_tasks(no_django_tasks):
    before = registry.all_tasks()
    tasks_backend.register_from([leasejobs_tasks])
    assert registry.all_tasks() == before
    assert registry.get("tests.testapp.tasks.add") is leasejobs_tasks.add
