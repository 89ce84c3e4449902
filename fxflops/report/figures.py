"""What a row's numbers mean: achieved rates, MFU and HFU, the roofline verdict, padding
waste, each kernel's share, and a whole forward's cost from its graphs'. Cached per row
until the row changes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from statistics import median
from typing import TYPE_CHECKING, Any

from fxflops.cost.graph_cost import CostAt
from fxflops.recording.size_stats import NO_RUNTIME, SizeStats, parse_size
from fxflops.report.schema import (
    GraphRow,
    KernelFigures,
    Padding,
    PeakFigures,
    RowFigures,
    Throughput,
)

if TYPE_CHECKING:
    from fxflops.recording.recorder import Recorder
    from fxflops.recording.store import GraphRecord




def throughput(flops: float, matmul_flops: float, bytes_: float, seconds: float,
               peak_tflops: float | None, peak_gbps: float | None,
               recomputed_matmul_flops: float = 0) -> Throughput:
    """Achieved rates, MFU and HFU, and the roofline verdict.

    MFU is the model's matmul FLOPs (``matmul_flops`` less what was recomputed) against the
    peak; HFU all the matmul FLOPs that ran. They differ only where a backward graph
    recomputes forward work.
    """
    out: Throughput = {"tflops": None, "gbps": None, "mfu": None, "hfu": None,
                           "intensity": None, "bound": None, "roofline_ms": None,
                           "roofline_share": None}
    if bytes_:
        out["intensity"] = flops / bytes_
    if seconds <= 0:
        return out
    out["tflops"] = flops / seconds / 1e12
    out["gbps"] = bytes_ / seconds / 1e9
    if peak_tflops:
        out["mfu"] = (matmul_flops - recomputed_matmul_flops) / seconds / (peak_tflops * 1e12)
        out["hfu"] = matmul_flops / seconds / (peak_tflops * 1e12)
    if peak_tflops and peak_gbps:
        compute_s = flops / (peak_tflops * 1e12)
        memory_s = bytes_ / (peak_gbps * 1e9)
        out["bound"] = "compute" if compute_s >= memory_s else "memory"
        out["roofline_ms"] = max(compute_s, memory_s) * 1e3
        out["roofline_share"] = max(compute_s, memory_s) / seconds
    return out




# this module's caches, beside the store's objects (which know nothing of reports)
_FIGURES: weakref.WeakKeyDictionary[SizeStats, tuple[Any, RowFigures]] = \
    weakref.WeakKeyDictionary()


# a row's kernels' static figures (evaluated once per size)
_KERNELS_AT: weakref.WeakKeyDictionary[SizeStats, list[dict[str, Any]]] = \
    weakref.WeakKeyDictionary()


def row_figures(row: SizeStats, peak: PeakFigures | dict[str, Any],
                cost: CostAt | None = None) -> RowFigures:
    """A row's figures (a whole forward's row: with its ``cost``, see ``forward_costs``);
    recomputed only when the row changed since they were last made (a flush of thousands
    of sizes redoes only those that ran since the last one)."""
    cost = cost or row.cost
    runtime = row.runtime or NO_RUNTIME
    calls = runtime.calls
    stamp = (row.count, row.chosen, row.samples_taken, row.lost, calls, row.shared,
             cost,
             peak.get("tflops"), peak.get("gbps"))
    cached = _FIGURES.get(row)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    pct = row.percentiles()
    runtime_flops = runtime.flops / calls if calls else 0
    runtime_bytes = runtime.bytes / calls if calls else 0
    flops = (cost.flops if cost else 0) + runtime_flops
    matmul = (cost.matmul_flops if cost else 0) + runtime_flops
    bytes_io = (cost.bytes_io if cost else 0) + int(runtime_bytes)
    totals = row.totals(cost)
    recomputed_matmul = cost.recomputed_matmul_flops if cost else 0
    fig: RowFigures = {
        "size": row.size, "key": list(row.key), "calls": row.count,
        # calls chosen to be timed (every call of a size's first, then a sample; CUDA-graph
        # replays: FXFLOPS_REPLAY_SAMPLE_EVERY), those timed (CUDA events time a call after
        # it is counted: what the median rests on), and those whose time never came
        # (dropped past the in-flight cap, or a replay read too late): timed + lost = chosen
        # once nothing is in flight
        "chosen_calls": row.chosen, "timed_calls": row.samples_taken, "lost_samples": row.lost,
        "total_ms": row.total_ns / 1e6, "median_ms": pct["median_ms"],
        "p10_ms": pct["p10_ms"], "p90_ms": pct["p90_ms"],
        "flops": int(flops), "matmul_flops": int(matmul), "runtime_flops": int(runtime_flops),
        "runtime_bytes": int(runtime_bytes),
        # the run-time counts summed over the calls (exact; the per-call figures above are
        # their mean when calls at one size ran at different lengths)
        "total_runtime_flops": runtime.flops, "total_runtime_bytes": runtime.bytes,
        "bytes_io": bytes_io, "bytes_nodes": cost.bytes_nodes if cost else 0,
        "gflops": flops / 1e9,
        "recomputed_flops": cost.recomputed_flops if cost else 0,
        "recomputed_matmul_flops": recomputed_matmul,
        # of matmul_flops, what layers' sizes gave (ops no formula counted right)
        "estimated_flops": cost.estimated_flops if cost else 0,
        "total_flops": totals[0], "total_matmul_flops": totals[1], "total_bytes": totals[2],
        **throughput(flops, matmul, bytes_io, pct["median_ms"] / 1e3, peak.get("tflops"),
                     peak.get("gbps"), recomputed_matmul),
    }
    if row.on_device:  # timed by CUDA events: what paced the time, and whether it was shared
        fig["time_bound"] = "host" if 2 * row.host_bound > row.samples_taken else "device"
        fig["host_bound_calls"] = row.host_bound
        fig["shared_calls"] = row.shared
    if runtime.by_kind and calls:  # whole forwards: the run-time FLOPs by kind
        fig["runtime_kinds"] = {k: v / calls for k, v in sorted(runtime.by_kind.items())}
    _FIGURES[row] = (stamp, fig)
    return fig


def kernel_figures(g: GraphRecord, row: SizeStats, fig: RowFigures,
                   peak: PeakFigures | dict[str, Any]) -> KernelFigures:
    """A row's kernels (``fxflops.cost.kernels``): FLOPs, matmul FLOPs and boundary bytes at its
    size (adding up to the row's FLOPs exactly: its run-time FLOPs go to the kernels that
    hold run-time nodes), and where profiled each kernel's median time, rates and roofline;
    with the profiled calls' median and what the kernels leave of it (the wrapper's)."""
    from fxflops.cost.kernels import at_size, runtime_shares
    from fxflops.recording.kernel_profile import launches

    kernels = g.kernels or []
    static = _KERNELS_AT.get(row)
    if static is None:
        static = _KERNELS_AT[row] = at_size(kernels, dict(zip(g.cost.symbols, row.key)))
    runtime = runtime_shares(kernels, fig["runtime_flops"])
    prof = row.kernel_profile
    # each entry's own launch's times: a kernel the map holds twice is launched twice
    places = launches([k.name for k in kernels])
    out = []
    for s, extra, launch in zip(static, runtime, places):
        # (run-time FLOPs go only to kernels holding run-time nodes: ``runtime_shares``)
        entry = {**s, "flops": s["flops"] + extra, "matmul_flops": s["matmul_flops"] + extra}
        samples = prof.samples.get(launch) if prof is not None else None
        if samples:
            entry["median_ms"] = median(samples) / 1e6
            entry.update(throughput(entry["flops"], entry["matmul_flops"], entry["bytes"],
                                    entry["median_ms"] / 1e3, peak.get("tflops"),
                                    peak.get("gbps"), 0))
        else:  # not timed: its intensity only
            entry["intensity"] = throughput(entry["flops"], 0, entry["bytes"], 0, None,
                                            None)["intensity"]
        out.append(entry)
    result: KernelFigures = {"kernels": out}
    if prof is not None and prof.calls:
        # per call, its kernels' time is within the call's: the medians keep that order
        kernels_ms = median(prof.kernels_ns) / 1e6
        call_ms = median(prof.call_ns) / 1e6
        result["kernels_profile"] = {
            "calls": prof.calls, "median_ms": call_ms, "kernels_ms": kernels_ms,
            # what the kernels leave of the call: the wrapper's (argument checks, buffer
            # allocation, Python) and the profiler's own
            "overhead_ms": max(0.0, call_ms - kernels_ms), "unmatched": prof.unmatched,
            # the first calls' timelines (fxflops trace): each call's length, and its
            # kernels' start (from the profile's first event) and length
            "trace": [{"dur_us": call_ns / 1e3, "kernels": [
                {"kernel": name, "start_us": start / 1e3, "dur_us": ns / 1e3}
                for name, start, ns in found]} for call_ns, found in prof.trace]}
    return result


def size_order(size: Any) -> tuple[Any, ...]:
    """Numbers in order, then ``BxS`` sizes by their numbers, then other labels."""
    numbers = parse_size(size)
    if numbers is None:
        return (2, (str(size),))
    return (0 if len(numbers) == 1 and isinstance(size, int) else 1, numbers)


def sorted_rows(rows: Any) -> list[SizeStats]:
    """The rows with a call made, by size. A row is made as its first call starts (a
    whole forward's at the step's start) and counts the call as it ends: one whose first
    call is still running has nothing to report yet, and the Prometheus counters, which
    skip it too, agree with the report written at the same flush."""
    return sorted((r for r in rows if r.count), key=lambda r: size_order(r.size))


def graph_rows(g: GraphRecord, peak: PeakFigures | dict[str, Any]) -> list[GraphRow]:
    return [{"graph": g.name, "graph_id": g.id, **row_figures(r, peak)}
            for r in sorted_rows(g.all_rows())]


def forward_graphs(rec: Recorder, workload: str = "target") -> list[GraphRecord]:
    """The graphs a whole forward runs: the target's are all but a speculative decoder's
    drafter's (``workload: draft``), which run outside the target's forward; the
    drafter's pass (``workload="draft"``) runs those."""
    draft = workload == "draft"
    return [g for g in rec.graphs_snapshot() if (g.meta.get("workload") == "draft") == draft]


