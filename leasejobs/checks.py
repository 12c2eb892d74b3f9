"""System checks: mistakes in the LEASEJOBS setting, reported at start-up.

``runworker``, ``runserver``, ``migrate`` and ``check`` run them, so a typo
such as ``LEASE_SECOND`` stops the process with one clear line instead of
being silently ignored.
"""

from typing import Any

from django.core.checks import Error, register

from leasejobs import conf, controls


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    unknown = conf.unknown_keys()
    if not unknown:
        return []
    return [
        Error(
            f"Unknown LEASEJOBS setting(s): {', '.join(unknown)}.",
            hint=f"Known settings: {', '.join(sorted(conf.DEFAULTS))}.",
            id="leasejobs.E002",
        )
    ]


@register()
def check_queues(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Bad limits in LEASEJOBS["QUEUES"] stop the worker at start, in one sentence."""
    try:
        controls.configured()
    except ValueError as exc:
        return [Error(f"LEASEJOBS['QUEUES']: {exc}", id="leasejobs.E003")]
    return []
