"""The JSON report: one file per process (rank), written atomically; load, validate, merge."""

from __future__ import annotations

import json
import math
import os
import socket
import stat
import sys
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from fxflops.cost import CostAt, Count, Rollup
from fxflops.placement import FIELDS as PLACEMENT_FIELDS
from fxflops.placement import place_of, placement
from fxflops.stats import SizeStats, parse_size, throughput
from fxflops.util import atomic_text

if TYPE_CHECKING:
    from fxflops.recording import GraphRecord, Recorder

SCHEMA = "fxflops.report/1"


class ReportError(ValueError):
    """A report that cannot be read: the message is one line for the user."""


# --- building ---------------------------------------------------------------------------


def _count(c: Count) -> int | str:
    return c if isinstance(c, int) else str(c)


def process_rank(info: dict[str, Any] | None = None) -> int | None:
    """This process's global rank (``placement``), None outside a parallel job."""
    return placement(info or {}).get("rank")


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
    }


def report_filename(info: dict[str, Any]) -> str:
    rank = process_rank(info)
    suffix = f"-rank{rank}" if rank is not None else ""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{suffix}.json"


STARTED = ".started"


def started_filename() -> str:
    """This process's started-file (see ``session``): a report that never came is named."""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{STARTED}"


def _rollups(rollups: dict[str, Rollup], limit: int = 50) -> list[dict[str, Any]]:
    return [{"name": k, "flops": _count(r.flops), "matmul_flops": _count(r.matmul_flops),
             "bytes": _count(r.bytes), "nodes": r.count}
            for k, r in list(rollups.items())[:limit]]


# this module's caches, beside the store's objects (which know nothing of reports)
_FIGURES: weakref.WeakKeyDictionary[SizeStats, tuple[Any, dict[str, Any]]] = \
    weakref.WeakKeyDictionary()
_SUMMARIES: weakref.WeakKeyDictionary[GraphRecord, dict[str, Any]] = weakref.WeakKeyDictionary()
_FLOPS_AT: weakref.WeakKeyDictionary[Recorder, tuple[int, dict[int, int | None]]] = \
    weakref.WeakKeyDictionary()
# a row's kernels' static figures (evaluated once per size)
_KERNELS_AT: weakref.WeakKeyDictionary[SizeStats, list[dict[str, Any]]] = \
    weakref.WeakKeyDictionary()


def row_figures(row: SizeStats, peak: dict[str, Any], cost: CostAt | None = None
                ) -> dict[str, Any]:
    """A row's figures (a whole forward's row: with its ``cost``, see ``forward_costs``);
    recomputed only when the row changed since they were last made (a flush of thousands
    of sizes redoes only those that ran since the last one)."""
    cost = cost or row.cost
    stamp = (row.count, row.samples_taken, row.lost, row.runtime_calls, cost,
             peak.get("tflops"), peak.get("gbps"))
    cached = _FIGURES.get(row)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    pct = row.percentiles()
    calls = row.runtime_calls
    runtime_flops = row.runtime_flops / calls if calls else 0
    runtime_bytes = row.runtime_bytes / calls if calls else 0
    flops = (cost.flops if cost else 0) + runtime_flops
    matmul = (cost.matmul_flops if cost else 0) + runtime_flops
    bytes_io = (cost.bytes_io if cost else 0) + int(runtime_bytes)
    fig: dict[str, Any] = {
        "size": row.size, "key": list(row.key), "calls": row.count,
        # calls timed (CUDA events time a call after it is counted), and calls whose time
        # never came (dropped past the in-flight cap, or a replay read too late)
        "timed_calls": row.samples_taken, "lost_samples": row.lost,
        "total_ms": row.total_ns / 1e6, **pct,
        "flops": int(flops), "matmul_flops": int(matmul), "runtime_flops": int(runtime_flops),
        "runtime_bytes": int(runtime_bytes),
        "bytes_io": bytes_io, "bytes_nodes": cost.bytes_nodes if cost else 0,
        "gflops": flops / 1e9,
        "recomputed_flops": cost.recomputed_flops if cost else 0,
        "recomputed_matmul_flops": cost.recomputed_matmul_flops if cost else 0,
        # of matmul_flops, what layers' sizes gave (ops no formula counted right)
        "estimated_flops": cost.estimated_flops if cost else 0,
    }
    fig["total_flops"], fig["total_matmul_flops"], fig["total_bytes"], _ = row.totals(cost)
    fig.update(throughput(flops, matmul, bytes_io, pct["median_ms"] / 1e3,
                          peak.get("tflops"), peak.get("gbps"), fig["recomputed_matmul_flops"]))
    _FIGURES[row] = (stamp, fig)
    return fig


