"""An eager graph's ``forward`` with the CPU-clock bookkeeping written into it.

With an eager inner (``inner="eager"``), what Dynamo would call is the graph module's own
generated ``forward``: plain Python, the graph's ops one per line. A wrapping function
around it costs a frame, the arguments packed and unpacked, and a key function's call on
every call, on top of the bookkeeping itself. Here the bookkeeping is put at the top of a
copy of that ``forward`` instead, as FX generates code: the size key read from the
arguments by name, one dict lookup, the sampling mask tested, and the count as the call
returns; a sampled call (one in ``FXFLOPS_SAMPLE_EVERY`` past a size's first calls) reads
the clock around the graph's lines and hands the sample to ``wrap.hot_function``'s
``note``, and a call its rows do not serve goes to its ``miss``, which routes it as any
path does. So a call runs the graph's lines in one frame, as the bare backend's does,
plus a dozen bytecodes (and the clock, when sampled).

The copy is made from the module's generated source (``GraphModule.code``) with ``ast``,
and only where that source has the shape FX gives a Dynamo graph: one ``forward(self,
...)`` of positional arguments, one ``return``, at its end, and no name of fxflops' own in
it; anything else is left to the wrapping function (``inline_forward`` returns None).
"""

from __future__ import annotations

import ast
import itertools
import linecache
import types
from collections.abc import Callable
from typing import Any

import torch

# fxflops' names in the copy: FX names a graph's values after its nodes, never so
_PREFIX = "_fxflops_"
_COPIES = itertools.count()

_PROLOGUE = """\
try:
    _fxflops_row = _fxflops_rows[{key}]
except Exception as _fxflops_error:
    return _fxflops_miss(_fxflops_error, ({args}))
_fxflops_n = _fxflops_row.count
if _fxflops_n & _fxflops_row.sample_mask:
    _fxflops_t0 = None
else:
    _fxflops_t0 = _fxflops_now()
"""
# the count as the call returns (a call that raises is not counted, as on every path), by
# ``note`` for a sampled call
_EPILOGUE = """\
_fxflops_out = {value}
if _fxflops_t0 is None:
    _fxflops_row.count = _fxflops_n + 1
else:
    _fxflops_note(_fxflops_row, _fxflops_n, _fxflops_now() - _fxflops_t0)
return _fxflops_out
"""


def inline_forward(run: Any, name: str, key: Callable[[Callable[[int], str]], str],
                   rows: dict[Any, Any], now: Callable[[], int],
                   note: Callable[[Any, int, int], None],
                   miss: Callable[[BaseException, tuple[Any, ...]], Any]
                   ) -> tuple[Callable[..., Any], Callable[[dict[Any, Any]], None]] | None:
    """``run`` (a ``GraphModule``'s generated ``forward``, bound) with the bookkeeping in it,
    bound to the same module, and its rows' rebinder; None where ``run`` is not such a
    ``forward`` or its source has another shape.

    ``key(argument)``: the size key as an expression over the arguments
    (``SizeBinder.expression``); ``rows``: the rows the key looks up; ``now``: the clock a
    sampled call is timed on, ``note(row, n, ns)`` noting it (the ``n``-th call of its
    size; it counts the call); ``miss(error, args)``: a call whose key is not in ``rows``
    (or could not be read)."""
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
    try:
        prologue = ast.parse(_PROLOGUE.format(key=key(params.__getitem__), args=args)).body
    except (IndexError, SyntaxError):  # a key over arguments this forward does not take
        return None
    returned = forward.body[-1]
    value = returned.value if isinstance(returned, ast.Return) else None
    epilogue = ast.parse(_EPILOGUE.format(value=ast.unparse(value) if value else "None")).body
    forward.body = [*prologue, *forward.body[:-1], *epilogue]
    source = ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    filename = f"<fxflops {name} #{next(_COPIES)}>"
    namespace = dict(function.__globals__)  # FX's names for the graph's code, and ours
    namespace.update({f"{_PREFIX}rows": rows, f"{_PREFIX}now": now,
                      f"{_PREFIX}note": note, f"{_PREFIX}miss": miss})
    exec(compile(source, filename, "exec"), namespace)
    # the source, for tracebacks through it (kept: an entry without a file's mtime is)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    made = namespace["forward"]
    made.__name__ = made.__qualname__ = name

    def rebind(new_rows: dict[Any, Any]) -> None:
        namespace[f"{_PREFIX}rows"] = new_rows

    return types.MethodType(made, module), rebind


def _forward_of(tree: ast.Module) -> ast.FunctionDef | None:
    """The module's one ``forward(self, ...)`` where FX's shape holds: positional
    arguments only, no default, one ``return`` (its last statement, not inside anything
    else), no nested function or class, and no name of fxflops' own."""
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
        name = node.id if isinstance(node, ast.Name) else \
            node.arg if isinstance(node, ast.arg) else None
        if name is not None and name.startswith(_PREFIX):
            return None
    return forward
