"""Which kernel Inductor generated for each FX node, and what each kernel costs.

**The map.** Inductor's provenance tracking (``torch._inductor.config.trace.
provenance_tracking_level = 1``) keeps, for each graph it compiles, which post-grad aten
nodes every generated kernel or extern call computes (``cppCodeToPost`` on CPU, its Triton
counterpart on a GPU) and which pre-grad nodes each post-grad node came from
(``postToPre``). Inductor emits that mapping as a structured-trace artifact
(``inductor_provenance_tracking_node_mappings``) on a fresh compile and again on an FX-graph
cache hit (it is kept in the cached ``CompiledFxGraph``), for ``compile_fx`` and vLLM's
``standalone_compile`` alike: :func:`capture` collects it while one graph compiles. The
costs computed from it travel in the graph's plan, so an AOT-loaded artifact has them too.

**Whose nodes.** A graph fxflops analysed before Inductor saw it (the backend's Dynamo
graph, a vLLM piece) is the mapping's pre-grad graph: ``postToPre`` names its nodes. An
AOTAutograd forward or backward graph (training) is the graph the post-grad passes rewrite
in place: a post-grad node keeps its name where the passes left it.

**Per-kernel cost** (:func:`kernel_costs`), exact at every size:

- FLOPs and matmul FLOPs: each node's go to the kernels that compute it. A node Inductor
  split over several kernels (a norm's reduction and its pointwise part, on a GPU) shares
  its FLOPs between them **in proportion to the number of its computing aten nodes each
  kernel holds** (views and reshapes, which Inductor folds into whichever kernel reads
  them, hold none: a linear's matmul FLOPs stay with its GEMM). A node no kernel claims
  (a post-grad pass replaced its aten node, and the provenance with it) goes to the kernel
  of its nearest consumer, else producer, that has one. Nodes in no kernel (views, what Inductor folded away) are in ``<none>``. At a
  size, every kernel's share is rounded down and the remainder goes to the largest
  fractions, so that the kernels' FLOPs add up to the row's exactly.
- Bytes: what crosses the kernel's boundary, the fused traffic: each tensor it reads from
  outside (once per kernel), and each tensor it computes that another kernel reads or the
  graph returns. A node split over kernels: each of them reads its inputs; the last one
  writes its output (what passes between its parts is Inductor's own buffer, not counted).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import sympy

from fxflops.cost.graph_cost import Count, GraphCost, evaluate, to_count, total

log = logging.getLogger(__name__)

ARTIFACT = "inductor_provenance_tracking_node_mappings"
POST_GRAD = "inductor_post_grad_graph"  # the post-grad graph as text: each node's op
# a post-grad node's line: ``mm: "f32[s0, 8]..." = torch.ops.aten.mm.default(view, permute)``
_POST_LINE = re.compile(r'^\s+(\w+)(?::\s*"[^"]*")?\s*=\s*torch\.ops\.([\w.]+)\(', re.M)
NONE = "<none>"  # the nodes of no kernel
_HANDLE = re.compile(r":\d+$")
# a C++ kernel's profiler event under ``cpp.enable_kernel_profile``: graph_<id>_<kernel>
CPP_EVENT = re.compile(r"^graph_\d+_(.+)$")


# --- the map, captured while a graph compiles ------------------------------------------


# --- per-kernel cost -----------------------------------------------------------------


@dataclasses.dataclass
class KernelCost:
    """One generated kernel (or extern call) of a graph, and what it costs (symbolic)."""

    # Inductor's kernel name ("cpp_fused_add_mul_relu_0"); an extern call's with its debug
    # handle, as Inductor's provenance names it ("extern_kernels.mm:1")
    name: str
    order: int  # Inductor's debug handle: the order kernels were generated (and run) in
    nodes: tuple[str, ...]  # the graph's nodes it computes (all or part of)
    flops: Count = 0  # exact shares: may hold rationals (a node split over kernels)
    matmul_flops: Count = 0
    bytes: Count = 0
    runtime_coeff: Count = 0  # run-time FLOPs per (query, key) pair of the nodes it holds

    @property
    def extern(self) -> bool:
        return _is_extern(self.name)


def _op_base(op: str | None) -> str | None:
    """``aten.mm.default``, ``extern_kernels.mm``, ``torch.ops.aten.mm.default`` -> ``mm``."""
    if op is None:
        return None
    parts = op.removeprefix("torch.ops.").removeprefix("extern_kernels.").split(".")
    return parts[1] if len(parts) >= 2 else parts[0]  # namespace.op[.overload], or op


def _is_extern(kernel: str) -> bool:
    """An extern call (a library GEMM, an op Inductor did not lower), not generated code."""
    return _HANDLE.sub("", kernel).startswith(("extern_kernels.", "aten.", "torch.ops."))


@dataclasses.dataclass
class Shape:
    """What the boundary bytes need of a graph, read before Inductor rewrites it: per node,
    its inputs, its output's bytes, whether the graph returns it."""

    inputs: dict[str, tuple[str, ...]]
    out_bytes: dict[str, Count]
    returned: frozenset[str]
    order: tuple[str, ...]
    # an AOTAutograd graph: its nodes' pre-grad sources (``from_node``), for a cache hit
    sources: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def snapshot(gm: Any) -> Shape:
    import torch
    from torch.utils._pytree import tree_leaves

    from fxflops.cost.analysis import tensor_bytes
    from fxflops.util import meta_value

    inputs: dict[str, tuple[str, ...]] = {}
    out_bytes: dict[str, Count] = {}
    returned: set[str] = set()
    sources: dict[str, tuple[str, ...]] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            for value in tree_leaves(node.args):
                if isinstance(value, torch.fx.Node):
                    returned.add(value.name)
            continue
        inputs[node.name] = tuple(n.name for n in node.all_input_nodes)
        try:
            out_bytes[node.name] = total([to_count(b) for b in tensor_bytes(meta_value(node))])
        except Exception:
            out_bytes[node.name] = 0
        chain = node.meta.get("from_node") or []
        sources[node.name] = tuple(getattr(s, "name", "") for s in chain[:1])
    return Shape(inputs, out_bytes, frozenset(returned), tuple(inputs), sources)