def kernel_figures(g: GraphRecord, row: SizeStats, fig: dict[str, Any], peak: dict[str, Any]
                   ) -> dict[str, Any]:
    """A row's kernels (``fxflops.kernels``): FLOPs, matmul FLOPs and boundary bytes at its
    size (adding up to the row's FLOPs exactly: its run-time FLOPs go to the kernels that
    hold run-time nodes), and where profiled each kernel's median time, rates and roofline;
    with the profiled calls' median and what the kernels leave of it (the wrapper's)."""
    from fxflops.kernels import at_size, runtime_shares

    kernels = g.kernels or []
    static = _KERNELS_AT.get(row)
    if static is None:
        static = _KERNELS_AT[row] = at_size(kernels, dict(zip(g.cost.symbols, row.key)))
    runtime = runtime_shares(kernels, fig["runtime_flops"])
    prof = row.kernel_profile
    out = []
    for k, s, extra in zip(kernels, static, runtime):
        # (run-time FLOPs go only to kernels holding run-time nodes: ``runtime_shares``)
        entry = {**s, "flops": s["flops"] + extra, "matmul_flops": s["matmul_flops"] + extra}
        samples = prof.samples.get(k.name) if prof is not None else None
        if samples:
            entry["median_ms"] = median(samples) / 1e6
            entry.update(throughput(entry["flops"], entry["matmul_flops"], entry["bytes"],
                                    entry["median_ms"] / 1e3, peak.get("tflops"),
                                    peak.get("gbps"), 0))
        else:  # not timed: its intensity only
            entry["intensity"] = throughput(entry["flops"], 0, entry["bytes"], 0, None,
                                            None)["intensity"]
        out.append(entry)
    result: dict[str, Any] = {"kernels": out}
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
    return sorted(rows, key=lambda r: size_order(r.size))


def graph_rows(g: GraphRecord, peak: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"graph": g.name, "graph_id": g.id, **row_figures(r, peak)}
            for r in sorted_rows(g.all_rows())]


def forward_costs(rec: Recorder) -> dict[Any, CostAt]:
    """What a whole forward costs at each size: what its graphs cost at that size
    (attention, which runs outside piecewise graphs, is added per call from the forward's
    own run-time count)."""
    by_size: dict[Any, list[CostAt]] = {}
    for g in rec.graphs_snapshot():
        # a size's cost is the same in every phase: each graph's once per size
        of_graph = {r.size: r.cost for rows in (*g.warmup_rows().values(), g.all_rows())
                    for r in rows if r.cost is not None}
        for size, cost in of_graph.items():
            by_size.setdefault(size, []).append(cost)
    return {size: CostAt(*(sum(c[i] for c in costs) for i in range(len(CostAt._fields))))
            for size, costs in by_size.items()}


def forward_cost(costs: dict[Any, CostAt], row: SizeStats) -> CostAt:
    return costs.get(row.size) or CostAt(*([0] * len(CostAt._fields)))


def padding_figures(row: SizeStats, flops_at: Callable[[int], int | None]) -> dict[str, Any]:
    """What padding cost a whole-forward row: its forwards ran at the row's size with fewer
    tokens scheduled (vLLM pads a step up to the next CUDA-graph size). Token share exact;
    FLOPs share from the graphs' own cost at the scheduled sizes (``flops_at``; None when
    no graph is general enough to tell, and then in proportion to the tokens); the time
    spent on padding is the median apportioned by that FLOPs share (an estimate: a
    memory-bound step costs padding less)."""
    scheduled = row.scheduled or {}
    forwards, real = row.scheduled_tokens()
    size = row.key[0] if row.key else 0
    if not forwards or not size:
        return {"scheduled_tokens": 0, "padding_tokens": 0, "padding_share": 0.0,
                "padding_flops_share": 0.0, "padding_ms": 0.0, "scheduled": {},
                "captured": row.captured}
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
            "captured": row.captured}


