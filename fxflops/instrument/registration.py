"""A planned graph registered with the process's recorder (its outputs attached then:
``outputs.session.attach``), the process's device and dtype noted (the peak MFU is read
against), and the annotated graph dumped.
"""

from __future__ import annotations

from typing import Any

import torch

from fxflops.instrument.plan import GraphPlan
from fxflops.outputs.session import attach
from fxflops.peaks.devices import DTYPE_NAMES, device_name
from fxflops.recording.recorder import recorder
from fxflops.recording.store import GraphRecord, UninstrumentedGraph
from fxflops.util import warn_once


def register_graph(graph_plan: GraphPlan, name: str, meta: dict[str, Any],
              gm: torch.fx.GraphModule | None) -> GraphRecord:
    """Register the graph, note the process's device and dtype (MFU's peak), and dump the
    annotated graph when ``gm`` is given."""
    record = attach(recorder()).register(name, graph_plan.cost, graph_plan.static_size, meta)
    _describe_process(graph_plan)
    if gm is not None:
        dump(gm, record)
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


def dump(gm: torch.fx.GraphModule | None, record: GraphRecord) -> None:
    try:
        from fxflops.outputs.dumps import dump_graph

        dump_graph(gm, record)
    except Exception as e:
        # one warning for the dumps, here or at a flush (outputs.dumps.SizeDumps)
        warn_once(f"dumps:{type(e).__name__}", "fxflops: no graph dumps (graph %s: %s: %s)",
                  record.name, type(e).__name__, e)