def _op_of(post: str, post_ops: Mapping[str, str]) -> str | None:
    """A post-grad node's op: from the post-grad graph where Inductor emitted it (a fresh
    compile), else from its name, which Inductor takes from its op (``view_3``: ``view``;
    an FX-graph cache hit does not emit the graph)."""
    if post_ops:
        return post_ops.get(post)
    return "aten." + re.sub(r"_\d+$", "", post) + ".default"


def _computes(op: str | None, cache: dict[str, bool]) -> bool:
    """Whether a post-grad node computes: an op that is not a view, reshape or metadata. A
    node that calls no op (size arithmetic, ``getitem``) does not."""
    if op is None:
        return False
    if op not in cache:
        import torch

        from fxflops.cost import formulas  # noqa: F401  (the registry filled)
        from fxflops.cost.registry import is_zero_flop

        target: Any = torch.ops
        try:
            for part in op.split("."):
                target = getattr(target, part)
            cache[op] = not is_zero_flop(target)
        except Exception:  # not an op torch knows by that name: taken to compute
            cache[op] = True
    return cache[op]


def _kernel_nodes(shape: Shape, mapping: Mapping[str, Any], pre_grad: bool
                  ) -> dict[str, dict[str, int]]:
    """{kernel (with its handle): {graph node: number of its aten nodes in the kernel}}."""
    to_post = next((v for k, v in mapping.items() if k.endswith("ToPost") and k != "preToPost"
                    and isinstance(v, dict)), {})
    post_to_pre = mapping.get("postToPre") or {}
    post_ops = mapping.get("_post_ops") or {}
    computes: dict[str, bool] = {}
    by_source: dict[str, list[str]] = {}
    for name, srcs in shape.sources.items():
        for s in srcs:
            by_source.setdefault(s, []).append(name)
    # an extern call lists among its nodes those a generated kernel computes around it (its
    # inputs' prologue), and a generated kernel may list the extern's own node (whose
    # output it reads): each post-grad node is computed by one of them
    own: dict[str, str] = {}  # post-grad node -> the extern kernel whose op it is
    for kernel, posts in to_post.items():
        name = _HANDLE.sub("", kernel)
        if _is_extern(name):
            for post in posts:
                if _op_base(_op_of(post, post_ops)) == _op_base(name):
                    own.setdefault(post, kernel)
    generated = {post for kernel, posts in to_post.items()
                 if not _is_extern(_HANDLE.sub("", kernel)) for post in posts}
    out: dict[str, dict[str, int]] = {}
    for kernel, posts in to_post.items():
        counts = out.setdefault(kernel, {})
        extern = _is_extern(_HANDLE.sub("", kernel))
        for post in posts:
            if post in own and own[post] != kernel:
                continue
            if extern and post not in own and post in generated:
                continue
            if not _computes(_op_of(post, post_ops), computes):
                continue
            if pre_grad:
                owners = [p for p in post_to_pre.get(post, []) if p in shape.inputs]
            elif post in shape.inputs:  # the passes left it as it was
                owners = [post]
            else:  # a node the passes made (or a cache hit): by its pre-grad source
                owners = [n for p in post_to_pre.get(post, []) for n in by_source.get(p, [])]
            for owner in dict.fromkeys(owners):
                counts[owner] = counts.get(owner, 0) + 1
    return out