def _general_flops(rec: Recorder) -> Callable[[int], int | None]:
    """FLOPs of one forward at ``n`` tokens by the general graphs (those with size symbols,
    every symbol bound to ``n``: vLLM's token count); None without such graphs."""
    records = rec.graphs_snapshot()
    general = [g.cost for g in records if g.cost.symbols]
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


def build_report(rec: Recorder) -> dict[str, Any]:
    peak = rec.peak()
    records = rec.graphs_snapshot()
    passes = rec.backward_passes.by_size

    def graph_row(g: GraphRecord, r: SizeStats) -> dict[str, Any]:
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
    costs = forward_costs(rec)
    flops_at = _general_flops(rec)

    def forward_figures(r: SizeStats) -> dict[str, Any]:
        return {**row_figures(r, peak, forward_cost(costs, r)), **padding_figures(r, flops_at)}

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
    if rec.collectives:  # outside the graphs (FSDP2's): apart from the graphs' bytes
        data["collectives"] = {kind: {"calls": calls, "bytes": nbytes}
                               for kind, (calls, nbytes) in sorted(rec.collectives.items())}
    if any(g.meta.get("phase") == "backward" for g in records):
        from fxflops.steps import training_steps

        data["steps"] = training_steps(flat_rows([data]), peak)
    return data


def _warmup(phases: dict[str, list[SizeStats]], figures: Callable[[SizeStats], dict[str, Any]]
            ) -> dict[str, list[dict[str, Any]]]:
    """``{"warmup": rows}``, each row marked with its phase (vLLM's profile run, warm-up
    compiles, CUDA-graph capture: not traffic, left out of every table by default); ``{}``
    without any."""
    rows = [{**figures(r), "warmup": phase} for phase, phase_rows in sorted(phases.items())
            for r in sorted_rows(phase_rows)]
    return {"warmup": rows} if rows else {}


def run_id(report: dict[str, Any]) -> str:
    """The run a report belongs to (reports from before run ids: one run per file)."""
    run = report.get("run") or {}
    return str(run.get("id") or report.get("_path", "?"))


def write_atomic(data: dict[str, Any], path: str | os.PathLike[str]) -> str:
    # compact: json's C encoder (indenting takes its pure-Python path, several times
    # slower on a report of thousands of sizes, and it runs beside the host's work)
    return atomic_text(json.dumps(data, separators=(",", ":"), default=str), path)


# --- loading ----------------------------------------------------------------------------


# a report of every size of a large piecewise model is tens of MB; past this, it is none
MAX_REPORT_BYTES = 512 << 20
# Every number in a report is a count, a time, FLOPs, bytes, or a rate or share of them:
# never negative, never NaN or infinite, and far below 1e30 (a year at an exaFLOP/s is
# 3e25 FLOPs). Past that, a number is damage, and the CLI's sums, products and float
# conversions of it would overflow.
MAX_NUMBER = 10**30
# a size is a tensor dimension (or, for ``BxS``, a product of them): an int64
MAX_SIZE = 2**63 - 1
_LIMITS = {MAX_NUMBER: "1e30", MAX_SIZE: "2**63-1 (a size)"}

