"""A worker runs under a role with only the grants of docs/least-privilege.md.

The role is created by the test (a random name: roles are shared by every
database of the server) with a random password, so the test works under
trust and password authentication alike, and it is dropped at the end.
"""

import secrets
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from django.db import connection
from psycopg import sql

import leasejobs
from leasejobs.models import Job, SideEffect
from tests.chaos.helpers import SETTINGS
from tests.chaos.tasks import side_effect_only
from tests.helpers import database_url
from tests.testapp.step_tasks import steps_only

#: The required grants of docs/least-privilege.md, for role {role} on database {db}. Job
#: bodies that enqueue jobs also need INSERT on leasejobs_job; these do not.
GRANTS = [
    "GRANT CONNECT ON DATABASE {db} TO {role}",
    "GRANT SELECT, UPDATE ON leasejobs_job TO {role}",
    "GRANT SELECT, INSERT ON leasejobs_sideeffect TO {role}",
    "GRANT SELECT ON leasejobs_queue TO {role}",
    "GRANT SELECT, UPDATE ON leasejobs_slot TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE leasejobs_worker TO {role}",
]


def as_role(url: str, role: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}").geturl()


@pytest.fixture
def worker_role(transactional_db):
    """A login role with the documented grants only; dropped (with its grants) afterwards."""
    role, password = f"leasejobs_worker_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
    names = {"role": sql.Identifier(role), "db": sql.Identifier(connection.settings_dict["NAME"])}
    with psycopg.connect(database_url(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {role} LOGIN PASSWORD {pw}").format(pw=password, **names))
        try:
            for grant in GRANTS:
                admin.execute(sql.SQL(grant).format(**names))
            yield as_role(database_url(), role, password)
        finally:
            # Its sessions first (the worker has exited; this is for a failed test).
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
            admin.execute(sql.SQL("DROP OWNED BY {role}").format(**names))
            admin.execute(sql.SQL("DROP ROLE {role}").format(**names))


def test_a_worker_runs_with_only_the_documented_grants(start_worker, worker_role):
    jobs = side_effect_only.bulk_enqueue([((f"least-privilege:{i}",), {}) for i in range(20)])
    worker = start_worker("--burst", env={"DATABASE_URL": worker_role, "DJANGO_SETTINGS_MODULE": SETTINGS})
    assert worker.wait(timeout=60) == 0, worker.log()[-3000:]
    assert "permission denied" not in worker.log()
    done = Job.objects.filter(id__in=[j.id for j in jobs], status="done", result=True)
    assert done.count() == len(jobs)
    effects = SideEffect.objects.filter(key__startswith="least-privilege:")
    assert sorted(effects.values_list("job_id", "fencing_token")) == sorted((j.id, 1) for j in jobs)


#: docs/least-privilege.md's grants for job bodies with durable steps, sleeps and waits.
STEP_GRANTS = [
    "GRANT SELECT, INSERT, UPDATE ON leasejobs_step TO {role}",
    "GRANT SELECT ON leasejobs_event TO {role}",
]


def test_durable_steps_run_with_their_documented_grants(start_worker, worker_role):
    role = sql.Identifier(urlsplit(worker_role).username or "")
    with psycopg.connect(database_url(), autocommit=True) as admin:
        for grant in STEP_GRANTS:
            admin.execute(sql.SQL(grant).format(role=role))
    leasejobs.send_event("least-privilege", {"ok": True})
    jobs = [steps_only.enqueue("least-privilege") for _ in range(3)]
    worker = start_worker("--burst", env={"DATABASE_URL": worker_role, "DJANGO_SETTINGS_MODULE": SETTINGS})
    assert worker.wait(timeout=60) == 0, worker.log()[-3000:]
    assert "permission denied" not in worker.log()
    assert [Job.objects.get(pk=j.id).result for j in jobs] == [[1, {"ok": True}]] * 3


def test_the_worker_role_can_do_nothing_else(worker_role):
    """The grants are least: no insert of jobs, no delete, no rewriting side effects, no other table.

    (Whether a role may CREATE in schema public is the server's default, not
    a grant of ours: PostgreSQL 15 no longer allows it; see the docs for 14.)
    """
    refused = [
        "INSERT INTO leasejobs_job (task_name) VALUES ('x')",
        "DELETE FROM leasejobs_job",
        "DELETE FROM leasejobs_sideeffect",
        "UPDATE leasejobs_sideeffect SET data = NULL",
        "TRUNCATE leasejobs_job",
        "SELECT count(*) FROM auth_user",
    ]
    with psycopg.connect(worker_role, autocommit=True) as conn:
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
