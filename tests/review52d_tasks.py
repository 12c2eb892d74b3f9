"""Bodies of review 52 (d): tests/integration/test_review52d.py.

Each body appends what it did to a journal file (one line per event, ``<kind> <job>
<attempt> <time> <detail>``), so a test reads what really ran, from every process.
"""

import os
import time

from leasejobs import WaitTimeout, task


def journal(path, kind, ctx, detail=""):
    with open(path, "a") as f:
        f.write(f"{kind} {ctx.job_id} {ctx.attempt} {time.time():.6f} {detail}\n")


@task(takes_context=True, max_attempts=1)
def fails_first_time(ctx, path):
    """A workflow parent whose first run fails (a service down); a retry succeeds."""
    journal(path, "S", ctx)
    if ctx.runs == 1:
        raise ConnectionError("the service is down")
    return "ok"


@task(takes_context=True, max_attempts=1)
def always_fails(ctx, path):
    """A workflow parent that fails every time."""
    journal(path, "S", ctx)
    raise ValueError("bad input")


@task(takes_context=True, max_attempts=1)
def after_both(ctx, path):
    """A child that must run only once both parents are done."""
    journal(path, "S", ctx)
    return sorted(ctx.parent_results)


def _reading():
    """A step's function: a sensor reading in nanoseconds (a float) and a signed zero."""
    return {"at_ns": 1.7e18, "drift": -0.0}


@task(takes_context=True, max_attempts=1)
def measures_then_naps(ctx, path):
    """A step, then a durable sleep: the next attempt replays the step's stored result."""
    value = ctx.step("reading", _reading)
    journal(path, "V", ctx, repr(value).replace(" ", ""))
    ctx.sleep("nap", 0)
    return repr(value)


def _wait_for_file(marker, timeout=60.0):
    end = time.monotonic() + timeout
    while not os.path.exists(marker):
        if time.monotonic() > end:
            raise TimeoutError(f"{marker} never appeared")
        time.sleep(0.05)


@task(takes_context=True, max_attempts=1)
def fails_first_then_waits(ctx, path, marker):
    """A parent whose first run fails; its retry waits for ``marker`` (a slow service), then is done."""
    journal(path, "S", ctx)
    if ctx.runs == 1:
        raise ConnectionError("the service is down")
    _wait_for_file(marker)
    journal(path, "E", ctx)
    return "retried and done"


@task(takes_context=True, max_attempts=1)
def waits_then_done(ctx, path, marker):
    """A parent that is done once ``marker`` exists."""
    journal(path, "S", ctx)
    _wait_for_file(marker)
    journal(path, "E", ctx)
    return "done"


@task(takes_context=True, max_attempts=1)
def cleanup(ctx, path):
    """A run-anyway child: notes its start and returns its parents' results (keys as text)."""
    journal(path, "S", ctx)
    return {str(k): v for k, v in sorted(ctx.parent_results.items())}


@task(takes_context=True, max_attempts=1)
def waits_for_packing(ctx, path, key, timeout):
    """Wait for the warehouse's event; past the timeout, take the other path."""
    journal(path, "S", ctx)
    try:
        payload = ctx.wait_for("packed", key, timeout=timeout)
    except WaitTimeout:
        return {"timed_out": True}
    return {"payload": payload}


@task(takes_context=True, max_attempts=1)
def parks(ctx, path, seconds):
    """Sleep "until an operator's Retry now" (a durable sleep of ``seconds``), then finish."""
    journal(path, "S", ctx)
    ctx.sleep("parked", seconds)
    journal(path, "E", ctx)
    return "resumed"


@task(takes_context=True, max_attempts=1)
def works(ctx, path, seconds):
    """A node of a wide workflow: works ``seconds``, noting its start."""
    journal(path, "S", ctx)
    time.sleep(seconds)
    return ctx.job_id


@task(takes_context=True, max_attempts=1)
def charges_slowly(ctx, path, seconds):
    """A durable step that calls a slow payment service (``seconds``), noting when it is inside."""

    def charge():
        journal(path, "I", ctx)
        time.sleep(seconds)
        return {"charge": "ch_1"}

    return ctx.step("charge", charge)