def kernel_costs(cost: GraphCost, shape: Shape, mapping: Mapping[str, Any],
                 pre_grad: bool = True) -> list[KernelCost]:
    """Every kernel of the graph with its share of the nodes' FLOPs and its boundary bytes;
    the nodes of no kernel in ``<none>`` (see the module's text)."""
    members = _kernel_nodes(shape, mapping, pre_grad)
    by_name = {c.name: c for c in cost.nodes}
    held: dict[str, dict[str, int]] = {}  # node -> {kernel: aten nodes}
    for kernel, counts in members.items():
        for member, n in counts.items():
            held.setdefault(member, {})[kernel] = n
    _claim_orphans(shape, by_name, held, members)
    kernels: dict[str, KernelCost] = {}
    for kernel in members:
        handle = _HANDLE.search(kernel)
        bare = _HANDLE.sub("", kernel)
        # a generated kernel's name is unique; an extern call's is its op's: with its handle
        kernels[kernel] = KernelCost(kernel if _is_extern(bare) else bare,
                                     int(handle.group()[1:]) if handle else len(kernels),
                                     tuple(members[kernel]))
    none = KernelCost(NONE, 1 << 30, tuple(n for n in by_name if n not in held))
    parts: dict[str, list[list[Count]]] = {k: [[], [], []] for k in [*kernels, NONE]}
    for node_name, node_cost in by_name.items():
        shares = held.get(node_name) or {NONE: 1}
        whole = sum(shares.values())
        for kernel, n in shares.items():
            share = sympy.Rational(n, whole)
            for i, c in enumerate((node_cost.flops, node_cost.matmul_flops,
                                   node_cost.runtime_coeff)):
                if c != 0:
                    parts[kernel][i].append(c if share == 1 else share * c)
    for kernel, k in (*kernels.items(), (NONE, none)):
        k.flops, k.matmul_flops, k.runtime_coeff = (_sum(p) for p in parts[kernel])
    _boundary_bytes(shape, kernels, held)
    # kernels of another graph in Inductor's globals (they compute none of this graph's
    # nodes: its inputs at most) are not this graph's
    out = sorted((k for k in kernels.values() if any(n in by_name for n in k.nodes)),
                 key=lambda k: k.order)
    if none.nodes and (none.flops != 0 or none.matmul_flops != 0):
        out.append(none)
    return out


