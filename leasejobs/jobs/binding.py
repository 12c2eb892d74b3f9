"""Whether a job's arguments fit its function, checked where the job is enqueued.

Arguments that do not bind (``add.enqueue(1)`` for ``add(a, b)``, an
unknown keyword) would fail in the worker with a ``TypeError`` on every
attempt, with backoff, long after the caller could have seen the mistake.
``Task.enqueue``, ``bulk_enqueue`` and the Django Tasks backend bind them
here first, by Python's own rules (``inspect.Signature.bind``), with the job
context taking the first parameter of a ``takes_context`` task. A first
parameter named like a context on a task without ``takes_context=True`` is
the likely mistake, so the error says so.

Binding is on the path of every enqueue, thousands of times per bulk
enqueue: whether arguments bind depends only on how many are positional and
which keywords are given (their shape), so each shape that bound once is
remembered and later calls of that shape cost a set lookup.
"""

import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

#: First parameter names that mean "the job's context" when ``takes_context`` is missing.
CONTEXT_NAMES = frozenset({"ctx", "context", "job_context", "task_context"})

#: Shapes remembered per function, at most (a caller inventing keywords cannot grow it for ever).
MAX_SHAPES = 256

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class Binder:
    """The parameters a job's arguments must fit: the function's, less the context's."""

    def __init__(self, func: Callable[..., Any], takes_context: bool) -> None:
        try:
            signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):  # a callable without a signature Python can read
            signature = None
        self.context_hint = ""
        self.good: set[int | tuple[Any, ...]] = set()
        if signature is None:
            self.signature = None
            return
        params = list(signature.parameters.values())
        if takes_context:
            if not params or (
                params[0].kind not in _POSITIONAL and params[0].kind != params[0].VAR_POSITIONAL
            ):
                raise ValueError(
                    f"{func.__module__}.{func.__qualname__} is declared with takes_context=True but has no "
                    "first positional parameter for the job's context: add one (ctx) or drop takes_context."
                )
            if params[0].kind != params[0].VAR_POSITIONAL:  # *args takes the context and the rest
                params = params[1:]
        elif params and params[0].kind in _POSITIONAL and params[0].name in CONTEXT_NAMES:
            self.context_hint = params[0].name
        self.signature = signature.replace(parameters=params)

    def fits(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """None if the arguments bind, else Python's reason why not."""
        shape = (len(args), *kwargs) if kwargs else len(args)
        if shape in self.good or self.signature is None:
            return None
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            return str(exc)
        if len(self.good) < MAX_SHAPES:
            self.good.add(shape)
        return None


@cache
def binder(func: Callable[..., Any], takes_context: bool) -> Binder:
    """The ``Binder`` of a task's function (one per function: signatures are slow to read)."""
    return Binder(func, takes_context)


def check(
    task_name: str,
    func: Callable[..., Any],
    takes_context: bool,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    call: int | None = None,
) -> None:
    """Raise a one-sentence ``TypeError`` unless ``args`` and ``kwargs`` bind to ``func``.

    ``call``: the position of the call in a bulk enqueue, named in the error.
    """
    found = binder(func, takes_context)
    reason = found.fits(args, kwargs)
    if reason is None:
        return
    which = "The arguments" if call is None else f"The arguments of call {call} (counting from 0)"
    head = f"{which} do not fit {task_name}{found.signature}: {reason}"
    if found.context_hint:
        raise TypeError(
            f"{head}; its first parameter, {found.context_hint}, looks like the job's context, "
            "so declare the task with @task(takes_context=True), which passes the context there."
        )
    raise TypeError(f"{head}; pass the arguments the function takes.")
