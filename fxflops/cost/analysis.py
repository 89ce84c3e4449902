"""The FX pass: annotate every node with its cost and total it per graph.

Like ``torch/fx/passes/shape_prop.py``, a short interpreter that writes into ``node.meta``
and nothing else. Each node's cost comes from the same dispatcher view ``FlopCounterMode``
has: aten-level nodes go straight to their formula; torch-level nodes (Dynamo graphs:
``F.linear``, tensor methods, ``call_module``) are re-run on their fake example values under
a counting dispatch mode that decomposes exactly as ``FlopCounterMode`` does. Shapes may be
symbolic; counts then are sympy expressions of the graph's size symbols. Real tensors are
never run.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.fx.node import map_aggregate
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fxflops.cost import (
    formulas,  # noqa: F401 (imported: the built-ins registered)
    higher_order,
    registry,
)
from fxflops.cost.binder import SizeBinder, UnboundSymbolError, symbol_sources
from fxflops.cost.graph_cost import (
    GraphCost,
    NodeCost,
    RuntimeCost,
    clean_module_path,
    to_count,
    total,
)
from fxflops.cost.layer_check import Layers, check_layers
from fxflops.cost.registry import (  # noqa: F401 (fxflops.register_*: after the built-ins)
    register_bytes,
    register_formula,
    register_io_bytes,
    register_zero_flop,
)
from fxflops.util import meta_value as _val
from fxflops.util import warn_once

# Metadata queries FlopCounterMode lets through uncounted; so do we.
METADATA_OPS = {
    torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
    torch.ops.aten.sym_storage_offset.default, torch.ops.aten.is_contiguous.default,
    torch.ops.aten.stride.default, torch.ops.aten.size.default, torch.ops.aten.dim.default,
    torch.ops.aten.numel.default, torch.ops.prim.layout.default, torch.ops.prim.device.default,
}

_AUTO_FUNCTIONALIZED = {
    torch.ops.higher_order.auto_functionalized,
    getattr(torch.ops.higher_order, "auto_functionalized_v2", None),
}


def _is_zero(count: Any) -> bool:
    return isinstance(count, int) and count == 0


class OpTally:
    """What the ops of one node add up to."""

    __slots__ = ("flops", "matmul_flops", "uncounted", "only_views", "runtime", "runtime_cost")

    def __init__(self) -> None:
        self.flops: list[Any] = []
        self.matmul_flops: list[Any] = []
        self.uncounted: list[str] = []
        self.only_views = True
        self.runtime: str | None = None
        self.runtime_cost: RuntimeCost | None = None

    def add(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], out: Any) -> None:
        name = registry.op_name(func)
        formula = registry.formula_for(name)
        is_view = isinstance(func, torch._ops.OpOverload) and func.is_view
        if not is_view and name != "_operator.getitem":
            self.only_views = False
        if formula is not None:
            if formula.named:
                flops = formula.fn(registry.bind_arguments(func, args, kwargs, out))
            else:
                flops = formula.fn(*args, out_val=out, **kwargs)
            if isinstance(flops, registry.Split):
                self.flops.append(flops.matmul + flops.vector)
                self.matmul_flops.append(flops.matmul)
                return
            if formula.runtime:
                cost = flops if isinstance(flops, RuntimeCost) else RuntimeCost(flops)
                if not _is_zero(cost.flops_per_pair) or not _is_zero(cost.bytes_per_context_token):
                    # (nothing to add at run time: a static node, off the per-call path)
                    self.runtime, self.runtime_cost = formula.runtime, cost
                if cost.static_flops:
                    self.flops.append(cost.static_flops)
                    if formula.kind == "matmul":
                        self.matmul_flops.append(cost.static_flops)
                return
            self.flops.append(flops)
            if formula.kind == "matmul":
                self.matmul_flops.append(flops)
        elif registry.is_zero_flop(func):
            return
        elif registry.is_pointwise(func):
            first = next((t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)), None)
            if first is not None:
                self.flops.append(first.numel())
        else:
            self.uncounted.append(name)

    def charge(self, cost: NodeCost) -> None:
        """Add what the ops came to onto ``cost`` (a node's, or a census's per-op node):
        FLOPs of both classes, the ops left uncounted, a run-time-costed op's terms."""
        cost.flops = total([cost.flops, *[to_count(f) for f in self.flops]])
        cost.matmul_flops = total([cost.matmul_flops,
                                   *[to_count(f) for f in self.matmul_flops]])
        cost.uncounted += tuple(self.uncounted)
        if self.runtime and self.runtime_cost is not None:
            rc = self.runtime_cost
            cost.runtime, cost.runtime_coeff = self.runtime, to_count(rc.flops_per_pair)
            cost.runtime_bytes = to_count(rc.bytes_per_context_token)
            cost.runtime_layer = rc.layer


