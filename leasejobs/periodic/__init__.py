"""Periodic jobs: exactly one job per (schedule, tick) across every worker, on the database clock.

- ``schedules``: ``@periodic(...)`` and ``LEASEJOBS["PERIODIC"]``, checked into ``Schedule``s;
- ``ticks``: when a cron expression ticks, in its zone (cronsim);
- ``sql``: the two statements (register the schedules; decide a tick and insert its job);
- ``scheduler``: ``Scheduler.run_due()``, which every worker calls in a loop;
- ``status``: what ``leasejobs_periodic`` and the admin show;
- ``checks``: the system check that refuses a bad schedule at start.

``from leasejobs import periodic`` gives this module, and ``@periodic("0 7 * *
*")`` must work on it: the package is both the decorator's name in the
public API and the home of its parts. So the module is made callable (its
class is swapped for a ModuleType subclass whose ``__call__`` is the
decorator), instead of renaming either.
"""

import sys
import types
from typing import Any

from leasejobs.periodic.schedules import Schedule, periodic

__all__ = ["Schedule", "periodic"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return periodic(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
