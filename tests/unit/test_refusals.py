"""Mistakes refused where they are made, each in one sentence that says what to do.

Here: a task no worker would register (defined outside what ``runworker``
imports), arguments that do not fit the function (``enqueue`` and
``bulk_enqueue``, naming ``takes_context`` when that is the likely mistake),
values JSON would change (a tuple, a non-string key), an enqueue before
``migrate``, and the same through Django's Tasks framework. Elsewhere: a
database that is not PostgreSQL (tests/unit/test_checks.py), ``leasejobs_health
--queue`` on a queue nothing uses (tests/integration/test_observability.py), argparse's
sentences (tests/unit/test_arguments.py).

Whether a worker would find a task depends on what the process imported
before, so those cases run each in a process of its own, importing the
modules of ``tests/discoveryapp`` in the order a web process might.
"""

import subprocess
import sys
from importlib.util import find_spec

import pytest
from django.db import ProgrammingError, connection, transaction

from leasejobs import task
from leasejobs.models import Job
from tests.helpers import ROOT, worker_env
from tests.testapp.tasks import add, forgot_context, kinds

needs_django_tasks = pytest.mark.skipif(find_spec("django.tasks") is None, reason="Django 6+ only")

#: Imports the modules of argv[1] in order, then enqueues (or bulk-enqueues) the
#: task argv[2] names with the argument 1, in a transaction it rolls back.
ENQUEUE = """
import sys
from importlib import import_module

import django

django.setup()
from django.db import transaction


class Rollback(Exception):
    pass


for name in sys.argv[1].split(","):
    import_module(name)
module, name = sys.argv[2].rsplit(".", 1)
task = getattr(import_module(module), name)
try:
    with transaction.atomic():
        task.enqueue(1) if sys.argv[3] == "enqueue" else task.bulk_enqueue([((1,), {})])
        raise Rollback
except Rollback:
    print("enqueued")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def enqueue_after(imports: list[str], task_path: str, how: str = "enqueue") -> str:
    """What a fresh process says after importing ``imports`` and enqueueing ``task_path``."""
    done = subprocess.run(
        [sys.executable, "-c", ENQUEUE, ",".join(imports), task_path, how],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# -- a task no worker would register ---------------------------------------------------


@pytest.mark.parametrize(
    ("imports", "task_path"),
    [
        # The tasks module itself.
        (["tests.testapp.tasks"], "tests.testapp.tasks.record"),
        # A submodule of a tasks package that the package imports (importing it runs the package first).
        (["tests.discoveryapp.tasks.emails"], "tests.discoveryapp.tasks.emails.welcome"),
        # A module the tasks package imports, imported first by someone else (a view, say).
        (["tests.discoveryapp.shared"], "tests.discoveryapp.shared.shared"),
        # The same, two imports away from the tasks package.
        (["tests.discoveryapp.deeper"], "tests.discoveryapp.deeper.deeper"),
        # Imported while Django sets up (models, AppConfig.ready()), in a worker as well.
        (["tests.discoveryapp.models"], "tests.discoveryapp.models.set_up_with_django"),
    ],
    ids=["tasks module", "tasks package's submodule", "imported by tasks", "imported two away", "models"],
)
@pytest.mark.django_db
def test_a_task_a_worker_would_find_enqueues(imports, task_path):
    assert enqueue_after(imports, task_path) == "enqueued"


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["enqueue", "bulk_enqueue"])
def test_a_task_defined_where_no_worker_looks_is_refused_naming_its_module(how):
    assert enqueue_after(["tests.discoveryapp.elsewhere"], "tests.discoveryapp.elsewhere.not_found", how) == (
        "ImproperlyConfigured: Task tests.discoveryapp.elsewhere.not_found is defined in "
        "tests.discoveryapp.elsewhere, which runworker does not import, so no worker would run it: "
        "define it in tests.discoveryapp.tasks or import tests.discoveryapp.elsewhere there, or add "
        "'tests.discoveryapp.elsewhere' to LEASEJOBS['TASK_MODULES']."
    )


@pytest.mark.django_db
def test_a_submodule_the_tasks_package_does_not_import_is_refused():
    said = enqueue_after(
        ["tests.discoveryapp.tasks.unimported"], "tests.discoveryapp.tasks.unimported.orphan"
    )
    assert said == (
        "ImproperlyConfigured: Task tests.discoveryapp.tasks.unimported.orphan is defined in "
        "tests.discoveryapp.tasks.unimported, which runworker does not import, so no worker would run "
        "it: define it in tests.discoveryapp.tasks or import tests.discoveryapp.tasks.unimported there, "
        "or add 'tests.discoveryapp.tasks.unimported' to LEASEJOBS['TASK_MODULES']."
    )


def test_a_module_listed_in_task_modules_is_found(db, settings):
    from tests.discoveryapp.elsewhere import not_found

    settings.LEASEJOBS = {**settings.LEASEJOBS, "TASK_MODULES": ["tests.discoveryapp.elsewhere"]}
    assert not_found.enqueue(1).task_name == "tests.discoveryapp.elsewhere.not_found"


def test_tasks_a_worker_registers_in_code_of_its_own_are_declared_and_enqueue(db):
    from bench.tasks import register_tasks

    job = register_tasks()["noop"].enqueue()
    assert Job.objects.get(pk=job.pk).task_name == "leasejobs.bench.noop"


# -- arguments that do not fit the function -------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [
        ((1,), {}, "missing a required argument: 'b'"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1, 2), {"c": 3}, "got an unexpected keyword argument 'c'"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
    ],
)
def test_arguments_that_do_not_fit_are_refused_at_enqueue(db, args, kwargs, reason):
    with pytest.raises(TypeError) as refused:
        add.enqueue(*args, **kwargs)
    assert str(refused.value) == (
        f"The arguments do not fit tests.testapp.tasks.add(a, b): {reason}; pass the arguments the "
        "function takes."
    )
    assert not Job.objects.exists()


@pytest.mark.parametrize("method", ["bulk_enqueue", "bulk_enqueue_ids"])
def test_a_bulk_enqueue_names_the_call_that_does_not_fit_and_inserts_none(db, method):
    with pytest.raises(TypeError) as refused:
        getattr(add, method)([((1, 2), {}), ((3, 4), {}), ((5,), {})])
    assert str(refused.value) == (
        "The arguments of call 2 (counting from 0) do not fit tests.testapp.tasks.add(a, b): missing a "
        "required argument: 'b'; pass the arguments the function takes."
    )
    assert not Job.objects.exists()


def test_a_first_parameter_named_ctx_without_takes_context_is_named_as_the_likely_mistake(db):
    with pytest.raises(TypeError) as refused:
        forgot_context.enqueue(42)
    assert str(refused.value) == (
        "The arguments do not fit tests.testapp.tasks.forgot_context(ctx, order_id): missing a required "
        "argument: 'order_id'; its first parameter, ctx, looks like the job's context, so declare the "
        "task with @task(takes_context=True), which passes the context there."
    )
    with pytest.raises(TypeError, match="takes_context=True"):
        forgot_context.bulk_enqueue([((42,), {})])


def test_takes_context_without_a_parameter_for_it_is_refused_where_the_task_is_defined():
    def no_parameters():
        return None

    with pytest.raises(ValueError) as refused:
        task(takes_context=True, name="tests.no_parameters")(no_parameters)
    assert str(refused.value) == (
        "tests.unit.test_refusals.test_takes_context_without_a_parameter_for_it_is_refused_where_the_task_is_"
        "defined.<locals>.no_parameters is declared with takes_context=True but has no first positional "
        "parameter for the job's context: add one (ctx) or drop takes_context."
    )


# -- values JSON would change ----------------------------------------------------------


def test_a_tuple_is_refused_rather_than_stored_as_a_list(db):
    with pytest.raises(TypeError) as refused:
        add.enqueue((1, 2), [3])
    assert str(refused.value) == (
        "The arguments of tests.testapp.tasks.add hold a tuple at args[0], which JSON stores as a list: "
        "pass a list."
    )
    with pytest.raises(TypeError, match=r"a tuple at kwargs\['points'\]\[1\]"):
        kinds.bulk_enqueue([((), {"points": [[0, 0], (1, 1)]})])
    assert not Job.objects.exists()


def test_a_dict_key_that_is_no_string_is_refused_rather_than_stored_as_one(db):
    with pytest.raises(TypeError) as refused:
        kinds.enqueue(scores={1: "gold"})
    assert str(refused.value) == (
        "The arguments of tests.testapp.tasks.kinds hold the dict key 1 (int) at kwargs['scores'], which "
        'JSON stores as the string "1": use string keys.'
    )
    assert not Job.objects.exists()


def test_values_json_keeps_as_they_are_enqueue_as_given(db):
    job = kinds.enqueue([1, [2, {"k": None}]], "[(not a tuple)]", n=1.5, m={"1": [True]})
    assert (job.args, job.kwargs) == (
        [[1, [2, {"k": None}]], "[(not a tuple)]"],
        {"n": 1.5, "m": {"1": [True]}},
    )
    stored = Job.objects.get(pk=job.pk)
    assert (stored.args, stored.kwargs) == (job.args, job.kwargs)


# -- an enqueue before migrate ---------------------------------------------------------

MIGRATE = "run `python manage.py migrate` first."


@pytest.mark.parametrize("method", ["enqueue", "bulk_enqueue"])
def test_an_enqueue_before_migrate_says_to_run_migrate(db, method):
    with connection.cursor() as cursor:  # undone with the test's transaction
        cursor.execute("ALTER TABLE leasejobs_job RENAME TO leasejobs_job_elsewhere")
    with pytest.raises(ProgrammingError) as refused, transaction.atomic():
        add.enqueue(1, 2) if method == "enqueue" else add.bulk_enqueue([((1, 2), {})])
    assert str(refused.value) == (
        "The leasejobs tables are missing or out of date in the database 'default' (relation "
        f'"leasejobs_job" does not exist): {MIGRATE}'
    )


def test_an_enqueue_after_an_upgrade_without_migrate_says_to_run_migrate(db):
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job RENAME COLUMN max_attempts TO max_attempts_elsewhere")
    with pytest.raises(ProgrammingError) as refused, transaction.atomic():
        add.enqueue(1, 2)
    assert str(refused.value) == (
        "The leasejobs tables are missing or out of date in the database 'default' (column "
        f'"max_attempts" of relation "leasejobs_job" does not exist): {MIGRATE}'
    )


def test_other_database_errors_are_left_as_they_are(db):
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job ADD CONSTRAINT no_sevens CHECK (priority <> 7)")
    with pytest.raises(Exception) as refused, transaction.atomic():
        add.using(priority=7).enqueue(1, 2)
    assert "no_sevens" in str(refused.value) and "migrate" not in str(refused.value)


# -- the same through Django's Tasks framework -----------------------------------------


@needs_django_tasks
def test_django_tasks_outside_what_workers_search_are_refused_in_a_sentence(db):
    from django.tasks.exceptions import InvalidTask

    from tests.unit.test_backend import not_in_a_tasks_module

    with pytest.raises(InvalidTask) as refused:
        not_in_a_tasks_module.enqueue()
    assert str(refused.value) == (
        "Task tests.unit.test_backend.not_in_a_tasks_module is in no module runworker searches for Django "
        "Tasks, so no worker would run it: define it in the tasks module of an installed app or import "
        "it there by name (from tests.unit.test_backend import not_in_a_tasks_module), or add "
        "'tests.unit.test_backend' to LEASEJOBS['TASK_MODULES']."
    )


@needs_django_tasks
def test_django_tasks_arguments_are_bound_like_leasejobs_own(db):
    from tests.testapp import django_tasks as dtasks

    with pytest.raises(TypeError) as refused:
        dtasks.meaning_of_life.enqueue(1)
    assert str(refused.value) == (
        "The arguments do not fit tests.testapp.django_tasks.meaning_of_life(): too many positional "
        "arguments; pass the arguments the function takes."
    )
    with pytest.raises(TypeError) as refused:
        dtasks.flaky.enqueue()  # takes_context=True: the context is not the caller's to give
    assert str(refused.value) == (
        "The arguments do not fit tests.testapp.django_tasks.flaky(fail_times): missing a required "
        "argument: 'fail_times'; pass the arguments the function takes."
    )
    with pytest.raises(TypeError) as refused:
        dtasks.forgot_context.enqueue(42)
    assert str(refused.value) == (
        "The arguments do not fit tests.testapp.django_tasks.forgot_context(context, order_id): missing a "
        "required argument: 'order_id'; its first parameter, context, looks like the job's context, so "
        "declare the task with @task(takes_context=True), which passes the context there."
    )
    assert not Job.objects.exists()


@needs_django_tasks
def test_django_tasks_follow_djangos_json_rule_for_tuples_and_refuse_other_keys(db):
    from tests.testapp import django_tasks as dtasks

    result = dtasks.noop.enqueue((1, 2))  # Django's normalize_json makes it a list, and says so
    assert result.args == [[1, 2]] == Job.objects.get(pk=result.id).args
    with pytest.raises(TypeError) as refused:
        dtasks.noop.enqueue({1: "gold"})
    assert str(refused.value) == (
        "The arguments of tests.testapp.django_tasks.noop hold the dict key 1 (int) at args[0], which "
        'JSON stores as the string "1": use string keys.'
    )


@needs_django_tasks
def test_a_django_task_enqueued_before_migrate_says_to_run_migrate(db):
    from tests.testapp import django_tasks as dtasks

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE leasejobs_job RENAME TO leasejobs_job_elsewhere")
    with (
        pytest.raises(ProgrammingError, match=r"run `python manage.py migrate` first\.$"),
        transaction.atomic(),
    ):
        dtasks.noop.enqueue()
