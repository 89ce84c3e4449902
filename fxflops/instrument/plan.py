"""Planning a graph's instrumentation: its cost analysed (``GraphPlan``, picklable so it
travels with an artifact) against the layers its model's integration describes (the layer
sources), and the device whose clock will time it. Registering the planned graph is
``registration``'s; mapping its kernels, ``kernel_maps``'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fxflops.cost.analysis import analysis_version, analyze
from fxflops.cost.binder import static_size
from fxflops.cost.graph_cost import GraphCost
from fxflops.cost.layer_check import LayerSpec
from fxflops.util import meta_value, warn_once

if TYPE_CHECKING:
    from fxflops.cost.kernels import KernelCost


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
