"""The CPU-clock hot path written as code: the bookkeeping in a function's own lines.

Per call the hot path reads the size key, looks its row up, compares the row's count with
the call its next sample is due at, and counts the call as it returns
(``wrap.hot_function``). Written as a function around the inner, with the key a function
of its own (``SizeBinder.key``), that is two frames a call and a test after the inner's
call; written into the source of the function that calls the inner (``bookkept``) it is
about twenty bytecodes in one: the key an expression over the arguments by name
(``SizeBinder.expression``), one dict lookup, one int comparison, the count. The inner's
lines are written twice, untimed and timed, so that an untimed call tests nothing after
them. A sampled call (one in ``FXFLOPS_SAMPLE_EVERY`` past a size's first calls) reads
the clock around the inner's lines and hands the sample to ``hot_function``'s ``note``,
and a call its rows do not serve goes to its ``miss``, which routes it as any path does.

Two kinds of function are written so, one template for both:

- ``wrapper``: a function that calls the inner as its calling convention asks (boxed, its
  arguments unpacked, or AOTAutograd's forward taken apart);
- ``inline_forward``: with an eager inner, a copy of the graph module's generated
  ``forward`` itself, so that a call runs the graph's lines in one frame, as the bare
  backend's does. The copy is made from the module's generated source
  (``GraphModule.code``) with ``ast``, and only where that source has the shape FX gives
  a Dynamo graph: one ``forward(self, ...)`` of positional arguments, one ``return``, at
  its end, and no name of fxflops' own in it; anything else is left to a ``wrapper``
  (``inline_forward`` returns None).

Each is compiled under a file name of its own (``<fxflops NAME #N>``), its source in
``linecache`` for tracebacks through it while it lives.
"""

from __future__ import annotations

import ast
import itertools
import linecache
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

# fxflops' names in the written code: FX names a graph's values after its nodes, never so
_PREFIX = "_fxflops_"
_COPIES = itertools.count()

# The function's body, its lines (``_fxflops_lines``: the graph's, or none) written twice:
# once for the calls the clock skips, the path nearly every call takes (the lookup, one
# int comparison, the count as it returns, under the row's lock: calls from several
# threads at one size all count; a call that raises is not counted, as on every path), and
# once timed, the sample handed to ``note`` (which counts the call and says when the next
# sample is due). Two copies of the lines, so that the untimed path tests nothing after
# them.
_BODY = """\
try:
    _fxflops_row = _fxflops_rows[{key}]
except Exception as _fxflops_error:
    return _fxflops_miss(_fxflops_error, ({args}))
if _fxflops_row.count < _fxflops_row.due:
    _fxflops_lines
    _fxflops_out = {value}
    with _fxflops_row.lock:
        _fxflops_row.count += 1
    return _fxflops_out
_fxflops_t0 = _fxflops_now()
_fxflops_lines
_fxflops_out = {value}
_fxflops_note(_fxflops_row, _fxflops_now() - _fxflops_t0)
return _fxflops_out
"""
_LINES = f"{_PREFIX}lines"


def _written(statements: list[ast.stmt], copies: Iterator[list[ast.stmt]]) -> list[ast.stmt]:
    """``statements`` with each ``_fxflops_lines`` marker (at the top, or in an ``if``'s
    body, as the template has them; in order) replaced by the next of ``copies``."""
    out: list[ast.stmt] = []
    for statement in statements:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Name) \
                and statement.value.id == _LINES:
            out.extend(next(copies))
            continue
        if isinstance(statement, ast.If):
            statement.body = _written(statement.body, copies)
        out.append(statement)
    return out


class Bookkeeping(NamedTuple):
    """What the written code calls: ``rows``, the rows its key looks up (rebound through
    the function's globals, ``bookkept``'s rebinder); ``now``, the clock a sampled call is
    timed on; ``note(row, ns)``, noting a sample (it counts the call);
    ``miss(error, args)``, a call whose key is not in ``rows`` or could
    not be read."""
    rows: dict[Any, Any]
    now: Callable[[], int]
    note: Callable[[Any, int], None]
    miss: Callable[[BaseException, Any], Any]


# the size key's expression over the arguments (``SizeBinder.expression``), given how the
# ``i``-th argument is named
KeyExpression = Callable[[Callable[[int], str]], str]