class CountingMode(TorchDispatchMode):
    """Counts aten ops the way ``FlopCounterMode`` does: decompose what has no formula."""

    def __init__(self, tally: OpTally) -> None:
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in METADATA_OPS:
            return func(*args, **kwargs)
        if registry.op_name(func) not in registry.FORMULAS:
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        self.tally.add(func, args, kwargs, out)
        return out


def _has_val(node: torch.fx.Node) -> bool:
    return "val" in node.meta or "example_value" in node.meta


def tensor_bytes(values: Any) -> list[Any]:
    """The bytes of each distinct tensor in ``values`` (nested)."""
    seen: set[int] = set()
    out = []
    for v in tree_flatten(values)[0]:
        if isinstance(v, torch.Tensor) and id(v) not in seen:
            seen.add(id(v))
            out.append(v.numel() * v.element_size())
    return out


def _module_of(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return clean_module_path(str(path))


def _is_direct_op(target: Any) -> bool:
    return isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))


def _is_higher_order(target: Any) -> bool:
    return isinstance(target, torch._ops.HigherOrderOperator)


class CostAnalysis:
    """Walks a graph once; ``run()`` fills ``node.meta["fxflops"]`` and returns a GraphCost."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None,
                 backward: bool = False, layers: Layers = ()):
        self.gm = gm
        self.example_inputs = example_inputs
        # the layers of the model(s) the graph is of, for the safety net (the caller's)
        self.layers = layers
        # a backward graph of AOTAutograd: its nodes copied from the forward are recomputed
        self.backward = backward
        self.fake_mode: Any = None
        self.shape_env: Any = None
        if example_inputs is not None and not all(
            _has_val(n) for n in gm.graph.nodes if n.op == "placeholder"
        ):
            self._propagate(example_inputs)
        self.fake_mode = _fake_mode_of(gm)
        if self.fake_mode is None:
            self.fake_mode = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
        self.shape_env = self.fake_mode.shape_env

    def _propagate(self, example_inputs: Sequence[Any]) -> None:
        """Fill missing ``meta["val"]`` by fake propagation; real tensors never run."""
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        mode = torch._guards.detect_fake_mode(example_inputs)
        if mode is None:
            mode = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
            example_inputs = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                              for x in example_inputs]
        FakeTensorProp(self.gm, mode).propagate_dont_convert_inputs(*example_inputs)

    def run(self) -> GraphCost:
        nodes: list[NodeCost] = []
        bytes_in: list[Any] = []
        bytes_out: list[Any] = []
        uncounted: Counter[str] = Counter()
        guards = self.shape_env.suppress_guards() if self.shape_env else contextlib.nullcontext()
        with guards:
            for node in self.gm.graph.nodes:
                if node.op == "placeholder":
                    bytes_in += tensor_bytes(_val(node))
                    continue
                if node.op == "output":
                    bytes_out += tensor_bytes(map_aggregate(node.args, _val))
                    continue
                if node.op == "get_attr":
                    # weights a graph holds as constants (vLLM's) are read like inputs
                    bytes_in += tensor_bytes(self._attr_value(node))
                    continue
                cost = self.node_cost(node)
                cost.recomputed = self.backward and _is_recomputed(node)
                node.meta["fxflops"] = cost
                nodes.append(cost)
            # the safety net: layers whose counted FLOPs fall short of their sizes
            layers = check_layers(self.gm, {c.name: c for c in nodes}, self.layers)
        for cost in nodes:
            for op in cost.uncounted:
                uncounted[op] += 1
        for e in layers.estimated:
            warn_once(f"estimated:{e.ops}", "fxflops: layer %s (%s) counted from its sizes: "
                      "no formula counts %s right (add one with fxflops.register_formula)",
                      e.layer, e.type_name, ", ".join(e.ops))
        for op, n in uncounted.items():
            warn_once(f"uncounted:{op}", "fxflops: no FLOP formula for %s (%d nodes); counted "
                      "as 0 (add one with fxflops.register_formula)", op, n)
        flops = total([n.flops for n in nodes])
        matmul = total([n.matmul_flops for n in nodes])
        # an input read in part is taken off once, however many nodes read it (one rotary
        # cache for every layer, at the same positions)
        unread: dict[str, Any] = {}
        for node_cost in nodes:
            for source, count in node_cost.unread:
                unread.setdefault(source, count)
        io = total([to_count(b) for b in bytes_in + bytes_out]
                   + [n.io_bytes for n in nodes if n.io_bytes != 0]
                   + [-1 * c for c in unread.values()])
        node_bytes = total([n.bytes for n in nodes])
        recomputed = [n for n in nodes if n.recomputed]
        symbols: set[Any] = set()
        for c in (flops, matmul, io, node_bytes, *[n.runtime_coeff for n in nodes],
                  *[n.runtime_bytes for n in nodes]):
            if not isinstance(c, int):
                symbols |= c.free_symbols
        ordered = tuple(sorted(symbols, key=self._appearance_order()))
        try:
            binder: SizeBinder | None = SizeBinder.from_graph(self.gm, ordered)
        except UnboundSymbolError:
            binder = None
        return GraphCost(
            flops=flops, matmul_flops=matmul, bytes_io=io, bytes_nodes=node_bytes,
            symbols=ordered, nodes=nodes, uncounted=dict(uncounted),
            num_nodes=len(self.gm.graph.nodes), binder=binder,
            recomputed_flops=total([n.flops for n in recomputed]),
            recomputed_matmul_flops=total([n.matmul_flops for n in recomputed]),
            layers_checked=layers.checked, estimated=layers.estimated,
            symbol_sources=symbol_sources(self.gm, ordered, self.shape_env),
        )

    def _attr_value(self, node: torch.fx.Node) -> Any:
        value = _val(node)
        if value is None:
            try:
                value = self.gm.get_parameter(str(node.target))
            except AttributeError:
                try:
                    value = self.gm.get_buffer(str(node.target))
                except AttributeError:
                    value = None
        return value

    def _appearance_order(self) -> Any:
        """Symbols in the order the inputs show them (batch before sequence, usually)."""
        order: dict[str, int] = {}
        for node in self.gm.graph.nodes:
            if node.op != "placeholder":
                continue
            val = _val(node)
            sizes: list[Any] = [val] if isinstance(val, torch.SymInt) else (
                list(val.shape) if isinstance(val, torch.Tensor) else [])
            for size in sizes:
                if isinstance(size, torch.SymInt):
                    order.setdefault(str(size.node.expr), len(order))
        return lambda s: (order.get(str(s), len(order)), str(s))

    def _subgraph(self, node: Any) -> torch.fx.GraphModule | None:
        """The module a ``get_attr`` node names, if it is a subgraph (a HOP's body)."""
        if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
            return None
        try:
            found = self.gm.get_submodule(str(node.target))
        except AttributeError:
            return None
        return found if isinstance(found, torch.fx.GraphModule) else None

    def _value(self, node: Any) -> Any:
        """A node's example value; a subgraph's module for a HOP's body."""
        return self._subgraph(node) or _val(node)

    def node_cost(self, node: torch.fx.Node) -> NodeCost:
        target: Any = node.target
        args, kwargs = map_aggregate(node.args, self._value), map_aggregate(node.kwargs, _val)
        if target in _AUTO_FUNCTIONALIZED and target is not None:
            target, args, kwargs = args[0], (), {k: v for k, v in kwargs.items()
                                                if not k.startswith("_")}
            target = _unwrap_overload(target)
        name = registry.op_name(target) if node.op == "call_function" else (
            f"method.{target}" if node.op == "call_method" else
            type(self.gm.get_submodule(target)).__name__)
        cost = NodeCost(node.name, name, module=_module_of(node))
        if registry.is_zero_flop(target if node.op == "call_function" else name):  # known free
            return cost
        returns_nothing = _is_direct_op(target) and not _unwrap_overload(target)._schema.returns
        if (not _has_val(node) and not returns_nothing) or any(
                not _has_val(a) and self._subgraph(a) is None for a in node.all_input_nodes):
            cost.uncounted, cost.error = (name,), "no shape metadata"
            warn_once(f"nometa:{name}", "fxflops: node %s (%s) has no shape metadata; "
                      "counted as 0", node.name, name)
            return cost
        if node.op == "call_function" and _is_higher_order(target) and \
                registry.formula_for(name) is None:
            return self._higher_order_cost(node, name, args, kwargs, cost)
        tally = OpTally()
        try:
            if node.op == "call_function" and _is_higher_order(target):
                tally.add(target, args, kwargs, _val(node))  # its formula (flex attention)
            elif node.op == "call_function" and _is_direct_op(target):
                overload = _unwrap_overload(target)
                args, kwargs = _positional(overload, args, kwargs)
                tally.add(overload, args, kwargs, _val(node))
            else:
                self._fake_run(node, target, args, kwargs, tally)
            io_bytes = registry.IO_BYTES.get(name)
            if io_bytes is not None:
                self._io_bytes(cost, node, io_bytes(*args, **kwargs))
            explicit = registry.BYTES_FORMULAS.get(name)
            if explicit is not None:
                node_bytes = explicit(*args, **kwargs)
            elif tally.only_views:
                node_bytes = 0
            else:
                out = _val(node)
                node_bytes = sum(tensor_bytes((args, kwargs, out)))
        except Exception as e:  # a formula that raises must not stop the analysis
            cost.uncounted, cost.error = (name,), f"{type(e).__name__}: {e}"
            warn_once(f"error:{name}", "fxflops: could not cost %s (%s): %s", node.name, name, e)
            return cost
        tally.charge(cost)
        cost.bytes = to_count(node_bytes)
        if tally.matmul_flops:
            first = next((t for t in tree_flatten((_read_args(target, args), kwargs))[0]
                          if isinstance(t, torch.Tensor)), None)
            cost.dtype = str(first.dtype) if first is not None else None
        return cost

    def _higher_order_cost(self, node: torch.fx.Node, name: str, args: Any, kwargs: Any,
                           cost: NodeCost) -> NodeCost:
        """A HOP node: the subgraphs it runs (``cost.higher_order``), each costed by this
        pass on the node's operands, times the runs; its bytes are its own inputs' and
        outputs'. A HOP with no entry there is named once and counted as 0."""
        handler = higher_order.handler_for(name)
        if handler is None:
            cost.uncounted, cost.error = (name,), "no cost for this higher-order op"
            warn_once(f"hop:{name}", "fxflops: no cost for the higher-order op %s (node %s); "
                      "counted as 0", name, node.name)
            return cost
        try:
            runs = handler(args, kwargs)
            if runs.branches is not None:
                flops, matmul, uncounted, note = self._branches_cost(runs)
            else:
                subs = [self._cost_of(gm, operands) for gm, operands in runs.calls]
                times = to_count(runs.times)
                flops = total([total([s.flops for s in subs]) * times])
                matmul = total([total([s.matmul_flops for s in subs]) * times])
                uncounted = tuple(op for s in subs for op in s.uncounted)
                note = runs.note
            cost.bytes = to_count(sum(tensor_bytes((args, kwargs, _val(node)))))
        except Exception as e:  # a subgraph that cannot be costed must not stop the analysis
            cost.uncounted, cost.error = (name,), f"{type(e).__name__}: {e}"
            warn_once(f"error:{name}", "fxflops: could not cost %s (%s): %s", node.name, name, e)
            return cost
        cost.flops, cost.matmul_flops, cost.uncounted = flops, matmul, uncounted
        if note:
            cost.note = note
            warn_once(f"hopnote:{name}", "fxflops: %s (node %s)", note, node.name)
        return cost

    def _cost_of(self, gm: torch.fx.GraphModule, operands: Sequence[Any]) -> GraphCost:
        """A HOP's subgraph costed on ``operands`` (the same pass, the same symbols)."""
        return CostAnalysis(gm, list(operands), self.backward).run()

    def _branches_cost(self, runs: higher_order.Runs) -> tuple[Any, Any, tuple[str, ...],
                                                                 str | None]:
        """A ``cond``: the branch the predicate picks where it is known from the sizes (a
        constant, or a Piecewise of the size symbols); else the larger of each class."""
        assert runs.branches is not None
        (t_gm, t_ops), (f_gm, f_ops) = runs.branches
        t, f = self._cost_of(t_gm, t_ops), self._cost_of(f_gm, f_ops)
        uncounted = tuple(t.uncounted) + tuple(f.uncounted)
        pred = runs.pred
        if isinstance(pred, torch.SymBool):
            known = pred.node.maybe_as_bool()
            pred = known if known is not None else pred.node.expr
        if isinstance(pred, bool):
            picked = t if pred else f
            return picked.flops, picked.matmul_flops, uncounted, None
        if isinstance(pred, sympy.Basic):
            def either(a: Any, b: Any) -> Any:
                return a if a == b else sympy.Piecewise((a, pred), (b, True))
            return (either(t.flops, f.flops), either(t.matmul_flops, f.matmul_flops),
                    uncounted, None)
        note = "cond on tensor data: the larger branch counted (an upper bound)"
        return (_larger(t.vector_flops, f.vector_flops) + _larger(t.matmul_flops,
                                                                    f.matmul_flops),
                _larger(t.matmul_flops, f.matmul_flops), uncounted, note)

    @staticmethod
    def _io_bytes(cost: NodeCost, node: torch.fx.Node, found: Any) -> None:
        """A node's ``registry.IO_BYTES`` result: bytes to add, partial reads of inputs."""
        parts = found if isinstance(found, list) else [found]
        added, unread = [], []
        for part in parts:
            if isinstance(part, registry.PartialRead):
                source = node.args[part.arg] if part.arg < len(node.args) else None
                key = source.name if isinstance(source, torch.fx.Node) else \
                    f"{node.name}:{part.arg}"
                unread.append((key, to_count(part.unread)))
            else:
                added.append(to_count(part))
        cost.io_bytes = total(added)
        cost.unread = tuple(unread)

    def _fake_run(self, node: torch.fx.Node, target: Any, args: Any, kwargs: Any,
                  tally: OpTally) -> None:
        with self.fake_mode, CountingMode(tally):
            if node.op == "call_function":
                target(*args, **kwargs)
            elif node.op == "call_method":
                getattr(args[0], target)(*args[1:], **kwargs)
            else:
                module = self.gm.get_submodule(target)
                fake_state = {k: self.fake_mode.from_tensor(v)
                              for k, v in {**dict(module.named_parameters()),
                                           **dict(module.named_buffers())}.items()}
                torch.func.functional_call(module, fake_state, tuple(args), kwargs)


def _larger(a: Any, b: Any) -> Any:
    """The larger of two counts (symbolic: sympy's Max)."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return sympy.Max(a, b)


def _is_recomputed(node: torch.fx.Node) -> bool:
    """A backward graph's node the partitioner took from the forward part of the joint
    graph (torch/_functorch/partitioners.py tags every joint node "is_forward" or
    "is_backward"): the forward did it once already."""
    return node.meta.get("partitioner_tag") == "is_forward"


def _fake_mode_of(gm: torch.fx.GraphModule) -> Any:
    """The fake mode of the graph's own example values (not the tracing context's, which
    can be a different one by the time a backend runs)."""
    for node in gm.graph.nodes:
        for v in tree_flatten(_val(node))[0]:
            if isinstance(v, torch._subclasses.FakeTensor):
                return v.fake_mode
    return None


def _positional(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Move keyword arguments that the schema allows positionally into place, as the
    dispatcher would hand them to a formula."""
    if not kwargs:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for i, a in enumerate(op._schema.arguments):
        if a.kwarg_only or i < len(args):
            continue
        if a.name in kwargs:
            args.append(kwargs.pop(a.name))
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            break
    return tuple(args), kwargs