_NUMBER = (int, float)
_MAYBE_NUMBER = (int, float, type(None))
_MAYBE_STR = (str, type(None))
_MAYBE_INT = (int, type(None))
_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "size": (int, str), "calls": (int,), "total_ms": _NUMBER, "median_ms": _NUMBER,
    "p90_ms": _NUMBER, "flops": _NUMBER, "matmul_flops": _NUMBER, "runtime_flops": _NUMBER,
    "bytes_io": _NUMBER,
}
_ROW_OPTIONAL: dict[str, tuple[type, ...]] = {
    "key": (list,), "p10_ms": _NUMBER, "bytes_nodes": _NUMBER, "gflops": _NUMBER,
    "tflops": _MAYBE_NUMBER, "gbps": _MAYBE_NUMBER, "mfu": _MAYBE_NUMBER, "hfu": _MAYBE_NUMBER,
    "intensity": _MAYBE_NUMBER, "bound": _MAYBE_STR, "roofline_ms": _MAYBE_NUMBER,
    "roofline_share": _MAYBE_NUMBER, "runtime_bytes": _NUMBER,
    "recomputed_flops": _NUMBER, "recomputed_matmul_flops": _NUMBER,
    "total_flops": _NUMBER, "total_matmul_flops": _NUMBER, "total_bytes": _NUMBER,
    "scheduled_tokens": _NUMBER, "padding_tokens": _NUMBER, "padding_share": _NUMBER,
    "padding_flops_share": _NUMBER, "padding_ms": _NUMBER, "scheduled": (dict,),
    "captured": (int,), "timed_calls": (int,), "lost_samples": (int,),
    "estimated_flops": _NUMBER, "backward_passes": (int,), "kernels": (list,),
    "kernels_profile": (dict,),
    "collective_bytes_total": (int,),
    # what flat_rows and the CLI add to a row: a row's own would override them, so they
    # must be what the CLI groups by and prints (hashable, text)
    "graph": (str,), "graph_id": (int,), "run": (str,), "rank": (int, str, type(None)),
    "pid": _MAYBE_INT, "fingerprint": _MAYBE_STR, "phase": _MAYBE_STR,
    "source": _MAYBE_STR, "frame": (int, str, type(None)), "ranks": (int,), "piece": _MAYBE_INT,
    "outside_share": _MAYBE_NUMBER, "graphs_ms": _NUMBER, "place": (str,), "stage": (str,),
    "warmup": (str,), **{f: _MAYBE_INT for f in PLACEMENT_FIELDS if f != "rank"},
}
_GRAPH_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "rows": (list,)}
_GRAPH_OPTIONAL: dict[str, tuple[type, ...]] = {
    "meta": (dict,), "symbols": (list,), "uncounted": (dict,), "dropped_sizes": (int,),
    "fingerprint": (str,), "id": (int,), "nodes": (int,),
    # an int for a static graph, else the expression of its size symbols
    "flops": (int, str), "matmul_flops": (int, str), "bytes_io": (int, str),
    "bytes_nodes": (int, str), "runtime_ops": (list,), "by_op": (list,), "by_module": (list,),
    "layers": (dict,), "warmup": (list,), "kernels": (list,)}
_LAYERS_OPTIONAL: dict[str, tuple[type, ...]] = {"checked": (int,), "estimated": (list,)}
_UNINSTRUMENTED_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "reason": (str,), "calls": (int,)}
_ESTIMATED_FIELDS: dict[str, tuple[type, ...]] = {
    "layer": (str,), "ops": (list,), "flops": (int, str)}
# the meta fields the CLI reads (steps group by frame, tune by compile size)
_GRAPH_META: dict[str, tuple[type, ...]] = {
    "phase": _MAYBE_STR, "source": _MAYBE_STR, "frame": (int, str, type(None)),
    "compile_size": _MAYBE_INT, "piece": _MAYBE_INT}
_PROCESS_OPTIONAL: dict[str, tuple[type, ...]] = {
    "pid": _MAYBE_INT, "rank": (int, str, type(None)), "host": _MAYBE_STR, "ranks": (dict,)}
_RUN_OPTIONAL: dict[str, tuple[type, ...]] = {
    "id": _MAYBE_STR, "started": _MAYBE_NUMBER, "fingerprint": _MAYBE_STR}
_PEAK_OPTIONAL: dict[str, tuple[type, ...]] = {
    "tflops": _MAYBE_NUMBER, "gbps": _MAYBE_NUMBER, "source": _MAYBE_STR}
# numbers bounded as sizes, not as counts
_SIZE_FIELDS = frozenset({"size", "compile_size"})


