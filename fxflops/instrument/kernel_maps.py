"""Kernel maps: each node of a graph mapped to the Inductor kernel it ran in (from the
provenance mapping Inductor emits while it compiles), and the setting that asks for them
and for profiling N calls per size (``backend(kernels=N)``, ``FXFLOPS_KERNELS``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from fxflops import config
from fxflops.cost import kernels as kernel_costs
from fxflops.instrument.plan import GraphPlan
from fxflops.instrument.registration import dump
from fxflops.recording.store import GraphRecord
from fxflops.util import host_raised, warn_once

if TYPE_CHECKING:
    from fxflops.cost.kernels import Shape


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
        dump(None, record)  # again: each node with its kernel
    except Exception as e:
        if host_raised(e):
            raise
        warn_once(f"kernels:{type(e).__name__}", "fxflops: kernels of graph %s not mapped "
                  "(%s: %s)", record.name, type(e).__name__, e)
