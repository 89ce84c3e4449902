"""The JSON report built from a recorder (``build_report``), and its rows as
``fxflops.recorder().stats()`` returns them (``recorder_rows``). Loading, validating and
merging reports are ``files``, ``schema`` and ``merge``'s."""

from __future__ import annotations

import os
import socket
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fxflops.cost.graph_cost import Count, Rollup
from fxflops.peaks.devices import process_peak
from fxflops.placement import placement
from fxflops.recording.size_stats import SizeStats
from fxflops.report.engine import engine_section
from fxflops.report.figures import (
    forward_cost,
    forward_costs,
    forward_graphs,
    graph_rows,
    kernel_figures,
    padding_figures,
    row_figures,
    sorted_rows,
)
from fxflops.report.rows import flat_rows
from fxflops.report.schema import SCHEMA, GraphRow, PeakFigures, RowFigures

if TYPE_CHECKING:
    from fxflops.cost.binder import SymbolSource
    from fxflops.recording.recorder import Recorder
    from fxflops.recording.store import GraphRecord


# --- building ---------------------------------------------------------------------------


def _count(c: Count) -> int | str:
    return c if isinstance(c, int) else str(c)


def symbol_source(named: SymbolSource) -> dict[str, Any]:
    """A size symbol as the report says it: the symbol, its origin in the user's names, and
    the raw parts (Dynamo's source, the graph's own input and dimension)."""
    return {"symbol": named.symbol, "where": named.where, "source": named.source,
            "input": named.input, "dim": named.dim}


def process_info(info: dict[str, Any]) -> dict[str, Any]:
    import torch

    vllm = sys.modules.get("vllm")
    ranks = placement(info)
    return {
        "pid": os.getpid(), "host": socket.gethostname(), "rank": ranks.get("rank"),
        # data, pipeline and tensor parallelism, node (see fxflops.placement)
        "ranks": ranks,
        "device": info.get("device"), "dtype": info.get("dtype"),
        "torch": torch.__version__, "vllm": getattr(vllm, "__version__", None),
        "argv": sys.argv[:8],
        # an engine integration's features off here (vLLM's: integrations.vllm.features)
        **({"features_off": dict(info["features_off"])} if info.get("features_off") else {}),
    }


def _rollups(rollups: dict[str, Rollup], limit: int = 50) -> list[dict[str, Any]]:
    return [{"name": k, "flops": _count(r.flops), "matmul_flops": _count(r.matmul_flops),
             "bytes": _count(r.bytes), "nodes": r.count}
            for k, r in list(rollups.items())[:limit]]


_SUMMARIES: weakref.WeakKeyDictionary[GraphRecord, dict[str, Any]] = weakref.WeakKeyDictionary()
_FLOPS_AT: weakref.WeakKeyDictionary[Recorder, tuple[int, dict[int, int | None]]] = \
    weakref.WeakKeyDictionary()


def _general_flops(rec: Recorder) -> Callable[[int], int | None]:
    """FLOPs of one forward at ``n`` tokens by the general graphs (those with size symbols,
    every symbol bound to ``n``: vLLM's token count); None without such graphs."""
    records = rec.graphs_snapshot()
    general = [g.cost for g in forward_graphs(rec) if g.cost.symbols]
    graphs, cache = _FLOPS_AT.get(rec, (0, {}))  # kept across flushes while no graph is added
    if graphs != len(records):
        cache = {}
        _FLOPS_AT[rec] = (len(records), cache)

    def flops_at(n: int) -> int | None:
        if n not in cache:
            cache[n] = sum(c.at(n).flops for c in general) if general else None
        return cache[n]

    return flops_at


def graph_summary(g: GraphRecord) -> dict[str, Any]:
    """What a report says of a graph apart from its rows (it never changes: made once)."""
    summary = _SUMMARIES.get(g)
    if summary is None or (g.kernels and "kernels" not in summary):  # mapped since
        c = g.cost
        summary = _SUMMARIES[g] = {
            "id": g.id, "name": g.name, "fingerprint": c.fingerprint(), "nodes": c.num_nodes,
            "meta": g.meta, "symbols": [str(s) for s in c.symbols],
            # what each symbol is, in their order (``s70 = input_ids.size(1)``: "where")
            "symbol_sources": [symbol_source(s) for s in c.symbol_sources],
            "flops": _count(c.flops), "matmul_flops": _count(c.matmul_flops),
            "bytes_io": _count(c.bytes_io), "bytes_nodes": _count(c.bytes_nodes),
            "runtime_ops": sorted({f"{n.runtime}:{n.op}" for n in c.runtime_nodes}),
            "by_op": _rollups(c.by_op()), "by_module": _rollups(c.by_module()),
            "uncounted": c.uncounted,
            # the safety net: layers checked against their own sizes, and those counted
            # from them because no formula counted their ops right
            "layers": {"checked": c.layers_checked, "estimated": [
                {"layer": e.layer, "type": e.type_name, "kind": e.kind, "ops": list(e.ops),
                 "flops": _count(e.flops)} for e in c.estimated]},
        }
        if g.kernels:  # the kernels Inductor made of it, each with its nodes and costs
            summary["kernels"] = [
                {"kernel": k.name, "order": k.order, "extern": k.extern, "nodes": list(k.nodes),
                 "flops": _count(k.flops), "matmul_flops": _count(k.matmul_flops),
                 "bytes": _count(k.bytes)} for k in g.kernels]
    return summary