def _show(value: Any) -> str:
    """A value, short enough for a one-line message."""
    if isinstance(value, int) and abs(value) > MAX_NUMBER:
        return f"a {int(math.log10(abs(value))) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_count(value: Any, low: int = 0, high: int = MAX_NUMBER) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number_problem(value: float, limit: int) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value!r}: not a finite number"
    if value < 0:
        return f"is {_show(value)}: negative (no count, time, FLOPs or bytes is)"
    if value > limit:
        return f"is {_show(value)}: more than {_LIMITS[limit]}"
    return None


def _size_label_problem(size: str) -> str | None:
    """A ``BxS`` label must parse as ``stats.parse_size`` reads it (ASCII digits, whose
    product is a size); any other label ("overflow", "static") is only shown."""
    parts = size.split("x")
    if not all(p.isdigit() for p in parts):
        return None
    problem = f"is {_show(size)}: not a size (ASCII digits, product at most 2**63-1)"
    if not all(p.isascii() and len(p) <= 19 for p in parts):
        return problem
    numbers = [int(p) for p in parts]
    if 0 in numbers:
        return None
    product = 1
    for n in numbers:
        product *= n
        if product > MAX_SIZE:  # stop early: thousands of parts must not build a huge int
            return problem
    return None


def _key_problem(key: list[Any]) -> str | None:
    bad = [k for k in key if not _is_count(k, 0, MAX_SIZE)]
    return f"holds {_show(bad[0])}: expected sizes (whole numbers from 0)" if bad else None


def _scheduled_problem(scheduled: dict[Any, Any]) -> str | None:
    """Forwards per scheduled token count (``{"3": 5}``): both at least 1 (tune divides
    by them)."""
    for tokens, forwards in scheduled.items():
        text = str(tokens)  # int() of thousands of digits would raise: length first
        if not (text.isascii() and text.isdigit() and len(text) <= 19
                and _is_count(int(text), 1, MAX_SIZE) and _is_count(forwards, 1)):
            return (f"holds {_show(tokens)}: {_show(forwards)}: expected token counts and "
                    "forwards, whole numbers from 1")
    return None


def _uncounted_problem(uncounted: dict[Any, Any]) -> str | None:
    bad = next((k for k, v in uncounted.items() if not _is_count(v)), None)
    return None if bad is None else (
        f"holds {_show(bad)}: {_show(uncounted[bad])}: expected a count of calls")


# what a field holds, past its type
_CONTENTS: dict[str, Callable[[Any], str | None]] = {
    "size": _size_label_problem, "key": _key_problem, "scheduled": _scheduled_problem,
    "uncounted": _uncounted_problem}


def _value_problem(field: str, value: Any) -> str | None:
    if isinstance(value, _NUMBER):
        return _number_problem(value, MAX_SIZE if field in _SIZE_FIELDS else MAX_NUMBER)
    check = _CONTENTS.get(field)
    return check(value) if check is not None else None


def _check(obj: Any, where: str, required: dict[str, tuple[type, ...]],
           optional: dict[str, tuple[type, ...]]) -> None:
    """Types, then values (finite, in range, never negative) of an object's fields."""
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: not an object")
    for fields, needed in ((required, True), (optional, False)):
        for field, types in fields.items():
            if field not in obj:
                if needed:
                    raise ReportError(f"{where}: no '{field}'")
                continue
            value = obj[field]
            if isinstance(value, bool) or not isinstance(value, types):
                raise ReportError(f"{where}: '{field}' is {type(value).__name__}, expected "
                                  + " or ".join(t.__name__ for t in types))
            problem = _value_problem(field, value)
            if problem is not None:
                raise ReportError(f"{where}: '{field}' {problem}")


