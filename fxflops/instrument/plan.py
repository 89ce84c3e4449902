"""Planning a graph's instrumentation: its cost analysed (``GraphPlan``, picklable so it
travels with an artifact) against the layers its model's integration describes (the layer
sources), its record registered (the recorder's outputs attached then:
``outputs.session.attach``) and dumped, its kernels mapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fxflops import config
from fxflops.cost import kernels as kernel_costs
from fxflops.cost.analysis import analysis_version, analyze
from fxflops.cost.binder import static_size
from fxflops.cost.graph_cost import GraphCost
from fxflops.cost.layer_check import LayerSpec
from fxflops.outputs.session import attach
from fxflops.recording.recorder import recorder
from fxflops.recording.store import GraphRecord, UninstrumentedGraph
from fxflops.report.peaks import DTYPE_NAMES, device_name
from fxflops.util import host_raised, meta_value, warn_once

if TYPE_CHECKING:
    from fxflops.cost.kernels import KernelCost, Shape


# --- where a graph's layers come from (the safety net, ``cost.layer_check``) ---------------

LayerSource = Callable[[torch.fx.GraphModule, Sequence[Any] | None],
                       Iterable[Mapping[str, LayerSpec]]]
# integrations that can see a model's layers (the vLLM plugin's census): each is asked, per
# graph (with its example inputs), for one mapping {module path: spec} per model the graph
# is of (the paths of two models, a speculative decoder's drafter and its target, are the
# same: a graph is checked against its own model's layers only)
_SOURCES: list[LayerSource] = []


def register_layer_source(source: LayerSource) -> None:
    """Add a source of layer specs (idempotent for the same callable)."""
    if source not in _SOURCES:
        _SOURCES.append(source)


def unregister_layer_source(source: LayerSource) -> None:
    if source in _SOURCES:
        _SOURCES.remove(source)


def current_layers(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None
                   ) -> list[Mapping[str, LayerSpec]]:
    """The layers of the model(s) ``gm`` is a graph of, from every source."""
    found: list[Mapping[str, LayerSpec]] = []
    for source in list(_SOURCES):
        try:
            found.extend(source(gm, example_inputs))
        except Exception as e:  # a broken source must not stop the analysis
            warn_once(f"layer-source:{source!r}", "fxflops: no layer sizes from %r (%s: %s)",
                      source, type(e).__name__, e)
    return found


@dataclasses.dataclass
class GraphPlan:
    """What instrumenting a graph needs to know of it; picklable, so it travels with a
    serialised artifact."""

    cost: GraphCost
    static_size: int | str
    device: str  # "cuda" or "cpu": which clock times the calls
    analysed_by: str = ""  # analysis_version() of the code that made ``cost``
    # the kernels Inductor generated for it, with their costs (fxflops.cost.kernels);
    # None: not mapped (the feature off, another inner backend)
    kernels: list[KernelCost] | None = None


class NotInstrumentable(ValueError):
    pass


def plan(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
         backward: bool = False) -> GraphPlan:
    """Analyse ``gm`` (shapes from its metadata, or propagated from ``example_inputs``),
    its layers checked against what the layer sources say of them; ``backward``: an
    AOTAutograd backward graph (see ``analysis.analyze``)."""
    cost = analyze(gm, example_inputs, backward=backward,
                   layers=current_layers(gm, example_inputs))
    values = example_inputs if example_inputs is not None else [
        meta_value(n) for n in gm.graph.nodes if n.op == "placeholder"]
    device = "cuda" if any(isinstance(x, torch.Tensor) and x.device.type == "cuda"
                           for x in values) else "cpu"
    return GraphPlan(cost, static_size(gm), device, analysis_version())


@dataclasses.dataclass(frozen=True)
class KernelSetting:
    """Kernel maps on: each node mapped to the Inductor kernel it ran in, and
    ``profiled_calls`` calls per size profiled for the kernels' times (0: the map only)."""

    profiled_calls: int


def kernels_setting(explicit: int | None = None) -> KernelSetting | None:
    """Kernel maps and profiling: ``backend(kernels=N)``, else ``FXFLOPS_KERNELS``; None:
    off (nothing is captured, nothing changes on the call path)."""
    calls = explicit if explicit is not None else config.KERNELS.get()
    return None if calls is None else KernelSetting(calls)


def map_kernels(graph_plan: GraphPlan, record: GraphRecord,
                 kernel_maps: tuple[Shape, list[dict[str, Any]]], pre_grad: bool) -> None:
    """The graph's kernels and their costs, from the provenance mapping Inductor emitted
    for it (the last one: the graph's own, after any it compiled inside)."""
    shape, maps = kernel_maps
    if not maps:
        warn_once("kernels:nomap", "fxflops: no kernel map for graph %s (Inductor emitted no "
                  "provenance mapping: another inner backend, or an artifact compiled without "
                  "it)", record.name)
        return
    try:
        graph_plan.kernels = kernel_costs.kernel_costs(graph_plan.cost, shape, maps[-1],
                                                        pre_grad=pre_grad)
        record.kernels = graph_plan.kernels
        _dump(None, record)  # again: each node with its kernel
    except Exception as e:
        if host_raised(e):
            raise
        warn_once(f"kernels:{type(e).__name__}", "fxflops: kernels of graph %s not mapped "
                  "(%s: %s)", record.name, type(e).__name__, e)


def register_graph(graph_plan: GraphPlan, name: str, meta: dict[str, Any],
              gm: torch.fx.GraphModule | None) -> GraphRecord:
    """Register the graph, note the process's device and dtype (MFU's peak), and dump the
    annotated graph when ``gm`` is given."""
    record = attach(recorder()).register(name, graph_plan.cost, graph_plan.static_size, meta)
    _describe_process(graph_plan)
    if gm is not None:
        _dump(gm, record)
    return record


def register_uninstrumented(name: str, reason: str) -> UninstrumentedGraph:
    """Register a graph that runs uninstrumented, and why (``name`` may hold ``{index}``)."""
    return attach(recorder()).register_uninstrumented(name, reason)


def _describe_process(graph_plan: GraphPlan) -> None:
    info = recorder().info
    if "device" not in info:
        try:
            info["device"] = device_name(graph_plan.device)
        except Exception:  # (an artifact loaded where its device is not)
            info["device"] = graph_plan.device
    # MFU's peak is the one of the dtype the matmuls ran in
    dtype = DTYPE_NAMES.get(graph_plan.cost.matmul_dtype or "")
    if dtype and "dtype" not in info:
        info["dtype"] = dtype


def _dump(gm: torch.fx.GraphModule | None, record: GraphRecord) -> None:
    try:
        from fxflops.outputs.dumps import dump_graph

        dump_graph(gm, record)
    except Exception as e:
        # one warning for the dumps, here or at a flush (outputs.dumps.SizeDumps)
        warn_once(f"dumps:{type(e).__name__}", "fxflops: no graph dumps (graph %s: %s: %s)",
                  record.name, type(e).__name__, e)


