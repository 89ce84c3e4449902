"""Uncompiled calls counted and timed as compiled graphs are: ``fxflops.eager(model)``.

A model that runs without torch.compile has no graph for the backend to walk; its calls
are counted from the ops they run instead (``cost.census``), once per shape class, and
then go through the same hot path and rows as a compiled graph's
(``instrument.wrap.InstrumentedGraph``, its record registered with the recorder like any
graph's): per size, count, median, FLOPs, bytes, MFU, in ``fxflops.recorder().stats()``,
the report, and any ``fxflops.scope()`` open around them. So eager and compiled can be set
side by side at one size.

A shape class's first call runs under the census (a dispatch per op, not timed: its
time would be the census's); its later calls are timed as any graph's. A failure inside
fxflops is said once, and the model runs on uncounted; the model's own errors are its
own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from fxflops.cost.analysis import analysis_version
from fxflops.cost.census import CENSUS_LOCK, Census, module_names, shape_class
from fxflops.cost.graph_cost import CostAt
from fxflops.instrument.plan import GraphPlan, register_graph
from fxflops.instrument.wrap import InstrumentedGraph
from fxflops.recording.clocks import clock_for
from fxflops.util import host_raised, warn_once


class EagerModel:
    """``fn`` (a module or any callable), its calls counted and timed per shape class.
    Called as ``fn`` is; returns what ``fn`` returns."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or f"eager_{type(fn).__name__ if isinstance(fn, torch.nn.Module) else getattr(fn, '__name__', 'fn')}{{index}}"
        self._names = module_names(fn)
        self._graph: InstrumentedGraph | None = None
        self._broken = False
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = (args, kwargs)
        graph = self._graph
        if graph is not None:
            if shape_class(call) in graph.record.counted:
                return graph(call)
        elif self._broken:
            return self.fn(*args, **kwargs)
        return self._count(call)

    def _run(self, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        return self.fn(*call[0], **call[1])

    def _count(self, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        """A new shape class's call, under the census: counted, not timed."""
        args, kwargs = call
        try:
            census = Census(self._names)
        except Exception as e:
            return self._give_up(e, call)
        with CENSUS_LOCK, census:  # (the model's own errors propagate)
            out = self.fn(*args, **kwargs)
        try:
            key = shape_class(call)
            weights = [*self.fn.parameters(), *self.fn.buffers()] \
                if isinstance(self.fn, torch.nn.Module) else []
            cost = census.cost(call, out, weights)
            with self._lock:
                graph = self._graph
                if graph is None:
                    device = next((t.device.type for t in (*shape_tensors(call), *weights)),
                                  "cpu")
                    device = "cuda" if device == "cuda" else "cpu"
                    plan = GraphPlan(cost, "static", device, analysis_version())
                    record = register_graph(plan, self.name, {"eager": True}, None)
                    graph = InstrumentedGraph(self._run, record, plan, clock_for(device))
                graph.record.counted[key] = CostAt(*cost.totals())
                row = graph.record.new_row(key)
                next(row.calls)  # the census's call: counted, its time not a sample
                self._graph = graph
        except Exception as e:
            if host_raised(e):
                raise
            self._give_up(e, None)
        return out

    def _give_up(self, error: Exception, call: Any) -> Any:
        self._broken = self._graph is None
        warn_once(f"eager:{id(self)}", "fxflops: %s's calls not counted (%s: %s); the model "
                  "runs on", self.name, type(error).__name__, error)
        return None if call is None else self._run(call)


def shape_tensors(call: Any) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(call)[0] if isinstance(t, torch.Tensor)]


def eager(model: Callable[..., Any], name: str | None = None) -> EagerModel:
    """``model`` (an ``nn.Module`` or any callable), uncompiled, its calls counted from the
    ops they run (once per shape class) and timed per size, in the same rows as compiled
    graphs' (``fxflops.recorder().stats()``, the report, ``fxflops.scope()``). ``name``
    may hold ``{index}``."""
    return EagerModel(model, name)
