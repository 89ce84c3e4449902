"""Where a graph's size symbols come from in the real arguments of each call.

Each symbol is read from the first placeholder that carries it bare: a dimension of a
tensor argument (``s72 = input_ids.shape[0]``) or a SymInt argument. Several symbols may
be equal at run time (vLLM: ``input_ids`` and ``positions``); each is bound on its own.
The reader is one small function: O(number of symbols) per call.
"""

from __future__ import annotations

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


def _no_key(args: Sequence[Any]) -> tuple[()]:
    """A static graph's key: every call is of its one size."""
    return ()


class SizeBinder:
    """Reads a call's size key from its arguments.

    ``key(args)`` reads it: with one size symbol that symbol's int (``operator.itemgetter``
    for an int argument, a tensor's ``size(d)`` else), with several a tuple, with none
    ``()``. ``read(args)`` always gives the tuple, in ``symbols`` order.
    """

    def __init__(self, sources: Sequence[tuple[str, int, int | None]]) -> None:
        # (symbol name, argument index, dimension or None for an int argument)
        self.sources = tuple(sources)
        self.key = self._compile_key()

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
        wanted = {str(s): s for s in symbols}
        found: dict[str, tuple[str, int, int | None]] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for index, node in enumerate(placeholders):
            val = meta_value(node)
            if isinstance(val, torch.SymInt):
                name = str(val.node.expr)
                if name in wanted and name not in found:
                    found[name] = (name, index, None)
            elif isinstance(val, torch.Tensor):
                for dim, size in enumerate(val.shape):
                    if isinstance(size, torch.SymInt):
                        name = str(size.node.expr)
                        if name in wanted and name not in found:
                            found[name] = (name, index, dim)
        missing = [n for n in wanted if n not in found]
        if missing:
            raise UnboundSymbolError(f"size symbols {missing} appear in no input's shape")
        # in the order of ``symbols``: a key read at run time lines up with them
        return cls([found[str(s)] for s in symbols])


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
