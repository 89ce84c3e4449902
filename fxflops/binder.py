"""Where a graph's size symbols come from in the real arguments of each call.

Each symbol is read from the first placeholder that carries it bare: a dimension of a
tensor argument (``s72 = input_ids.shape[0]``) or a SymInt argument. Several symbols may
be equal at run time (vLLM: ``input_ids`` and ``positions``); each is bound on its own.
The reader is one generated tuple expression: O(number of symbols) per call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx


class UnboundSymbolError(ValueError):
    pass


class SizeBinder:
    def __init__(self, sources: Sequence[tuple[str, int, int | None]]) -> None:
        # (symbol name, argument index, dimension or None for an int argument)
        self.sources = tuple(sources)
        self.read = self._compile()

    def _compile(self) -> Any:
        terms = [f"args[{i}]" if d is None else f"args[{i}].shape[{d}]"
                 for _, i, d in self.sources]
        src = f"lambda args: ({', '.join(terms)}{',' if terms else ''})"
        return eval(src)  # a fixed tuple expression, built from ints only

    def __reduce__(self) -> Any:
        return (SizeBinder, (self.sources,))

    @classmethod
    def from_graph(cls, gm: torch.fx.GraphModule, symbols: Sequence[sympy.Symbol]) -> SizeBinder:
        wanted = {str(s): s for s in symbols}
        found: dict[str, tuple[str, int, int | None]] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for index, node in enumerate(placeholders):
            val = node.meta.get("val", node.meta.get("example_value"))
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


def static_size(gm: torch.fx.GraphModule) -> int | str:
    """A static graph's size label: the leading dimension of its first data input
    (parameters and buffers, which Dynamo lifts to inputs too, are skipped by name)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder" or _PARAM_NAME.search(str(node.target)):
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor) and val.dim() > 0:
            # never int() a SymInt: that would specialise the graph on its example size
            size = val.shape[0]
            return size if isinstance(size, int) else "dynamic"
    return "static"
