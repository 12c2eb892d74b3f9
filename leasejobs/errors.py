"""One entry of ``Job.errors``: what a failed attempt left behind.

The worker appends one per failed attempt (in the same statement that
finishes it, fenced by ``attempt``); the admin shows them and the Django
Tasks backend turns them into ``TaskError``s. ``ErrorEntry`` names the keys
all of them read and write.
"""

import traceback
from typing import Any, TypedDict


class ErrorEntry(TypedDict):
    """A failed attempt: its fencing token, its worker, the exception's class path and traceback."""

    attempt: int
    worker_id: str
    exception_class: str
    traceback: str


def class_path(cls: type) -> str:
    """``module.QualName`` of a class, as ``exception_class`` stores it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def exception_entry(attempt: int, worker_id: str, exc: BaseException) -> ErrorEntry:
    """The entry of an attempt that raised ``exc``."""
    return ErrorEntry(
        attempt=attempt,
        worker_id=worker_id,
        exception_class=class_path(type(exc)),
        traceback="".join(traceback.format_exception(exc)),
    )


def read_entries(value: Any) -> list[ErrorEntry]:
    """``Job.errors`` (a JSON list, ``Any`` to Django) typed as the entries it holds."""
    return list(value or [])
