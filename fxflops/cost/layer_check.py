"""The layer safety net: counts that do not depend on knowing every kernel's name.

A formula is found by an op's name, and the kernel a layer calls depends on the machine
(a serving engine routes one linear to one CPU library or another by CPU, each quantisation
scheme to its own GEMM on a GPU). A layer, though, knows its own sizes: a linear layer its
input and output features, a mixture of experts its experts, top-k and sizes, an attention
layer its heads. An integration that can see the model's layers describes them as
:class:`LayerSpec`\\ s, keyed by module path, and the analysis's caller hands them in
(``analysis.analyze(layers=...)``; the backend asks its layer sources,
``fxflops.instrument.plan``); the analysis then checks every layer that has nodes in the
graph (nodes carry the module they came from, ``nn_module_stack``): when the matmul FLOPs
its nodes were counted fall short of what its sizes imply, because an op is unknown or a
formula is wrong, the shortfall is counted on the layer's node, marked *estimated*, and
the layer and op are named in the graph's cost (and from there in the report, the CLI and
the metrics). An unknown kernel then costs a visible warning, never a silent -94%.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import sympy
import torch
import torch.fx
from torch.utils._pytree import tree_flatten

from fxflops.cost.graph_cost import Count, EstimatedLayer, NodeCost, to_count, total
from fxflops.util import meta_value, warn_once

LayerKind = Literal["linear", "moe", "attention"]


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """What one layer computes, from its own sizes (this rank's partition of it).

    linear: ``in_features`` (K) x ``out_features`` (N), ``2·K·N`` FLOPs per token.
    moe: ``hidden`` (H), ``intermediate`` (I, per partition), ``top_k``, ``experts`` on this
    rank of ``global_experts``, ``gated`` (gate and up: H -> 2I): per token
    ``2·top_k·H·I·(3 if gated else 2)`` times this rank's share of the routed tokens.
    attention: ``flops_per_pair`` per (query, key) pair and ``bytes_per_context_token`` of
    KV cache read, counted at run time from the KV lengths; ``layer_name`` is what its
    sliding window is looked up by.
    """

    kind: LayerKind
    type_name: str  # the module's class, ``module.qualname``, as nn_module_stack shows it
    in_features: int = 0
    out_features: int = 0
    hidden: int = 0
    intermediate: int = 0
    top_k: int = 0
    experts: int = 0
    global_experts: int = 0
    gated: bool = True
    flops_per_pair: int = 0
    bytes_per_context_token: int = 0
    layer_name: str | None = None

    @property
    def width(self) -> int:
        """The last dimension of the layer's input."""
        return self.in_features if self.kind == "linear" else self.hidden

    def matmul_flops(self, tokens: Count) -> Count:
        """Matmul FLOPs the layer's sizes imply for ``tokens`` tokens (attention: 0 here;
        its pairs are counted at run time)."""
        if self.kind == "linear":
            return total([2 * self.in_features * self.out_features * tokens])
        if self.kind == "moe":
            per_token = 2 * self.top_k * self.hidden * self.intermediate * (
                3 if self.gated else 2)
            share = sympy.Rational(self.experts, self.global_experts or self.experts)
            value = per_token * share * tokens
            return int(value) if isinstance(tokens, int) else sympy.floor(value)
        return 0


# what a caller that can see a model's layers hands the check: one mapping {module path:
# spec} per model a graph may be of (the paths of two models, a speculative decoder's
# drafter and its target, are the same: a graph is checked against its own model's only)
Layers = Sequence[Mapping[str, LayerSpec]]


def type_name(t: Any) -> str:
    """``module.qualname`` of a class (or the string nn_module_stack kept of it)."""
    if isinstance(t, str):
        return t.split("'")[1] if t.startswith("<class '") else t
    return f"{t.__module__}.{t.__qualname__}"


# --- the check --------------------------------------------------------------------------


@dataclasses.dataclass
class LayerCheck:
    checked: int = 0
    estimated: list[EstimatedLayer] = dataclasses.field(default_factory=list)


def _stack(node: torch.fx.Node) -> list[tuple[str, Any]]:
    from fxflops.cost.graph_cost import clean_module_path

    stack = node.meta.get("nn_module_stack") or {}
    return [(clean_module_path(str(path)), t) for path, t in stack.values()]


def _match(node: torch.fx.Node, specs: Layers) -> tuple[str, LayerSpec] | None:
    """The innermost module on the node's stack that a spec describes (same path and type)."""
    for path, t in reversed(_stack(node)):
        name = type_name(t)
        for mapping in specs:
            spec = mapping.get(path)
            if spec is not None and spec.type_name == name:
                return path, spec
    return None


def _tokens(spec: LayerSpec, nodes: list[torch.fx.Node]) -> Count | None:
    """Tokens the layer ran on: an input from outside the layer whose last dimension is
    the layer's width (its numel over the width), else an output of the layer whose last
    dimension is its output width."""
    inside = set(nodes)
    candidates: list[tuple[Any, int]] = []
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside and not _is_weight(arg):
                candidates += [(v, spec.width) for v in tree_flatten(meta_value(arg))[0]]
    if spec.kind == "linear":
        for node in nodes:
            candidates += [(v, spec.out_features) for v in tree_flatten(meta_value(node))[0]]
    counts = [to_count(value.numel() // width) for value, width in candidates
              if isinstance(value, torch.Tensor) and value.dim() >= 1 and width
              and _equal(value.shape[-1], width)]
    # a size symbol's count first: a weight that slipped through has a static one
    return next((c for c in counts if not isinstance(c, int)), counts[0] if counts else None)


def _is_weight(node: torch.fx.Node) -> bool:
    """A parameter or buffer: held by the graph (``get_attr``, as a serving engine's graphs
    may hold weights) or lifted to an input by Dynamo (``l_self_..._parameters_weight_``)."""
    from fxflops.cost.binder import is_parameter_name

    return node.op == "get_attr" or (node.op == "placeholder" and is_parameter_name(
        str(node.target))) or isinstance(meta_value(node), torch.nn.Parameter)


def _equal(size: Any, width: int) -> bool:
    if isinstance(size, int):
        return size == width
    expr = to_count(size)
    return isinstance(expr, int) and expr == width


# sizes at which a symbolic shortfall is looked for
_PROBES = (1, 3, 64, 4096)
# counts this close to the sizes' are right (rounding in a formula, a padded K)
_TOLERANCE = 0.005


def _short(expected: Count, counted: Count) -> bool:
    diff = total([expected, -1 * counted])
    if isinstance(diff, int):
        return diff > _TOLERANCE * (expected if isinstance(expected, int) else 0) and diff > 0
    symbols = diff.free_symbols | (expected.free_symbols if not isinstance(expected, int)
                                   else set())
    for probe in _PROBES:
        binding = {s: probe for s in symbols}
        d = float(diff.xreplace(binding))
        e = float(expected.xreplace(binding)) if not isinstance(expected, int) else expected
        if d > max(_TOLERANCE * e, 0.5):
            return True
    return False


def check_layers(gm: torch.fx.GraphModule, costs: Mapping[str, NodeCost],
                 specs: Layers = ()) -> LayerCheck:
    """Check every described layer that has nodes in ``gm`` against its sizes; count a
    shortfall on the layer's node (``NodeCost.estimated``). ``costs``: node name -> cost
    (changed in place). ``specs``: the layers of ``gm``'s model, from the caller (none:
    nothing is checked)."""
    result = LayerCheck()
    if not specs:
        return result
    by_layer: dict[str, tuple[LayerSpec, list[torch.fx.Node]]] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        found = _match(node, specs)
        if found is not None:
            by_layer.setdefault(found[0], (found[1], []))[1].append(node)
    for path, (spec, nodes) in by_layer.items():
        layer_costs = [costs[n.name] for n in nodes if n.name in costs]
        if not layer_costs:
            continue
        result.checked += 1
        try:
            added = _check_one(path, spec, nodes, layer_costs)
        except Exception as e:  # a layer that cannot be checked is left as counted
            warn_once(f"layer-check:{spec.type_name}", "fxflops: could not check layer %s "
                      "(%s) against its sizes (%s: %s)", path, spec.type_name,
                      type(e).__name__, e)
            continue
        if added is not None:
            result.estimated.append(added)
    return result


def _target(layer_costs: list[NodeCost]) -> NodeCost:
    """The node a layer's shortfall is put on: one that ran an op nothing counted, else
    the one that counted most (a formula that counts too little), else the first."""
    for c in layer_costs:
        if c.uncounted:
            return c
    counted = [c for c in layer_costs if c.matmul_flops != 0]
    return counted[0] if counted else layer_costs[0]


def _check_one(path: str, spec: LayerSpec, nodes: list[torch.fx.Node],
               layer_costs: list[NodeCost]) -> EstimatedLayer | None:
    if spec.kind == "attention":
        if any(c.runtime == "attention" for c in layer_costs):
            return None
        target = next((c for c in layer_costs if c.uncounted), None)
        if target is None:
            return None  # nothing in the layer that could be its attention
        target.runtime, target.runtime_coeff = "attention", spec.flops_per_pair
        target.runtime_bytes = spec.bytes_per_context_token
        target.runtime_layer = spec.layer_name or path
        return _mark(target, path, spec, 0)
    tokens = _tokens(spec, nodes)
    if tokens is None:
        warn_once(f"layer-tokens:{spec.type_name}", "fxflops: layer %s (%s): no input of "
                  "width %d in the graph; its FLOPs are not checked", path, spec.type_name,
                  spec.width)
        return None
    expected = spec.matmul_flops(tokens)
    counted = total([c.matmul_flops for c in layer_costs])
    if not _short(expected, counted):
        return None
    shortfall = total([expected, -1 * counted])
    target = _target(layer_costs)
    target.flops = total([target.flops, shortfall])
    target.matmul_flops = total([target.matmul_flops, shortfall])
    if target.dtype is None:
        target.dtype = _input_dtype(nodes, spec.width)
    return _mark(target, path, spec, shortfall)


def _mark(target: NodeCost, path: str, spec: LayerSpec, flops: Count) -> EstimatedLayer:
    ops = target.uncounted or (target.op,)
    target.estimated = f"{path} ({spec.type_name.rsplit('.', 1)[-1]}): {spec.kind} " \
                       f"counted from the layer's sizes; op {', '.join(ops)}"
    target.estimated_ops, target.uncounted = tuple(ops), ()
    return EstimatedLayer(path, spec.type_name, spec.kind, tuple(ops), flops)


def _input_dtype(nodes: list[torch.fx.Node], width: int) -> str | None:
    for node in nodes:
        for arg in node.all_input_nodes:
            v = meta_value(arg)
            if isinstance(v, torch.Tensor) and v.dim() and _equal(v.shape[-1], width):
                return str(v.dtype)
    return None
