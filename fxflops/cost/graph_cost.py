"""What a graph costs: per-node costs, totals as ints or sympy expressions, roll-ups.

Plain data, picklable, with no reference to the FX graph it came from, so it travels with a
serialised compiled artifact.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import sympy

if TYPE_CHECKING:
    from fxflops.cost.binder import SizeBinder, SymbolSource

Count = Union[int, sympy.Expr]  # noqa: UP007 (a runtime alias; 3.10 lacks | on it)


def to_count(value: Any) -> Count:
    """An int, SymInt, SymFloat or sympy value as an ``int`` or an integer sympy expression."""
    if isinstance(value, int):
        return value
    node = getattr(value, "node", None)
    expr = node.expr if node is not None else sympy.sympify(value)
    if expr.is_number:
        return int(expr)
    return expr


def total(values: list[Count]) -> Count:
    """Sum many counts; ints are summed apart so sympy only sees the symbolic terms."""
    ints = 0
    exprs: list[sympy.Expr] = []
    for v in values:
        if isinstance(v, int):
            ints += v
        else:
            exprs.append(v)
    if not exprs:
        return ints
    expr = sympy.expand(sympy.Add(*exprs, ints))
    return int(expr) if expr.is_number else expr


def evaluate(count: Count, binding: Mapping[sympy.Symbol, int]) -> int:
    if isinstance(count, int):
        return count
    return int(count.xreplace({s: sympy.Integer(v) for s, v in binding.items()}))


@dataclasses.dataclass
class NodeCost:
    """The cost of one FX node (also stored as ``node.meta["fxflops"]``)."""

    name: str
    op: str
    flops: Count = 0
    matmul_flops: Count = 0
    bytes: Count = 0
    module: str = ""
    # ops the node ran that no formula covers (their FLOPs count as 0)
    uncounted: tuple[str, ...] = ()
    # "attention": FLOPs depend on run-time KV lengths; ``runtime_coeff`` is FLOPs per
    # (query, key) pair, which an integration multiplies by the pairs of each call, and
    # ``runtime_bytes`` the KV-cache bytes read per context token; ``runtime_layer`` names
    # the layer (its sliding window, if any, is looked up at run time)
    runtime: str | None = None
    runtime_coeff: Count = 0
    runtime_bytes: Count = 0
    runtime_layer: str | None = None
    # free text: why the node could not be analysed, if it could not
    error: str | None = None
    # dtype of the first tensor input of a matmul node ("torch.bfloat16"): MFU's peak
    dtype: str | None = None
    # added to the graph's bytes_io for this node (see registry.IO_BYTES), and the bytes of
    # graph inputs it reads only in part: (input node's name, bytes not read)
    io_bytes: Count = 0
    unread: tuple[tuple[str, Count], ...] = ()
    # a forward node a backward graph runs again (activation checkpointing, or the
    # partitioner recomputing cheap ops): hardware FLOPs, not model FLOPs
    recomputed: bool = False
    # counted from its layer's sizes (fxflops.cost.layer_check): why, and the ops no
    # formula counted
    estimated: str | None = None
    estimated_ops: tuple[str, ...] = ()
    # what its count is where it is not every call's exact work (a higher-order op's loop
    # counted one iteration, a cond's larger branch: fxflops.cost.higher_order)
    note: str | None = None

    @property
    def vector_flops(self) -> Count:
        return total([self.flops, -1 * self.matmul_flops])


@dataclasses.dataclass
class EstimatedLayer:
    """A layer counted from its sizes: the matmul FLOPs its nodes were counted fell short
    of what its sizes imply (``fxflops.cost.layer_check``)."""

    layer: str  # module path
    type_name: str
    kind: str  # "linear", "moe" or "attention"
    ops: tuple[str, ...]  # the ops no formula counted (right)
    flops: Count  # matmul FLOPs added (attention: 0 here, counted at run time)


class RuntimeCost(NamedTuple):
    """What a run-time-costed op (attention) returns from its formula instead of FLOPs."""

    flops_per_pair: Any
    bytes_per_context_token: Any = 0
    layer: str | None = None
    # FLOPs the shapes do tell (MLA's up-projection of the latent KV, per token)
    static_flops: Any = 0


class CostAt(NamedTuple):
    """A graph's cost at one binding of its size symbols: plain ints."""

    flops: int
    matmul_flops: int
    bytes_io: int
    bytes_nodes: int
    # of ``flops`` and ``matmul_flops``: what the graph recomputes (see NodeCost.recomputed)
    recomputed_flops: int = 0
    recomputed_matmul_flops: int = 0
    # of ``matmul_flops``: counted from layers' sizes (see GraphCost.estimated)
    estimated_flops: int = 0

    @property
    def vector_flops(self) -> int:
        return self.flops - self.matmul_flops


@dataclasses.dataclass
class Rollup:
    flops: Count = 0
    matmul_flops: Count = 0
    bytes: Count = 0
    count: int = 0


