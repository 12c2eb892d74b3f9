"""A module whose import has a side effect: it writes a marker file.

A job row naming this module (or a function in it) as its task must never
make a worker import it: tests/*/test_hostile_input.py checks that no marker
appears. ``LEASEJOBS_IMPORT_MARKER`` names the file; unset, importing it does
nothing, so collecting or linting the tests cannot leave one behind.
"""

import os
from pathlib import Path

if marker := os.environ.get("LEASEJOBS_IMPORT_MARKER"):
    Path(marker).write_text(f"imported by pid {os.getpid()}\n")


def run() -> str:
    return "this ran"
