"""Job bodies of review 52: tests/integration/test_review52.py.

Each body writes what it did to a journal (``tests.journal``: S start, E end), so a
test reads what really ran and when, from every process.
"""

import time

from leasejobs import task
from tests.journal import note


@task(takes_context=True, max_attempts=1)
def works(ctx, path, seconds):
    """Work for ``seconds`` (a call that usually answers at once, sometimes late)."""
    note(path, "S", ctx)
    time.sleep(seconds)
    note(path, "E", ctx)
    return "fine"