def forward_costs(rec: Recorder, workload: str = "target") -> dict[Any, CostAt]:
    """What a whole forward (the target's, or a drafter pass) costs at each size: what its
    graphs cost at that size (attention, which runs outside piecewise graphs, is added
    per call from the forward's own run-time count)."""
    by_size: dict[Any, list[CostAt]] = {}
    for g in forward_graphs(rec, workload):
        # a size's cost is the same in every phase: each graph's once per size
        of_graph = {r.size: r.cost for rows in (*g.warmup_rows().values(), g.all_rows())
                    for r in rows if r.cost is not None}
        for size, cost in of_graph.items():
            by_size.setdefault(size, []).append(cost)
    return {size: CostAt(*(sum(c[i] for c in costs) for i in range(len(CostAt._fields))))
            for size, costs in by_size.items()}


def forward_cost(costs: dict[Any, CostAt], row: SizeStats) -> CostAt:
    return costs.get(row.size) or CostAt(*([0] * len(CostAt._fields)))


def padding_figures(row: SizeStats, flops_at: Callable[[int], int | None]) -> Padding:
    """What padding cost a whole-forward row: its forwards ran at the row's size with fewer
    tokens scheduled (vLLM pads a step up to the next CUDA-graph size). Token share exact;
    FLOPs share from the graphs' own cost at the scheduled sizes (``flops_at``; None when
    no graph is general enough to tell, and then in proportion to the tokens); the time
    spent on padding is the median apportioned by that FLOPs share (an estimate: a
    memory-bound step costs padding less)."""
    # one snapshot (a C-level copy): the serving thread may add to the dict meanwhile
    forward = row.forward
    scheduled = dict(list(forward.scheduled.items())) if forward is not None else {}
    captured = forward.captured if forward is not None else 0
    forwards, real = sum(scheduled.values()), sum(n * c for n, c in scheduled.items())
    size = row.key[0] if row.key else 0
    if not forwards or not size:
        return {"scheduled_tokens": 0, "padding_tokens": 0, "padding_share": 0.0,
                "padding_flops_share": 0.0, "padding_ms": 0.0, "scheduled": {},
                "captured": captured}
    padding = forwards * size - real
    full = flops_at(size)
    if full:
        wasted = sum(c * (full - (flops_at(n) or 0)) for n, c in scheduled.items())
        flops_share = wasted / (forwards * full)
    else:
        flops_share = padding / (forwards * size)
    return {"scheduled_tokens": real, "padding_tokens": padding,
            "padding_share": padding / (forwards * size), "padding_flops_share": flops_share,
            "padding_ms": row.percentiles()["median_ms"] * flops_share,
            # the sizes served (what fxflops tune reads), and how many ran as graph replays
            "scheduled": {str(n): c for n, c in sorted(scheduled.items())},
            "captured": captured}