def _claim_orphans(shape: Shape, by_name: Mapping[str, Any], held: dict[str, dict[str, int]],
                   members: dict[str, dict[str, int]]) -> None:
    """A node with FLOPs that no kernel claims (a post-grad pass replaced its aten node and
    its provenance with it) goes to the kernel of its nearest consumer that has one
    (Inductor fuses a pointwise op into what reads it), else of its nearest producer."""
    users: dict[str, list[str]] = {}
    for node, ins in shape.inputs.items():
        for i in ins:
            users.setdefault(i, []).append(node)

    def nearest(start: str, step: Mapping[str, Any]) -> str | None:
        seen, frontier = {start}, [start]
        while frontier:
            nxt = []
            for n in frontier:
                for m in step.get(n, ()):
                    if m in seen:
                        continue
                    if m in held:
                        return max(held[m], key=lambda k: held[m][k])
                    seen.add(m)
                    nxt.append(m)
            frontier = nxt
        return None

    for name, node_cost in by_name.items():
        if name in held or (node_cost.flops == 0 and node_cost.matmul_flops == 0):
            continue
        kernel = nearest(name, users) or nearest(name, shape.inputs)
        if kernel is not None:
            held[name] = {kernel: 1}
            members[kernel][name] = 1


def _sum(values: list[Count]) -> Count:
    if not values:
        return 0
    s = sympy.expand(sympy.Add(*values))
    return int(s) if s.is_Integer else s


def _boundary_bytes(shape: Shape, kernels: dict[str, KernelCost],
                    held: dict[str, dict[str, int]]) -> None:
    order = {k: kc.order for k, kc in kernels.items()}
    writer = {node: max(ks, key=lambda k: order[k]) for node, ks in held.items()}
    users: dict[str, set[str]] = {}
    for node, ins in shape.inputs.items():
        for i in ins:
            users.setdefault(i, set()).add(node)
    for kernel, kc in kernels.items():
        inside = set(kc.nodes)
        reads = {i for n in kc.nodes for i in shape.inputs.get(n, ()) if i not in inside}
        writes = {n for n in kc.nodes if writer.get(n) == kernel and (
            n in shape.returned or any(u not in inside for u in users.get(n, ())))}
        kc.bytes = total([shape.out_bytes.get(t, 0) for t in sorted(reads | writes)])


def at_size(kernels: list[KernelCost], binding: Mapping[sympy.Symbol, int]
            ) -> list[dict[str, Any]]:
    """Each kernel's FLOPs, matmul FLOPs and bytes at one size: integers whose FLOPs add
    up to the graph's exactly (shares rounded down, the remainder to the largest
    fractions)."""
    flops = _integers([_value(k.flops, binding) for k in kernels])
    matmul = _integers([_value(k.matmul_flops, binding) for k in kernels])
    return [{"kernel": k.name, "flops": f, "matmul_flops": m,
             "bytes": evaluate(k.bytes, binding) if k.name != NONE else 0}
            for k, f, m in zip(kernels, flops, matmul)]


def _value(count: Count, binding: Mapping[sympy.Symbol, int]) -> Fraction:
    if isinstance(count, int):
        return Fraction(count)
    v = sympy.nsimplify(count.xreplace({s: sympy.Integer(x) for s, x in binding.items()}))
    return Fraction(int(v.p), int(v.q))


def _integers(values: list[Fraction]) -> list[int]:
    floors = [v.numerator // v.denominator for v in values]
    remainder = int(sum(values)) - sum(floors)
    by_fraction = sorted(range(len(values)), key=lambda i: values[i] - floors[i], reverse=True)
    for i in by_fraction[:remainder]:
        floors[i] += 1
    return floors


def runtime_shares(kernels: list[KernelCost], runtime_flops: int) -> list[int]:
    """A call's run-time FLOPs (vLLM attention), shared by the kernels holding run-time
    nodes in proportion to their FLOPs per pair (exact, as ``at_size``)."""
    coeffs = [Fraction(int(k.runtime_coeff)) if isinstance(k.runtime_coeff, int)
              else Fraction(0) for k in kernels]
    whole = sum(coeffs)
    if not runtime_flops or not whole:
        return [0] * len(kernels)
    return _integers([c * runtime_flops / whole for c in coeffs])


# --- per-kernel time: N calls per size under torch.profiler ------------------------------


