"""The system check that refuses a schedule which could not run (``leasejobs.E010``).

``runworker`` (and ``check``, ``migrate``, ``runserver``) run it at start, so
a bad expression, an unknown zone or a schedule naming an unregistered task
stops the process with one sentence, instead of failing at the first tick.
It imports the tasks modules (as the worker does) to see their
``@periodic`` declarations.
"""

from typing import Any

from django.core.checks import Error, register

from leasejobs.jobs.discovery import discover
from leasejobs.periodic import schedules


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    try:
        discover()
    except Exception as exc:  # an import error in a tasks module: say so, do not crash the check
        return [Error(f"Importing the tasks modules failed: {exc}", id="leasejobs.E011")]
    _found, errors = schedules.load()
    return [Error(message, id="leasejobs.E010") for message in errors]