def _read_args(target: Any, args: Sequence[Any]) -> Sequence[Any]:
    """The arguments an op reads: out-variant ops (``_C::onednn_mm(c!, a, ...)``) write their
    first ones. A matmul's dtype, which MFU's peak follows, is its first input's."""
    if not _is_direct_op(target):
        return args
    schema = _unwrap_overload(target)._schema.arguments
    return [a for i, a in enumerate(args)
            if i >= len(schema) or schema[i].alias_info is None
            or not schema[i].alias_info.is_write]


def _unwrap_overload(target: Any) -> Any:
    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = target.overloads()
        return getattr(target, "default" if "default" in overloads else overloads[0])
    return target


# the code that turns a graph into costs besides the formulas: this pass, the cost types,
# the binder, the registry, the layer check and the builders tables are made of
_COST_MODULES = (
    __name__, "fxflops.cost.graph_cost", "fxflops.cost.binder", "fxflops.cost.registry",
    "fxflops.cost.layer_check", "fxflops.cost.formulas.builders", "fxflops.cost.higher_order")


def analysis_version() -> str:
    """A hash of the code that turns a graph into costs: an artifact analysed by other code
    (an AOT artifact from a compile cache, written before an upgrade) carries stale costs.
    That code is the cost model's own and every module whose formulas are registered now
    (the built-in ones, an integration's, a user's): an integration registers its formulas
    before it compiles or loads anything."""
    return _version(registry.formula_modules())


