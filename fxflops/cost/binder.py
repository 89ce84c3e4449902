"""Where a graph's size symbols come from in the real arguments of each call.

Each symbol is read from the first placeholder that carries it bare: a dimension of a
tensor argument (``s72 = input_ids.shape[0]``) or a SymInt argument. Several symbols may
be equal at run time (vLLM: ``input_ids`` and ``positions``); each is bound on its own.
The reader is one small function: O(number of symbols) per call. The same places name
each symbol for the reader of a formula (``symbol_sources``), beside Dynamo's own source.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx

from fxflops.util import meta_value


class UnboundSymbolError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class SymbolSource:
    """Where one size symbol comes from, for the reader of a formula (``s70 =
    input_ids.size(1)``): plain strings, so that it travels with a pickled plan.

    ``source`` is Dynamo's name of the symbol's origin in the compiled function's inputs
    (``L['input_ids'].size()[1]``: the shape environment's first source of it), None where
    the shape environment knows none. ``input`` and ``dim`` are where this graph reads it at
    run time (the binder's place: the placeholder's name, and its dimension or None for an
    int argument): for a piece of a split graph (vLLM's), the piece's own input. ``input``
    None: the symbol is in no input's shape.
    """

    symbol: str
    source: str | None = None
    input: str | None = None
    dim: int | None = None

    @property
    def read_from(self) -> str | None:
        """The graph's own input it is read from (``z.size(0)``); None where that input is
        the symbol itself (an int argument Dynamo names after it, which says nothing)."""
        if self.input is None or (self.dim is None and self.input == self.symbol):
            return None
        return self.input if self.dim is None else f"{self.input}.size({self.dim})"

    @property
    def where(self) -> str:
        """Its origin in the user's names: Dynamo's source if known, else this graph's input."""
        if self.source is not None:
            return user_name(self.source)
        if self.read_from is not None:
            return self.read_from
        return f"the int argument {self.input}" if self.input else "(in no input's shape)"

    def __str__(self) -> str:
        return f"{self.symbol} = {self.where}"


def user_name(source: str) -> str:
    """Dynamo's source name as the user wrote it: ``L['input_ids'].size()[0]`` ->
    ``input_ids.size(0)``, ``L['self']._modules['embed'].n`` -> ``self.embed.n``."""
    name = re.sub(r"^[LG]\[['\"]([^'\"]+)['\"]\]", r"\1", source)
    name = re.sub(r"\._(?:modules|parameters|buffers)\[['\"]([^'\"]+)['\"]\]", r".\1", name)
    return re.sub(r"\.(size|stride)\(\)\[(\d+)\]", r".\1(\2)", name)


def _no_key(args: Sequence[Any]) -> tuple[()]:
    """A static graph's key: every call is of its one size."""
    return ()


class SizeBinder:
    """Reads a call's size key from its arguments.

    ``key(args)`` reads it: with one size symbol that symbol's int (``operator.itemgetter``
    for an int argument, a tensor's ``size(d)`` else), with several a tuple, with none
    ``()``. ``read(args)`` always gives the tuple, in ``symbols`` order.
    """

    def __init__(self, sources: Sequence[tuple[Any, ...]]) -> None:
        # (symbol name, argument index, dimension or None for an int argument), in the
        # symbols' order; a symbol read from what the call returns (a size that comes from
        # tensor data, ``.item()``: unbacked) has a fourth item, ``"out"``, and its index is
        # among the call's outputs, flattened
        self.sources = tuple(sources)
        self.after = any(len(s) > 3 for s in self.sources)
        self.key = _no_key if self.after else self._compile_key()

    def key_after(self, args: Sequence[Any], out: Any) -> Any:
        """(A binder with symbols read from the outputs: ``after``.) The key of a call
        from its arguments and what it returned: every symbol's int, in order."""
        flat = out if isinstance(out, (list, tuple)) else (out,)
        values = []
        for source in self.sources:
            _, i, d = source[:3]
            where = flat if len(source) > 3 else args
            values.append(where[i] if d is None else where[i].size(d))
        return values[0] if len(values) == 1 else tuple(values)

    def _compile_key(self) -> Callable[[Sequence[Any]], Any]:
        sources = [(i, d) for _, i, d in self.sources]
        if not sources:
            return _no_key
        if len(sources) == 1:
            i, d = sources[0]
            if d is None:
                return operator.itemgetter(i)
            return lambda args: args[i].size(d)
        return lambda args: tuple([args[i] if d is None else args[i].size(d)
                                   for i, d in sources])

    def as_tuple(self, key: Any) -> tuple[int, ...]:
        """The tuple form of a key ``key(args)`` returned."""
        return (key,) if len(self.sources) == 1 else tuple(key)

    def read(self, args: Sequence[Any]) -> tuple[int, ...]:
        return self.as_tuple(self.key(args))

    def __reduce__(self) -> Any:
        return (SizeBinder, (self.sources,))

    @classmethod
    def from_graph(cls, gm: torch.fx.GraphModule, symbols: Sequence[sympy.Symbol]) -> SizeBinder:
        found: dict[str, tuple[Any, ...]] = dict(input_places(gm, symbols))
        for name, place in output_places(gm, symbols).items():
            found.setdefault(name, (*place, "out"))
        missing = [str(s) for s in symbols if str(s) not in found]
        if missing:
            raise UnboundSymbolError(f"size symbols {missing} appear in no input's or "
                                     "output's shape")
        # in the order of ``symbols``: a key read at run time lines up with them
        return cls([(str(s), *found[str(s)]) for s in symbols])


def input_places(gm: torch.fx.GraphModule, symbols: Sequence[sympy.Symbol]
                 ) -> dict[str, tuple[int, int | None]]:
    """Where each symbol is read in a call's arguments: by name, the index of the first
    placeholder that carries it bare and its dimension (None: an int argument). A symbol in
    no input's shape is left out."""
    return _places([meta_value(n) for n in _placeholders(gm)], symbols)


def output_places(gm: torch.fx.GraphModule, symbols: Sequence[sympy.Symbol]
                  ) -> dict[str, tuple[int, int | None]]:
    """Where each symbol is read in what a call returns (the graph's outputs, flattened, as
    a compiled graph returns them): its first output that carries it bare, and the
    dimension (None: an int output). A size that comes from tensor data (``.item()``,
    ``nonzero``) is in no input, and in an output wherever the graph returns a tensor of
    that size."""
    output = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if output is None or not output.args:
        return {}
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    return _places([meta_value(n) for n in values], symbols)


def _places(values: Sequence[Any], symbols: Sequence[sympy.Symbol]
            ) -> dict[str, tuple[int, int | None]]:
    """The first of ``values`` (example values) that carries each symbol bare: its index
    and dimension (None: the value is the SymInt itself)."""
    wanted = {str(s) for s in symbols}
    found: dict[str, tuple[int, int | None]] = {}
    for index, val in enumerate(values):
        sizes: list[tuple[int | None, Any]] = [(None, val)] if isinstance(val, torch.SymInt) \
            else list(enumerate(val.shape)) if isinstance(val, torch.Tensor) else []
        for dim, size in sizes:
            if isinstance(size, torch.SymInt):
                name = str(size.node.expr)
                if name in wanted and name not in found:
                    found[name] = (index, dim)
    return found


def symbol_sources(gm: torch.fx.GraphModule, symbols: Sequence[sympy.Symbol],
                   shape_env: Any) -> tuple[SymbolSource, ...]:
    """What each symbol is, in ``symbols`` order: Dynamo's source of it (the shape
    environment's; none without one) and the input this graph reads it from (the binder's
    place, named by the placeholder: a piece of a split graph names its own input)."""
    places = input_places(gm, symbols)
    placeholders = _placeholders(gm)
    named = []
    for s in symbols:
        index, dim = places.get(str(s), (None, None))
        named.append(SymbolSource(str(s), _dynamo_source(shape_env, s),
                                  placeholders[index].name if index is not None else None, dim))
    return tuple(named)


def _dynamo_source(shape_env: Any, symbol: sympy.Symbol) -> str | None:
    """The symbol's first source in the shape environment (``s70`` ->
    ``L['input_ids'].size()[1]``); None without one (a graph traced without Dynamo, a
    piece unpickled with a fresh shape environment)."""
    sources = (getattr(shape_env, "var_to_sources", None) or {}).get(symbol)
    if not sources:
        return None
    name = sources[0].name
    # (a property in torch 2.13, a method in older releases)
    return str(name() if callable(name) else name)


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


_PARAM_NAME = re.compile(r"(_parameters_|_buffers_|^[pb]_)", re.IGNORECASE)


def is_parameter_name(name: str) -> bool:
    """A placeholder Dynamo lifted from a parameter or buffer (by its name)."""
    return _PARAM_NAME.search(name) is not None


def static_size(gm: torch.fx.GraphModule) -> int | str:
    """A static graph's size label: the leading dimension of its first data input
    (parameters and buffers, which Dynamo lifts to inputs too, are skipped by name)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder" or is_parameter_name(str(node.target)):
            continue
        val = meta_value(node)
        if isinstance(val, torch.Tensor) and val.dim() > 0:
            # never int() a SymInt: that would specialise the graph on its example size
            size = val.shape[0]
            return size if isinstance(size, int) else "dynamic"
    return "static"
