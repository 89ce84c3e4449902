"""The cost of an uncompiled call, counted from the ops it runs (a census).

Where nothing is compiled (eager PyTorch, a serving engine with torch.compile off) there is
no FX graph to walk: the ops a call dispatches are its graph. :class:`Census` is a dispatch
mode that sees each op with its real arguments and counts it as the FX pass counts a node
(``cost.analysis``): the registry's formula where the op has one, one FLOP per element for
torch's pointwise ops, zero for the known-free ones, and, for an op with none of these,
the ops it decomposes into (as ``FlopCounterMode`` does), counted on fake copies of its
arguments. The real op always runs as it would without fxflops: the model's outputs are
unchanged, and a formula that fails makes its op uncounted, never the call fail.

A census costs a dispatch per op and is run once per shape class (``shape_class``); later
calls of that class are only timed (``instrument.eager``). What it returns is a
:class:`GraphCost` with plain ints, its nodes one per (op, module), as a compiled graph's
are per node, so the report's per-op and per-module splits read it the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from fxflops.cost import registry
from fxflops.cost.analysis import METADATA_OPS, CountingMode, OpTally, tensor_bytes
from fxflops.cost.graph_cost import GraphCost, NodeCost, total
from fxflops.util import warn_once


def tensors(values: Any) -> list[torch.Tensor]:
    """Every tensor in ``values`` (nested), in order."""
    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]


class CallKey:
    """The size key of an uncompiled call, given with it: ``InstrumentedGraph`` is called
    with one positional argument, ``(key, args, kwargs)``, so that reading the key is one
    index (``key(args)``). A key is a shape class (``shape_class``) or a token count."""

    def key(self, args: Sequence[Any]) -> Any:
        return args[0][0]

    def as_tuple(self, key: Any) -> tuple[int, ...]:
        """A token count, or every dimension of a shape class in order: the row's size
        label (``8``, ``2x128x64``)."""
        if isinstance(key, int):
            return (key,)
        return tuple(d for shape in key for d in shape)


def shape_class(call: Any) -> tuple[Any, ...]:
    """The shapes of every tensor in ``call`` (``(args, kwargs)``, nested in lists, tuples
    and dicts), in order: read on every call of an uncompiled model, so a plain walk (torch's
    pytree costs about 10 us a call), each shape a ``torch.Size`` (a tuple)."""
    found: list[Any] = []
    _shapes(call[0], found)
    if call[1]:
        _shapes(call[1].values(), found)
    return tuple(found)


def _shapes(values: Any, found: list[Any]) -> None:
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v.shape)
        elif isinstance(v, (list, tuple)):
            _shapes(v, found)
        elif isinstance(v, dict):
            _shapes(v.values(), found)


class Census(TorchDispatchMode):
    """Counts the ops run inside it, per (op, module); ``module_names``: the qualified name
    of each module of the model (by id), for the per-module split (the innermost module
    whose forward is running when the op runs)."""

    def __init__(self, module_names: dict[int, str] | None = None) -> None:
        super().__init__()
        self.nodes: dict[tuple[str, str], NodeCost] = {}
        self.ops = 0
        self._module_names = module_names or {}
        self._stack: list[str] = []
        self._fake: Any = None
        self._hooks: list[Any] = []

    # --- which module an op runs in: forward hooks, for the census's duration only -------

    def __enter__(self) -> Census:
        if self._module_names:
            from torch.nn.modules import module as nn_module

            names, thread = self._module_names, threading.get_ident()

            # (global hooks: another thread's modules are not this call's)
            def pre(mod: Any, _args: Any) -> None:
                name = names.get(id(mod))
                if name is not None and threading.get_ident() == thread:
                    self._stack.append(name)

            def post(mod: Any, _args: Any, _out: Any) -> None:
                if id(mod) in names and self._stack and threading.get_ident() == thread:
                    self._stack.pop()

            self._hooks = [nn_module.register_module_forward_pre_hook(pre),
                           nn_module.register_module_forward_hook(post)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the real op, exactly as without fxflops
        if func in METADATA_OPS:
            return out
        try:
            self._count(func, args, kwargs, out)
        except Exception as e:  # a formula that fails: the op uncounted, the call goes on
            name = registry.op_name(func)
            warn_once(f"census:{name}", "fxflops: could not count %s in an uncompiled call "
                      "(%s: %s); counted as 0", name, type(e).__name__, e)
            self._node(name).uncounted += (name,)
        return out

    def _node(self, name: str) -> NodeCost:
        module = self._stack[-1] if self._stack else ""
        node = self.nodes.get((name, module))
        if node is None:
            node = self.nodes[(name, module)] = NodeCost(
                f"{name}@{module}" if module else name, name, module=module)
        return node

    def _count(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        name = registry.op_name(func)
        self.ops += 1
        if registry.is_zero_flop(func):
            return
        tally = OpTally()
        if registry.formula_for(name) is not None or registry.is_pointwise(func):
            tally.add(func, args, kwargs, out)
        else:  # what it decomposes into, counted on fake copies (the real op ran above)
            self._decomposed(func, args, kwargs, tally)
        node = self._node(name)
        tally.charge(node)
        if not tally.only_views:
            node.bytes = total([node.bytes, sum(tensor_bytes((args, kwargs, out)))])
        if tally.matmul_flops and node.dtype is None:
            first = next(iter(tensors(args)), None)
            node.dtype = str(first.dtype) if first is not None else None

    def _decomposed(self, func: Any, args: Any, kwargs: Any, tally: OpTally) -> None:
        if self._fake is None:
            self._fake = torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
        fake = self._fake

        def to_fake(v: Any) -> Any:
            return fake.from_tensor(v) if isinstance(v, torch.Tensor) else v

        fargs, fkwargs = tree_map(to_fake, args), tree_map(to_fake, kwargs)
        with fake, CountingMode(tally):
            r = func.decompose(*fargs, **fkwargs)
            if r is NotImplemented:
                tally.add(func, fargs, fkwargs, func(*fargs, **fkwargs))

    def cost(self, inputs: Any, outputs: Any, weights: Any = ()) -> GraphCost:
        """The census as a graph's cost: its nodes; the bytes the call must move at least
        (its inputs, outputs and the weights it holds, as a graph's inputs and outputs
        and constants) and every op's own (the unfused upper bound)."""
        nodes = list(self.nodes.values())
        uncounted: dict[str, int] = {}
        for n in nodes:
            for op in n.uncounted:
                uncounted[op] = uncounted.get(op, 0) + 1
        for op in uncounted:
            warn_once(f"uncounted:{op}", "fxflops: no FLOP formula for %s (in an uncompiled "
                      "call); counted as 0 (add one with fxflops.register_formula)", op)
        return GraphCost(
            flops=total([n.flops for n in nodes]),
            matmul_flops=total([n.matmul_flops for n in nodes]),
            bytes_io=sum(tensor_bytes((inputs, outputs, weights))),
            bytes_nodes=total([n.bytes for n in nodes]),
            symbols=(), nodes=nodes, uncounted=uncounted, num_nodes=self.ops,
            binder=CallKey())  # type: ignore[arg-type]


# one census at a time in a process: the forward hooks it installs are global
CENSUS_LOCK = threading.Lock()


def module_names(model: Any) -> dict[int, str]:
    """Each module of ``model`` (an ``nn.Module``; anything else: none) by id: its
    qualified name, the root's its class name."""
    if not isinstance(model, torch.nn.Module):
        return {}
    return {id(m): name for name, m in model.named_modules() if name}