def validate(data: Any, where: str) -> None:
    """Types, values and required fields of a report, its graphs and rows; one line if
    wrong. What passes, the CLI can sum, divide, format and group without failing."""
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("fxflops.report/"):
        raise ReportError(f"{where}: not an fxflops report (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise ReportError(f"{where}: report schema {data['schema'][:60]} is not {SCHEMA}")
    _check(data, where, {"process": (dict,), "graphs": (list,), "forward": (list,)},
           {"run": (dict,), "peak": (dict,), "steps": (list,), "uninstrumented": (list,),
            "forward_warmup": (list,), "collectives": (dict,)})
    for kind, v in (data.get("collectives") or {}).items():
        _check(v, f"{where}: collectives.{kind}", {"calls": (int,), "bytes": (int,)}, {})
    for i, u in enumerate(data.get("uninstrumented") or []):
        _check(u, f"{where}: uninstrumented[{i}]", _UNINSTRUMENTED_FIELDS, {})
    _check(data["process"], f"{where}: process", {}, _PROCESS_OPTIONAL)
    if "ranks" in data["process"]:
        _check(data["process"]["ranks"], f"{where}: process.ranks", {},
               {f: (int,) for f in PLACEMENT_FIELDS})
    for part, fields in (("run", _RUN_OPTIONAL), ("peak", _PEAK_OPTIONAL)):
        if part in data:
            _check(data[part], f"{where}: {part}", {}, fields)
    for i, g in enumerate(data["graphs"]):
        _check(g, f"{where}: graphs[{i}]", _GRAPH_FIELDS, _GRAPH_OPTIONAL)
        if "meta" in g:
            _check(g["meta"], f"{where}: graphs[{i}].meta", {}, _GRAPH_META)
        if "layers" in g:
            _check(g["layers"], f"{where}: graphs[{i}].layers", {}, _LAYERS_OPTIONAL)
            for k, e in enumerate(g["layers"].get("estimated", [])):
                _check(e, f"{where}: graphs[{i}].layers.estimated[{k}]", _ESTIMATED_FIELDS, {})
        for part in ("rows", "warmup"):
            for j, r in enumerate(g.get(part, [])):
                _check(r, f"{where}: graphs[{i}].{part}[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)
    for part in ("forward", "forward_warmup"):
        for j, r in enumerate(data.get(part, [])):
            _check(r, f"{where}: {part}[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)


def _too_large(p: Path) -> ReportError:
    return ReportError(f"{p}: larger than {MAX_REPORT_BYTES >> 20} MiB: not a report")


def _check_file(p: Path) -> None:
    """Refuse, from its metadata alone, what is no report: a folder; a FIFO or a device
    (reading would block, or never end); a file past the size cap (refused unread)."""
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ReportError(f"{p}: no such file") from None
    except OSError as e:
        raise ReportError(f"{p}: cannot read: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ReportError(f"{p}: is a folder (pass it to load_reports)")
    if not stat.S_ISREG(st.st_mode):
        raise ReportError(f"{p}: not a regular file")
    if st.st_size > MAX_REPORT_BYTES:
        raise _too_large(p)


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file fxflops may read: a regular file, under the size cap, valid JSON."""
    p = Path(path)
    _check_file(p)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)  # it may have grown since it was looked at
    except OSError as e:
        raise ReportError(f"{p}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_REPORT_BYTES:
        raise _too_large(p)
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise ReportError(f"{p}: empty file")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "too deep"
        raise ReportError(f"{p}: not valid JSON (truncated?): {msg}") from None
    except ValueError:  # an integer past Python's digit limit for conversions
        raise ReportError(f"{p}: not valid JSON: a number too long to read") from None


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one report file; a ReportError says in one line what is wrong."""
    data = read_json(path)
    validate(data, str(path))
    data["_path"] = str(path)
    return data


def is_export(data: Any) -> bool:
    """What fxflops writes beside reports that is not one: ``report --json`` rows (a list),
    or another fxflops schema."""
    return isinstance(data, list) or (
        isinstance(data, dict) and str(data.get("schema", "")).startswith("fxflops.")
        and not str(data["schema"]).startswith("fxflops.report/"))


def load_reports(paths: Iterable[str | os.PathLike[str]],
                 skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Files, or folders of ``*.json`` reports (non-recursive, ``graphs/`` dumps skipped).

    A folder is read file by file: with ``skipped`` given, a bad file in it is listed there
    (one line each) and the good ones are still returned; without, the first bad one
    raises. So is a process that started recording there (its started-file) and wrote no
    report (killed before its first flush). Exports fxflops wrote there (``report --json``)
    are not reports and are passed over. A file named on its own must be a good report.
    """
    reports = []
    for path in paths:
        p = Path(path)
        if not p.is_dir():
            reports.append(load_report(p))
            continue
        files = sorted(f for f in p.glob("*.json") if not f.name.startswith("."))
        found = 0
        for f in files:
            try:
                data = read_json(f)
                if is_export(data):
                    continue
                found += 1
                validate(data, str(f))
                data["_path"] = str(f)
                reports.append(data)
            except ReportError as e:
                if skipped is None:
                    raise
                skipped.append(str(e))
        if not found:
            raise ReportError(f"{p}: no report files (*.json) in this folder")
        if skipped is not None:
            skipped += _missing_reports(p, reports)
    if not reports:
        raise ReportError("no readable report among " + ", ".join(map(str, paths)))
    return _latest_per_process(reports)


def _missing_reports(folder: Path, reports: list[dict[str, Any]]) -> list[str]:
    """A line per process that started recording into ``folder`` and wrote no report."""
    written = {(r["process"].get("host"), r["process"].get("pid")) for r in reports}
    lines = []
    for f in sorted(folder.glob(f"*{STARTED}")):
        try:
            info = json.loads(f.read_text())
            key = (info.get("host"), info.get("pid"))
        except (OSError, ValueError, AttributeError):
            continue
        if key not in written:
            lines.append(f"{f}: process {key[1]} on {key[0]} started recording here and wrote "
                         "no report (killed before its first flush?)")
    return lines


def _latest_per_process(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per process: a copy saved elsewhere by the same process is not a rank."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rep in reports:
        p = rep["process"]
        key: tuple[Any, ...] = (run_id(rep), p.get("host"), p.get("pid"), p.get("rank"))
        if p.get("pid") is None:
            key = (rep["_path"],)
        old = latest.get(key)
        if old is None or os.path.getmtime(rep["_path"]) >= os.path.getmtime(old["_path"]):
            latest[key] = rep
    return list(latest.values())


def flat_rows(reports: list[dict[str, Any]], warmup: bool = False) -> list[dict[str, Any]]:
    """Every (graph, size) row of every report, tagged with its run, process and placement;
    with ``warmup``, the warm-up rows too (each with its ``warmup`` phase).

    The placement (``process.ranks``: ``dp``, ``pp``, ``tp``, their sizes, the node) is on
    every row, with ``place`` its short name (``pp1 tp0``), so that ``fxflops.merge`` can
    tell shards from stages from replicas. Graphs that share a name in one report are kept
    apart: the second is ``name#2``. Rows of a training step's graphs carry their ``phase``,
    ``source`` and ``frame``.
    """
    rows = []
    for rep in reports:
        proc = rep["process"]
        ranks = {k: v for k, v in (proc.get("ranks") or {}).items() if k != "rank"}
        tags = {"run": run_id(rep), "rank": proc.get("rank"), "pid": proc.get("pid"), **ranks,
                "place": place_of(proc)}
        if rep.get("collectives"):  # FSDP2's, outside the graphs (fxflops.steps per step)
            tags["collective_bytes_total"] = sum(v["bytes"] for v in rep["collectives"].values())
        seen: dict[str, int] = {}
        for g in rep["graphs"]:
            seen[g["name"]] = seen.get(g["name"], 0) + 1
            name = g["name"] if seen[g["name"]] == 1 else f"{g['name']}#{seen[g['name']]}"
            meta = g.get("meta") or {}
            # a training graph's phase, the Dynamo graph it came from, the Python frame
            # (fxflops.autograd, fxflops.steps)
            origin = {k: meta[k] for k in ("phase", "source", "frame", "piece") if k in meta}
            for r in g["rows"] + (g.get("warmup", []) if warmup else []):
                rows.append({**tags, "graph": name, "fingerprint": g.get("fingerprint"),
                             **origin, **r})
        for r in rep["forward"] + (rep.get("forward_warmup", []) if warmup else []):
            rows.append({**tags, "graph": "<forward>", **r})
    return rows


