"""The integration half of tests/unit/test_readme.py: its tests that start workers or commit."""

import pytest
from django.db import connection

from tests import readme
from tests.connection_budget import many_connections


@pytest.mark.integration
@many_connections(15)
def test_the_readme_runs_from_start_to_end(tmp_path):
    database = readme.Database(server_url(), f"{connection.settings_dict['NAME']}_readme")
    database.create()
    project = readme.Project(tmp_path, readme.this_venv_bin(), database)
    found = readme.blocks()
    ran = []
    try:
        for block in found:
            if not project.wanted(block):
                continue
            project.run(block, found)
            ran.append(block.line)
    finally:
        project.close()
        database.drop()
    assert len(ran) == len([b for b in found if project.wanted(b)])


def server_url() -> str:
    from localworkers import database_url

    return database_url()
