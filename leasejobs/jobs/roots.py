"""Which modules a worker imports to find tasks, and whether a task is among what they import.

``runworker`` registers the tasks whose ``@task`` ran while it imported its
discovery roots: the ``tasks`` module of every installed app and the
modules of ``LEASEJOBS["TASK_MODULES"]`` (and whatever they import). A task
defined anywhere else enqueues fine in a web process and then fails in the
worker as ``unknown task``, long after the caller could have seen why. The
registry asks this module at enqueue whether the worker would find a task,
and refuses the enqueue with one sentence when it would not.

A false refusal is worse than a missed one, so three ways count as found:

- the task was registered while a root module's body was running in the
  same thread (``registered_in_root``): the root imports it, directly or
  through other modules, or defines it;
- the root names the task (``from .emails import send``);
- a root's source imports the task's module, directly or through other
  modules whose source we read (``imported_by_roots``): a module imported
  first by a view and then again, as a no-op, by ``tasks.py``.
"""

import ast
import sys
import sysconfig
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import FrameType, ModuleType

from django.apps import apps

from leasejobs import conf


def root_names() -> list[str]:
    """The modules ``runworker`` imports for tasks: each app's ``tasks``, then TASK_MODULES."""
    return [f"{app.name}.tasks" for app in apps.get_app_configs()] + conf.task_modules()


def registered_in_root(roots: Iterable[str], frame: FrameType | None) -> bool:
    """Whether a root module's body runs in this thread's stack, from ``frame`` outwards.

    An import runs the imported module's body as a ``<module>`` frame whose
    globals are the module's: a task registered under one is registered in
    the worker too, since the worker imports that root.
    """
    names = set(roots)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in names:
            return True
        frame = frame.f_back
    return False


def named_by_roots(roots: Iterable[str], value: object) -> bool:
    """Whether a loaded root binds ``value`` (a task) to a name: ``from .emails import send``.

    Only the task counts, not its module: importing ``pkg.tasks.emails``
    binds ``emails`` in ``pkg.tasks`` whoever imported it, so a module found
    there says nothing about what the package imports itself.
    """
    for name in roots:
        loaded = sys.modules.get(name)
        if loaded is not None and any(bound is value for bound in vars(loaded).values()):
            return True
    return False


def imported_by_roots(roots: Iterable[str], module: str) -> bool:
    """Whether the source of a loaded root imports ``module``, directly or through other modules.

    Reads the files of loaded modules only (nothing is imported here), and
    follows a module only if it belongs to the project: outside the standard
    library and site-packages, or in the top-level package of a root or of
    ``module``. Imports anywhere in a file count, also inside functions.
    """
    roots = [name for name in roots if name in sys.modules]
    tops = {name.partition(".")[0] for name in [*roots, module]}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _imports(name)
        if module in found:
            return True
        todo.extend(n for n in found if n not in seen and _followed(n, tops))
    return False


def _followed(name: str, tops: set[str]) -> bool:
    loaded = sys.modules.get(name)
    path = getattr(loaded, "__file__", None)
    if loaded is None or not path:
        return False
    return name.partition(".")[0] in tops or not _in_library(path)


def _in_library(path: str) -> bool:
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(directory) for directory in _library_dirs())


@cache
def _library_dirs() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    return tuple({Path(paths[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _imports(name: str) -> frozenset[str]:
    """The modules the source of loaded module ``name`` imports (each with its parent packages)."""
    loaded: ModuleType | None = sys.modules.get(name)
    path = getattr(loaded, "__file__", None)
    if loaded is None or not path or not path.endswith(".py"):
        return frozenset()
    return _imports_of_file(name, path, getattr(loaded, "__package__", None) or "")


@cache
def _imports_of_file(name: str, path: str, package: str) -> frozenset[str]:
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_with_parents(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is None:
                continue
            found.update(_with_parents(base))
            # ``from pkg import name``: name may be a submodule.
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    found.discard(name)
    return frozenset(found)


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if not level:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    if module:
        base.append(module)
    return ".".join(base) or None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