@dataclasses.dataclass
class GraphCost:
    """Totals and per-node costs of one graph.

    ``flops``, ``matmul_flops``, ``bytes_io`` (graph inputs + outputs: what a perfectly fused
    graph must move) and ``bytes_nodes`` (every node's inputs + outputs: the unfused upper
    bound) are ints for static graphs and sympy expressions of ``symbols`` for dynamic ones.
    ``recomputed_flops`` and ``recomputed_matmul_flops`` are the part of ``flops`` and
    ``matmul_flops`` a backward graph recomputes: hardware FLOPs, not model FLOPs.
    """

    flops: Count
    matmul_flops: Count
    bytes_io: Count
    bytes_nodes: Count
    symbols: tuple[sympy.Symbol, ...]
    nodes: list[NodeCost]
    uncounted: dict[str, int]
    num_nodes: int = 0
    # where each symbol is read from the graph's arguments (None: some symbol is in no
    # input's shape, so the graph cannot be bound from its arguments)
    binder: SizeBinder | None = None
    recomputed_flops: Count = 0
    recomputed_matmul_flops: Count = 0
    # layers checked against their own sizes, and those counted from them
    # (fxflops.cost.layer_check)
    layers_checked: int = 0
    estimated: list[EstimatedLayer] = dataclasses.field(default_factory=list)
    # what each symbol is, in ``symbols`` order (a plan pickled before it: none, the class
    # default)
    symbol_sources: tuple[SymbolSource, ...] = ()

    @property
    def vector_flops(self) -> Count:
        return total([self.flops, -1 * self.matmul_flops])

    @property
    def matmul_dtype(self) -> str | None:
        """The dtype most matmul FLOPs ran in (the peak MFU is measured against)."""
        by_dtype: dict[str, float] = {}
        for n in self.nodes:
            if n.dtype and n.matmul_flops != 0:
                by_dtype[n.dtype] = by_dtype.get(n.dtype, 0) + _sort_key(n.matmul_flops)
        return max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None

    def fingerprint(self) -> str:
        """A short hash of the graph's structure and FLOPs: the same model's graph gets the
        same one in another run (size symbols are named by position, not by Dynamo)."""
        import hashlib

        canon = {s: sympy.Symbol(f"_s{i}") for i, s in enumerate(self.symbols)}

        def text(c: Count) -> str:
            return str(c if isinstance(c, int) else c.xreplace(canon))

        ops = sorted((op, r.count) for op, r in self.by_op().items())
        key = repr((self.num_nodes, len(self.symbols), text(self.flops),
                    text(self.matmul_flops), ops))
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    @property
    def runtime_nodes(self) -> list[NodeCost]:
        return [n for n in self.nodes if n.runtime]

    def binding(self, sizes: int | Mapping[Any, int]) -> dict[sympy.Symbol, int]:
        """``n`` binds every symbol to n; a mapping binds them one by one (by symbol or name)."""
        if isinstance(sizes, Mapping):
            by_name = {str(k): int(v) for k, v in sizes.items()}
            missing = [s for s in self.symbols if str(s) not in by_name]
            if missing:
                raise KeyError(f"no size given for {', '.join(map(str, missing))}")
            return {s: by_name[str(s)] for s in self.symbols}
        return {s: int(sizes) for s in self.symbols}

    @property
    def estimated_flops(self) -> Count:
        """Matmul FLOPs counted from layers' sizes rather than by their ops' formulas."""
        return total([e.flops for e in self.estimated])

    def totals(self) -> tuple[Count, ...]:
        """The fields of a CostAt, in its order, unbound."""
        return (self.flops, self.matmul_flops, self.bytes_io, self.bytes_nodes,
                self.recomputed_flops, self.recomputed_matmul_flops, self.estimated_flops)

    def at(self, sizes: int | Mapping[Any, int] = 0, *,
           args: Sequence[Any] | None = None) -> CostAt:
        """The cost with the size symbols bound: plain ints.

        ``sizes``: one int for every symbol, or a mapping by symbol or name; or ``args``:
        the graph's real arguments, from which each symbol is read as a call would.
        """
        if args is not None:
            if self.binder is None:
                raise ValueError("this graph's size symbols cannot be read from its arguments")
            sizes = dict(zip(self.symbols, self.binder.read(args)))
        b = self.binding(sizes) if self.symbols else {}
        return CostAt(*(evaluate(c, b) for c in self.totals()))

    def by_op(self) -> dict[str, Rollup]:
        return self._rollup(lambda n: n.op)

    def by_module(self, depth: int | None = None) -> dict[str, Rollup]:
        """Roll-up by owning module (qualified name), cut to ``depth`` components if given."""

        def key(n: NodeCost) -> str:
            if not n.module:
                return "<top>"
            return n.module if depth is None else ".".join(n.module.split(".")[:depth])

        return self._rollup(key)

    def _rollup(self, key: Any) -> dict[str, Rollup]:
        groups: dict[str, list[NodeCost]] = {}
        for n in self.nodes:
            if n.flops == 0 and n.bytes == 0 and not n.runtime:
                continue
            groups.setdefault(key(n), []).append(n)
        out = {
            k: Rollup(total([n.flops for n in ns]), total([n.matmul_flops for n in ns]),
                      total([n.bytes for n in ns]), len(ns))
            for k, ns in groups.items()
        }
        return dict(sorted(out.items(), key=lambda kv: _sort_key(kv[1].flops), reverse=True))


def _sort_key(count: Count) -> float:
    if isinstance(count, int):
        return float(count)
    # order symbolic totals by their value at a middling size
    return float(count.xreplace({s: 64 for s in count.free_symbols}))


_INDEX = re.compile(r"\[(\d+)\]")
_KEY = re.compile(r"\[['\"]([^'\"]+)['\"]\]")


def clean_module_path(path: str) -> str:
    """``L['self'].layers[0]._modules['mlp']`` -> ``layers.0.mlp``."""
    path = re.sub(r"^L\[['\"][^'\"]+['\"]\]", "", path)
    path = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", path)
    path = _INDEX.sub(r".\1", path)
    path = _KEY.sub(r".\1", path)
    path = re.sub(r"^(self\.|L__self___)", "", path.lstrip("."))
    return path.strip(".")
