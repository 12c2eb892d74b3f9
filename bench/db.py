"""The bench's own psycopg connections to Django's database, and what it runs on."""

import os
import platform
import time
from typing import Any

import django
import psycopg

from leasejobs.db.connection import connection_params
from leasejobs.db.store import CLAIM_SETTINGS

#: What the worker's claim connection sets (``leasejobs.db.store.CLAIM_SETTINGS``).
CLAIM_SESSION = " ".join(f"-c {name}={value}" for name, value in CLAIM_SETTINGS.items())


def connect(session: str = "") -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to Django's database (prepared statements on).

    ``session``: extra server settings, as ``-c name=value`` options.
    """
    params: dict[str, Any] = connection_params()
    options = " ".join(filter(None, [params.pop("options", ""), session]))
    if options:
        params["options"] = options
    return psycopg.connect(**params, autocommit=True, prepare_threshold=0)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    with connect() as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync'), current_setting('shared_buffers'), current_setting('autovacuum')"
        ).fetchone()
    assert row is not None
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "postgresql": row[0],
        "synchronous_commit": row[1],
        "fsync": row[2],
        "shared_buffers": row[3],
        "autovacuum": row[4],
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "django": django.get_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "load_before": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
