"""The queue in a database of its own: ``LEASEJOBS["DATABASE"]`` and the shipped router.

Two fresh databases, the test app's rows in one and the queue in the other,
driven through real ``manage.py`` processes with ``tests.two_databases_settings``.
"""

import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.helpers import ROOT, WorkerProcess, database_url, worker_env

ENQUEUE = """
from django.db import transaction
from tests.testapp.tasks import receipt, record
with transaction.atomic(using="queue"):
    record.enqueue(1)
record.bulk_enqueue([((i,), {}) for i in range(2, 6)])
receipt.enqueue(7)
"""


def _url(name: str) -> str:
    return urlunsplit(urlsplit(database_url())._replace(path=f"/{name}"))


@pytest.fixture
def two_databases() -> Iterator[dict[str, str]]:
    base = urlsplit(database_url()).path.lstrip("/")
    names = {"APP_DATABASE_URL": f"{base}_app", "QUEUE_DATABASE_URL": f"{base}_queue"}
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
    yield {key: _url(name) for key, name in names.items()}
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        for name in names.values():
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {name for (name,) in rows}


def test_the_queue_lives_in_its_own_database_and_the_worker_follows_it(two_databases, tmp_path):
    env = worker_env(DJANGO_SETTINGS_MODULE="tests.two_databases_settings", **two_databases)
    manage(env, "migrate", "--noinput")
    manage(env, "migrate", "--noinput", "--database", "queue")
    app, queue = two_databases["APP_DATABASE_URL"], two_databases["QUEUE_DATABASE_URL"]
    assert "leasejobs_job" in tables(queue) and "leasejobs_job" not in tables(app)
    assert "testapp_bodyrun" in tables(app)

    manage(env, "shell", "-c", ENQUEUE)
    worker = WorkerProcess(["--burst", "--worker-id", "q"], tmp_path / "worker.log", env)
    try:
        assert worker.wait(timeout=120) == 0, worker.log()
    finally:
        worker.stop()
    with psycopg.connect(queue) as conn:
        assert conn.execute("SELECT status, count(*) FROM leasejobs_job GROUP BY 1").fetchall() == [
            ("done", 6)
        ]
        assert conn.execute("SELECT key, fencing_token FROM leasejobs_sideeffect").fetchall() == [
            ("receipt:7", 1)
        ]
    with psycopg.connect(app) as conn:
        assert conn.execute("SELECT count(*) FROM testapp_bodyrun").fetchone() == (6,)
        assert conn.execute("SELECT key FROM testapp_sent").fetchall() == [("receipt:7",)]
    assert "Pruned 6 finished job(s)" in manage(env, "leasejobs_prune", "--older-than", "0")
    with psycopg.connect(queue) as conn:
        assert conn.execute("SELECT count(*) FROM leasejobs_job").fetchone() == (0,)


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ("default", "The leasejobs tables are missing in"),
        ("nope", "The queue's database alias 'nope' is not in DATABASES."),
    ],
)
def test_runworker_database_overrides_the_setting(two_databases, tmp_path, alias, message):
    env = worker_env(DJANGO_SETTINGS_MODULE="tests.two_databases_settings", **two_databases)
    manage(env, "migrate", "--noinput")  # the app's tables only: the router keeps the queue's away
    worker = WorkerProcess(["--database", alias], tmp_path / "worker.log", env)
    try:
        assert worker.wait(timeout=60) == 1
    finally:
        worker.stop()
    assert message in worker.log() and "Traceback" not in worker.log()
