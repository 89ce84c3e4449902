"""Formula builders for families of ops that differ only in where their sizes are.

Hundreds of vendor kernels are one of a few computations: a GEMM (``2·M·K·N``), a batched
GEMM, an elementwise or normalising pass, rotary embedding, a fused mixture of experts, an
attention kernel. Each builder here returns a ``named`` formula (``registry``: the op's
arguments by schema name, its return value as ``"out"``) for one layout, so that a table
line says *where* an op's sizes are and the arithmetic is written once:

    "mylib::fp8_gemm": (gemm("q_input", n=dim("weight", 0)), "matmul"),

(an integration's tables are made of these: ``fxflops.integrations.vllm.formulas``).

A size is a :data:`Size`: a callable of the arguments (``dim``, ``numel``, ``arg``,
``const``), so anything a table needs can be said without a new builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fxflops.cost.graph_cost import RuntimeCost
from fxflops.cost.registry import Split, register_formula

Named = dict[str, Any]
Size = Callable[[Named], Any]
Builder = Callable[[Named], Any]


# --- sizes ------------------------------------------------------------------------------


SOFTMAX = 5  # max, subtract, exp, sum, divide: docs/conventions.md's softmax


def tensor(named: Named, name: str) -> Any:
    """The tensor ``name`` ("out" for the return value; the first of a returned tuple)."""
    value = named[name]
    if isinstance(value, (tuple, list)):
        value = value[0]
    return value


def dim(name: str, index: int, scale: int = 1) -> Size:
    """``named[name].shape[index] * scale``."""
    return lambda named: tensor(named, name).shape[index] * scale


OUT_N = dim("out", -1)  # N of a linear that returns its [..., N] output


def numel(name: str) -> Size:
    return lambda named: tensor(named, name).numel()


def rows(name: str) -> Size:
    """Elements over the last dimension: the rows a linear maps (``M``)."""
    return lambda named: tensor(named, name).numel() // tensor(named, name).shape[-1]


def arg(name: str) -> Size:
    """An int (or SymInt) argument."""
    return lambda named: named[name]


def const(value: int) -> Size:
    return lambda named: value


def first(*sizes: Size) -> Size:
    """The first size whose tensor or argument is there (optional arguments)."""

    def pick(named: Named) -> Any:
        for size in sizes:
            try:
                return size(named)
            except (KeyError, AttributeError, TypeError, IndexError):
                continue
        raise KeyError("none of the sizes is there")

    return pick


# --- builders ---------------------------------------------------------------------------


def gemm(a: str, n: Size, k: Size | None = None, m: Size | None = None,
         batch: Size | None = None) -> Builder:
    """``2·M·K·N``: ``M`` the activation's rows, ``K`` its last dimension (unless given:
    packed fp4 activations hold two values a byte), ``N`` from wherever the op keeps it
    (the output's last dimension, a weight's dimension, an int argument); ``batch``
    multiplies (a batched GEMM's batch when ``m`` is given per batch)."""

    def formula(named: Named) -> Any:
        kk = k(named) if k is not None else tensor(named, a).shape[-1]
        mm = m(named) if m is not None else rows(a)(named)
        flops = 2 * mm * kk * n(named)
        return flops * batch(named) if batch is not None else flops

    return formula


def per_element(per: int, of: str) -> Builder:
    """``per`` FLOPs per element of ``of`` (an activation, a norm: vector class)."""
    return lambda named: per * tensor(named, of).numel()


def per_element_split(per_matmul: int, per_vector: int, of: str) -> Builder:
    return lambda named: Split(per_matmul * tensor(named, of).numel(),
                               per_vector * tensor(named, of).numel())


def rope(query: str, key: str | None, rot_dim: Size, head_size: Size) -> Builder:
    """Rotary embedding: 3 FLOPs per rotated element (a pair: 4 multiplies, 2 adds) of
    every head of ``query`` (and ``key``)."""

    def formula(named: Named) -> Any:
        hs = head_size(named)
        heads = tensor(named, query).numel() // hs
        if key is not None and named.get(key) is not None:
            heads = heads + tensor(named, key).numel() // hs
        return 3 * rot_dim(named) * heads

    return formula


def fused_moe(hidden: str, topk: str, inter: Size, gated: bool = True,
              width: Size | None = None) -> Builder:
    """A fused mixture of experts: per routed token, the gate/up projection (``H -> 2I``,
    or ``H -> I`` ungated) and the down projection (``I -> H``) as matmul FLOPs, the
    activation (and gate multiply) and the weighted sum as vector FLOPs."""

    def formula(named: Named) -> Split:
        x = tensor(named, hidden)
        h = width(named) if width is not None else x.shape[-1]
        tokens = x.numel() // h
        k = tensor(named, topk).shape[-1]
        i = inter(named)
        up = 2 * i if gated else i
        routed = tokens * k
        matmul = 2 * routed * h * up + 2 * routed * i * h
        vector = routed * i * (2 if gated else 1) + 2 * routed * h
        return Split(matmul, vector)

    return formula


def attention(query: str, out: str | None = None, key_heads: Size | None = None) -> Builder:
    """An attention kernel (table kind ``"attention"``): FLOPs per (query, key) pair from
    the query's shape ``[T, H, D]`` (QK^T: ``H·D``) and the output's (PV: ``H·D_v``),
    counted per call from the step's KV lengths, as an engine's attention op is (the
    integration that knows the lengths charges it: ``RuntimeCost``).
    KV-cache bytes per context token: K and V of ``key_heads`` heads, when known."""

    def formula(named: Named) -> RuntimeCost:
        q = tensor(named, query)
        heads, d = q.shape[-2], q.shape[-1]
        tokens = q.numel() // (heads * d)
        dv = tensor(named, out).numel() // (tokens * heads) if out is not None else d
        kv = key_heads(named) if key_heads is not None else 0
        return RuntimeCost(2 * heads * d + 2 * heads * dv, kv * (d + dv) * q.element_size())

    return formula


def register(table: dict[str, tuple[Builder, str]]) -> None:
    """Register every ``{op: (builder, kind)}`` of a table as a named formula; kind
    "matmul", "vector", or "attention" (matmul FLOPs counted per call from the KV lengths)."""
    for name, (builder, kind) in table.items():
        runtime = "attention" if kind == "attention" else None
        register_formula([name], kind="vector" if kind == "vector" else "matmul",
                         named=True, runtime=runtime)(builder)


__all__ = ["arg", "attention", "const", "dim", "first", "fused_moe", "gemm", "numel",
           "per_element", "per_element_split", "register", "rope", "rows", "tensor"]
