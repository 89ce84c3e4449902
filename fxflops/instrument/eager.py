"""Uncompiled calls counted and timed as compiled graphs are: ``fxflops.eager(model)``.

A model that runs without torch.compile has no graph for the backend to walk; its calls
are counted from the ops they run instead (``cost.census``), once per shape class, and
then go through the same hot path and rows as a compiled graph's
(``instrument.wrap.InstrumentedGraph``, its record registered with the recorder like any
graph's): per size, count, median, FLOPs, bytes, MFU, in ``fxflops.recorder().stats()``,
the report, and any ``fxflops.scope()`` open around them. So eager and compiled can be set
side by side at one size.

A shape class's first call runs under the census (a dispatch per op, not timed: its
time would be the census's); its later calls are timed as any graph's. A first call made
while its CUDA stream captures a graph (a breakable CUDA graph's capture runs the model
once per size) is censused inside the capture, and held by it as any graph's call made
there: counted at each replay (``recording/captures.py``); the census reads shapes only,
never the device. A failure inside fxflops is said once, and the model runs on uncounted;
the model's own errors are its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxflops.cost.analysis import analysis_version
from fxflops.cost.census import CENSUS_LOCK, CallKey, Census, module_names, shape_class, tensors
from fxflops.cost.graph_cost import CostAt
from fxflops.instrument.plan import GraphPlan
from fxflops.instrument.registration import register_graph
from fxflops.instrument.wrap import InstrumentedGraph
from fxflops.recording.clocks import CPU_CLOCK, Clock, clock_for
from fxflops.recording.runtime_costs import charge_runtime
from fxflops.recording.size_stats import size_label
from fxflops.recording.store import GraphRecord
from fxflops.util import host_raised, warn_once


class EagerModel:
    """``fn`` (a module or any callable), its calls counted and timed per size key. Called
    as ``fn`` is; returns what ``fn`` returns. ``key``: a call's size key from ``(args,
    kwargs)`` (default: its shape class); ``names``: the modules to split the cost by (by
    id: their qualified names; default: ``fn``'s own, if a module); ``weights``: the
    tensors it holds (default: ``fn``'s parameters and buffers); ``meta``: the record's;
    ``clock``: what times its calls (default: by its first call's tensors' device)."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, *,
                 key: Callable[[Any], Any] = shape_class, names: dict[int, str] | None = None,
                 weights: Sequence[torch.Tensor] | None = None,
                 meta: dict[str, Any] | None = None, clock: Clock | None = None) -> None:
        self.fn = fn
        self.name = name or f"eager_{_name_of(fn)}{{index}}"
        self._key = key
        self._names = module_names(fn) if names is None else names
        self._weights = weights
        self._meta = {"eager": True, **(meta or {})}
        self._clock = clock
        self._graph: InstrumentedGraph | None = None
        self._broken = False
        self._lock = threading.Lock()

    @property
    def record(self) -> GraphRecord | None:
        """Its record in the recorder, once a call was counted."""
        return self._graph.record if self._graph is not None else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call_at(self._key((args, kwargs)), args, kwargs)

    def call_at(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call whose size key the caller read (a serving engine's token count)."""
        graph = self._graph
        if graph is not None and (key in graph.record.counted
                                  or len(graph.record.counted) >= graph.record.max_sizes):
            # the hot path of any graph (a size past the cap: its overflow row, no census)
            return graph((key, args, kwargs))
        if self._broken:  # (a census failed: new sizes run uncounted)
            return self.fn(*args, **kwargs)
        return self._count(key, args, kwargs)

    def _run(self, packed: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> Any:
        return self.fn(*packed[1], **packed[2])

    def _count(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A new size's call, under the census: counted, not timed; or, its stream
        capturing a CUDA graph, the capture's call, counted at the graph's replays."""
        clock = self._clock
        if clock is not None and clock.captures_here():
            # (no row: a captured call is counted at its replays, in their phase's rows)
            return clock.time_call(self._census, (key, args, kwargs, False),
                                   None,  # type: ignore[arg-type]
                                   lambda: self.record, key)
        return self._census(key, args, kwargs, True)

    def _census(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                counted: bool) -> Any:
        """``fn``'s call under the census, its cost registered at ``key``; ``counted``: the
        call counted now (not a capture's)."""
        census = Census(self._names)
        with CENSUS_LOCK, census:  # (the model's own errors propagate)
            out = self.fn(*args, **kwargs)
        try:
            weights = self._weights if self._weights is not None else (
                [*self.fn.parameters(), *self.fn.buffers()]
                if isinstance(self.fn, torch.nn.Module) else [])
            cost = census.cost((args, kwargs), out, weights)
            with self._lock:
                graph = self._graph
                if graph is None:
                    clock = self._clock
                    if clock is None:
                        device = next((t.device.type for t in (*tensors((args, kwargs)),
                                                               *weights)), "cpu")
                        clock = clock_for("cuda" if device == "cuda" else "cpu")
                    device = "cpu" if clock is CPU_CLOCK else "cuda"
                    plan = GraphPlan(cost, "static", device, analysis_version())
                    # (its per-op and per-module split is this first census's: say at what)
                    meta = {**self._meta,
                            "split_size": size_label(CallKey().as_tuple(key))}
                    record = register_graph(plan, self.name, meta, None)
                    graph = InstrumentedGraph(self._run, record, plan, clock)
                graph.record.counted[key] = CostAt(*cost.totals())
                if counted:
                    row = graph.record.row(key)
                    next(row.calls)  # the census's call: counted, its time not a sample
                    if row.runtime is not None:  # (a serving engine's attention: this call's lengths)
                        charge_runtime(row)
                self._graph = graph
        except Exception as e:
            if host_raised(e):
                raise
            # sizes counted so far go on as before; no new size is censused again
            self._broken = True
            warn_once(f"eager:{id(self)}", "fxflops: %s's calls at new sizes not counted "
                      "(%s: %s); the model runs on", self.name, type(e).__name__, e)
        return out


def _name_of(fn: Any) -> str:
    return type(fn).__name__ if isinstance(fn, torch.nn.Module) else \
        getattr(fn, "__name__", "fn")


def eager(model: Callable[..., Any], name: str | None = None) -> EagerModel:
    """``model`` (an ``nn.Module`` or any callable), uncompiled, its calls counted from the
    ops they run (once per shape class) and timed per size, in the same rows as compiled
    graphs' (``fxflops.recorder().stats()``, the report, ``fxflops.scope()``). ``name``
    may hold ``{index}``."""
    return EagerModel(model, name)