def bookkept(function: ast.FunctionDef, name: str, key: str, args: str, books: Bookkeeping,
             namespace: dict[str, Any]) -> tuple[Callable[..., Any],
                                                 Callable[[dict[Any, Any]], None]]:
    """``function`` (its last statement its one ``return``) with the bookkeeping written
    in, compiled in ``namespace`` (the names its own lines read; the bookkeeping's are
    added) and named ``name``; and its rows' rebinder. ``key``: the size key's
    expression over its arguments; ``args``: theirs, as ``miss`` is handed them."""
    returned = function.body[-1]
    value = returned.value if isinstance(returned, ast.Return) else None
    body = ast.parse(_BODY.format(key=key, args=args,
                                  value=ast.unparse(value) if value else "None")).body
    lines = function.body[:-1]
    # the same nodes in both places: the tree is only unparsed, never compiled
    function.body = _written(body, iter((lines, lines)))
    tree = ast.Module(body=[function], type_ignores=[])
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    filename = f"<fxflops {name} #{next(_COPIES)}>"
    namespace.update({f"{_PREFIX}{part}": obj for part, obj in books._asdict().items()})
    exec(compile(source, filename, "exec"), namespace)
    # the source, for tracebacks through it (kept: an entry without a file's mtime is),
    # for as long as the function lives (a process that compiles again and again)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    made = namespace[function.name]
    made.__name__ = made.__qualname__ = name
    weakref.finalize(made, linecache.cache.pop, filename, None)

    def rebind(new_rows: dict[Any, Any]) -> None:
        namespace[f"{_PREFIX}rows"] = new_rows

    return made, rebind


# a function that calls the inner as its calling convention asks: its list (boxed), its
# arguments unpacked, or AOTAutograd's boxed compiled function with the parameters first
_WRAPPERS = {
    "boxed": "def call(args):\n    return _fxflops_run(args)\n",
    "unpacked": "def call(*args):\n    return _fxflops_run(*args)\n",
    "aot": "def call(*args):\n    return _fxflops_run([*_fxflops_params, *args])\n",
}


def wrapper(run: Callable[..., Any], name: str, key: KeyExpression, books: Bookkeeping, *,
            boxed: bool = False, params: Sequence[Any] | None = None
            ) -> tuple[Callable[..., Any], Callable[[dict[Any, Any]], None]]:
    """A function that calls ``run`` with the bookkeeping written in, and its rows'
    rebinder: ``call(args)`` calling ``run(args)`` where ``boxed`` (AOTAutograd's boxed
    convention: one list), ``call(*args)`` calling ``run([*params, *args])`` where
    ``params`` are given (AOTAutograd's forward taken apart, ``torch_compat``), else
    ``call(*args)`` calling ``run(*args)``. ``key``: the size key's expression
    (``SizeBinder.expression``)."""
    kind = "boxed" if boxed else "unpacked" if params is None else "aot"
    (function,) = ast.parse(_WRAPPERS[kind]).body
    assert isinstance(function, ast.FunctionDef)
    return bookkept(function, name, key(lambda i: f"args[{i}]"), "args", books,
                    {f"{_PREFIX}run": run, f"{_PREFIX}params": params})


def inline_forward(run: Any, name: str, key: KeyExpression, books: Bookkeeping
                   ) -> tuple[Callable[..., Any], Callable[[dict[Any, Any]], None]] | None:
    """``run`` (a ``GraphModule``'s generated ``forward``, bound) with the bookkeeping in it,
    bound to the same module, and its rows' rebinder; None where ``run`` is not such a
    ``forward`` or its source has another shape. ``key``: the size key's expression
    (``SizeBinder.expression``)."""
    module = getattr(run, "__self__", None)
    function = getattr(run, "__func__", None)
    if not isinstance(module, torch.fx.GraphModule) or function is None \
            or vars(type(module)).get("forward") is not function:
        return None
    try:
        tree = ast.parse(module.code)
    except (SyntaxError, AttributeError, TypeError):
        return None
    forward = _forward_of(tree)
    if forward is None:
        return None
    params = [a.arg for a in forward.args.args[1:]]
    args = ", ".join(params) + ("," if len(params) == 1 else "")
    try:  # FX's names for the graph's code, and ours
        made, rebind = bookkept(forward, name, key(params.__getitem__), args, books,
                                dict(function.__globals__))
    # a key over arguments this forward does not take, lines that cannot be written twice
    except (IndexError, SyntaxError, ValueError, RecursionError):
        return None
    return types.MethodType(made, module), rebind


def _forward_of(tree: ast.Module) -> ast.FunctionDef | None:
    """The module's one ``forward(self, ...)`` where FX's shape holds: positional
    arguments only, no default, one ``return`` (its last statement, not inside anything
    else), no nested function or class, no ``global`` or ``nonlocal``, and no name of
    fxflops' own."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    forward = tree.body[0]
    a = forward.args
    if forward.name != "forward" or forward.decorator_list or a.posonlyargs or a.vararg \
            or a.kwonlyargs or a.kwarg or a.defaults or not a.args or a.args[0].arg != "self":
        return None
    if not forward.body or not isinstance(forward.body[-1], ast.Return):
        return None
    for node in ast.walk(forward):
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Await)) \
                and node is not forward.body[-1]:
            return None
        if node is not forward and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(node, (ast.Global, ast.Nonlocal)):  # not writable twice in one body
            return None
        name = node.id if isinstance(node, ast.Name) else \
            node.arg if isinstance(node, ast.arg) else None
        if name is not None and name.startswith(_PREFIX):
            return None
    return forward
