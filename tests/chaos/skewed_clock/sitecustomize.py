"""Put this process's wall clock ``LEASEJOBS_CLOCK_SKEW_SECONDS`` off, as on a badly set machine.

Only for worker processes started by ``tests/chaos/test_clock_skew.py``, which
puts this directory first on ``PYTHONPATH`` (Python imports ``sitecustomize``
at start). ``time.time()``, ``time.time_ns()`` and ``datetime.now()`` /
``utcnow()`` / ``today()`` (hence ``django.utils.timezone.now()``) are shifted;
``time.monotonic()`` is a stopwatch, not a clock, and is left alone.
"""

import datetime
import os
import time

_skew = float(os.environ.get("LEASEJOBS_CLOCK_SKEW_SECONDS") or 0)

if _skew:
    _time, _time_ns, _shift = time.time, time.time_ns, datetime.timedelta(seconds=_skew)
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1_000_000_000)

    class _SkewedDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return super().now(tz) + _shift

        @classmethod
        def utcnow(cls):
            return super().utcnow() + _shift

        @classmethod
        def today(cls):
            return super().today() + _shift

    datetime.datetime = _SkewedDatetime