def forward_figures_of(rec: Recorder, peak: PeakFigures | dict[str, Any],
                       workload: str = "target") -> Callable[[SizeStats], RowFigures]:
    """A whole-forward row's figures: its graphs' cost at its size, its padding (a
    drafter pass's, ``workload="draft"``: its graphs', no padding)."""
    costs = forward_costs(rec, workload)
    if workload == "draft":
        return lambda r: row_figures(r, peak, forward_cost(costs, r))
    flops_at = _general_flops(rec)

    def forward_figures(r: SizeStats) -> RowFigures:
        fig: RowFigures = {**row_figures(r, peak, forward_cost(costs, r)),
                           **padding_figures(r, flops_at)}
        return fig

    return forward_figures


def recorder_rows(rec: Recorder) -> list[GraphRow]:
    """Per graph and size: calls, median, FLOPs, rates (what the report's rows say, with
    the graph's name and id)."""
    peak = process_peak(rec.info)
    return [row for g in rec.graphs_snapshot() for row in graph_rows(g, peak)]


def build_report(rec: Recorder) -> dict[str, Any]:
    peak = process_peak(rec.info)
    records = rec.graphs_snapshot()
    passes = rec.backward_passes.by_size

    def graph_row(g: GraphRecord, r: SizeStats) -> RowFigures:
        fig = row_figures(r, peak)
        if g.kernels and r is not g.overflow:
            fig = {**fig, **kernel_figures(g, r, fig, peak)}
        if g.meta.get("phase") != "backward":
            return fig
        # the process's backward passes at this size: what a step's figures divide by
        return {**fig, "backward_passes": passes.get(r.size, 0)}

    graphs = [{**graph_summary(g), "dropped_sizes": g.dropped_sizes,
               "rows": [graph_row(g, r) for r in sorted_rows(g.all_rows())],
               **_warmup(g.warmup_rows(), lambda r: row_figures(r, peak))}
              for g in records]
    forward_figures = forward_figures_of(rec, peak)
    forward = [forward_figures(r) for r in sorted_rows(rec.forwards_snapshot())]
    import hashlib

    model = hashlib.sha1(",".join(sorted(g["fingerprint"] for g in graphs)).encode())
    run = {"id": rec.run_id, "started": rec.started, "fingerprint": model.hexdigest()[:12]}
    data: dict[str, Any] = {
            "schema": SCHEMA, "run": run, "process": process_info(rec.info), "peak": peak,
            "graphs": graphs, "forward": forward,
            **{f"forward_{k}": v for k, v in _warmup(rec.warmup_forwards_snapshot(),
                                                     forward_figures).items()},
            # graphs that run as compiled, uncounted: why, and their calls
            "uninstrumented": [{"name": u.name, "reason": u.reason, "calls": u.calls}
                               for u in list(rec.uninstrumented)]}
    timing = sys.modules.get("fxflops.recording.cuda_events")
    drafts = sorted_rows(rec.forwards_snapshot("draft"))
    if drafts:  # a speculative decoder's drafter passes, apart from the target's forwards
        draft_figures = forward_figures_of(rec, peak, "draft")
        data["draft_forward"] = [draft_figures(r) for r in drafts]
    if timing is not None:  # CUDA events: what is still in flight as this is written
        data["timing"] = timing.status()
    engine = engine_section(rec, forward)
    if engine is not None:  # what the serving engine says of its steps (vLLM's estimate)
        data["engine"] = engine
    if rec.collectives:  # outside the graphs (FSDP2's): apart from the graphs' bytes
        data["collectives"] = {kind: {"calls": calls, "bytes": nbytes}
                               for kind, (calls, nbytes) in sorted(rec.collectives.items())}
    if any(g.meta.get("phase") == "backward" for g in records):
        from fxflops.report.steps import training_steps

        data["steps"] = training_steps(flat_rows([data]), peak)
    return data


def _warmup(phases: dict[str, list[SizeStats]], figures: Callable[[SizeStats], RowFigures]
            ) -> dict[str, list[RowFigures]]:
    """``{"warmup": rows}``, each row marked with its phase (vLLM's profile run, warm-up
    compiles, CUDA-graph capture: not traffic, left out of every table by default); ``{}``
    without any."""
    rows: list[RowFigures] = [{**figures(r), "warmup": phase}
                              for phase, phase_rows in sorted(phases.items())
                              for r in sorted_rows(phase_rows)]
    return {"warmup": rows} if rows else {}


# --- loading ----------------------------------------------------------------------------