@functools.lru_cache(maxsize=8)
def _version(formula_modules: tuple[str, ...]) -> str:
    import hashlib
    import importlib
    import sys

    digest = hashlib.sha1()
    for name in _COST_MODULES:
        digest.update(_code_of(importlib.import_module(name)))
    for name in formula_modules:
        module = sys.modules.get(name)
        digest.update(_code_of(module) if module is not None else name.encode())
    return digest.hexdigest()[:12]


def _code_of(module: Any) -> bytes:
    """A module's source, or its compiled code where no source was installed (a wheel of
    .pyc files): what the version hashes. Never raises (an artifact must still load)."""
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    for get in ("get_source", "get_code"):
        try:
            found = getattr(loader, get)(module.__name__)
        except Exception:
            continue
        if found is not None:
            return found.encode() if isinstance(found, str) else found.co_code
    return module.__name__.encode()


def analyze(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
            backward: bool = False, layers: Layers = ()) -> GraphCost:
    """Annotate every node of ``gm`` with ``node.meta["fxflops"]`` and return the totals.

    Uses the graph's fake-tensor metadata (``meta["val"]`` / ``meta["example_value"]``);
    graphs without it need ``example_inputs`` (real or fake tensors), from which shapes are
    propagated on fake tensors. ``backward``: ``gm`` is an AOTAutograd backward graph, whose
    nodes copied from the forward count as recomputation. ``layers``: the layers of the
    model(s) ``gm`` is a graph of (``layer_check.LayerSpec``\\ s by module path), checked
    against their sizes (none: nothing checked).
    """
    registry.require_formulas()  # (a built-in table that failed to load: no partial cost)
    return CostAnalysis(gm, example_inputs, backward, layers).run()
