"""``fxflops tune RUN`` and ``fxflops tune BASE SIZED``: which sizes to compile or capture.

One run (a report, or a folder of one run's ranks): the sizes it served, and the
``compile_sizes`` / ``cudagraph_capture_sizes`` that minimise the expected time per step for
that traffic within ``--max-sizes`` (``fxflops.report.tuning``).

Two runs or more, to confirm: a size is *specialised* in a run when a static graph (no size
symbols) ran at it; otherwise the general (dynamic) graph served it. For every size seen
both ways, the gain is the general median over the specialised one; sizes whose gain beats
the threshold are recommended, ranked by gain weighted by how often the size was called.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

from rich.table import Table

from fxflops.cli.args import non_negative_float, positive_int
from fxflops.cli.tables import fmt_pct, make_console
from fxflops.report.files import load_reports, run_id
from fxflops.report.schema import ReportError
from fxflops.report.tuning import Served, by_stage, layout, pipeline_served, served_sizes, traffic
from fxflops.report.tuning import recommend as recommend_one_run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="recommend compile and capture sizes from one run's "
                                    "traffic, or confirm them from runs with and without")
    p.add_argument("runs", nargs="+", help="one run's report or folder; or one per run, to "
                                           "compare them")
    p.add_argument("--max-sizes", type=positive_int, default=8,
                   help="one run: the most sizes to recommend (the budget)")
    p.add_argument("--threshold", type=non_negative_float, default=0.05,
                   help="several runs: minimum gain of the specialised graph, from 0 (0.05 = 5%%)")
    p.set_defaults(func=run)


def size_times(report_paths: list[str]) -> dict[str, dict[int, list[tuple[float, int]]]]:
    """{"general"|"specialised": {size: [(median ms, calls), ...]}} over all runs."""
    out: dict[str, dict[int, list[tuple[float, int]]]] = {
        "general": defaultdict(list), "specialised": defaultdict(list)}
    for path in report_paths:
        for rep in load_reports([path]):
            # symbols and meta are optional in a report (a graph without: no size symbols)
            static_sizes = {r["size"] for g in rep["graphs"] if not g.get("symbols")
                            for r in g["rows"] if isinstance(r["size"], int)}
            compile_sizes = ((g.get("meta") or {}).get("compile_size") for g in rep["graphs"])
            static_sizes |= {s for s in compile_sizes if s is not None}
            if rep["forward"]:
                timed = {r["size"]: (r["median_ms"], r["calls"]) for r in rep["forward"]}
            else:  # no whole-forward rows: sum the graphs' medians per size
                timed = {}
                for g in rep["graphs"]:
                    for r in g["rows"]:
                        if isinstance(r["size"], int):
                            ms, calls = timed.get(r["size"], (0.0, 0))
                            timed[r["size"]] = (ms + r["median_ms"], max(calls, r["calls"]))
            for size, (ms, calls) in timed.items():
                if isinstance(size, int):
                    kind = "specialised" if size in static_sizes else "general"
                    out[kind][size].append((ms, calls))
    return out


def recommend(times: dict[str, dict[int, list[tuple[float, int]]]],
              threshold: float) -> list[dict[str, Any]]:
    gen, spec = times["general"], times["specialised"]
    both = sorted(set(gen) & set(spec))
    if not both:
        raise ReportError("no size was run both with and without a specialised graph: "
                          "run once without compile_sizes and once with them")
    total_calls = sum(c for s in both for _, c in gen[s] + spec[s]) or 1
    rows = []
    for s in both:
        g = min(ms for ms, _ in gen[s])
        sp = min(ms for ms, _ in spec[s])
        calls = sum(c for _, c in gen[s] + spec[s])
        gain = g / sp - 1 if sp else 0.0
        rows.append({"size": s, "general_ms": g, "specialised_ms": sp, "gain": gain,
                     "calls": calls, "weight": calls / total_calls,
                     "score": gain * calls / total_calls, "recommend": gain > threshold})
    return sorted(rows, key=lambda r: r["score"], reverse=True)


def run(args: argparse.Namespace) -> int:
    if len(args.runs) == 1:  # one run (its ranks: a folder); several: one path per run
        reports = load_reports(args.runs)
        if len({run_id(r) for r in reports}) > 1:
            raise ReportError(f"{args.runs[0]}: holds reports of several runs; give each "
                              "run's folder to compare them, or one run's to tune it")
        return _one_run(reports, args.max_sizes)
    rows = recommend(size_times(args.runs), args.threshold)
    table = Table(title=f"fxflops tune (threshold {args.threshold:.0%})")
    for c in ("size", "general ms", "specialised ms", "gain", "calls", "weight", "compile it?"):
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(str(r["size"]), f"{r['general_ms']:.3f}", f"{r['specialised_ms']:.3f}",
                      f"{r['gain']:+.1%}", str(r["calls"]), f"{r['weight']:.1%}",
                      "[green]yes[/]" if r["recommend"] else "no")
    console = make_console()
    console.print(table)
    chosen = sorted(r["size"] for r in rows if r["recommend"])
    if chosen:
        console.print("recommended: -cc '" + json.dumps({"compile_sizes": chosen}) + "'",
                      soft_wrap=True)
    else:
        console.print("recommended: no compile_sizes (no specialised graph beats the general "
                      f"one by more than {args.threshold:.0%})")
    return 0


def _one_run(reports: list[dict[str, Any]], budget: int) -> int:
    stages = by_stage(reports)
    console = make_console()
    shards, n_stages, replicas = layout(reports)
    if len(reports) > 1:
        console.print(f"merged ({shards} shard(s) x {n_stages} stage(s) x {replicas} "
                      "replica(s)): per size, the slowest tensor-parallel shard's median; "
                      "data-parallel replicas' traffic added (the median a calls-weighted "
                      "mean); pipeline stages each apart, and their medians added for the "
                      "pipeline", soft_wrap=True)
    if len(stages) == 1:
        _recommend(console, _served(reports), budget, "this run")
        return 0
    # a pipeline: each stage its own figures and recommendation; vLLM takes one set of
    # sizes for every stage, and a batch goes through them all: the pipeline's is the one
    per_stage = {pp: _served(reps) for pp, reps in stages.items()}
    chosen = {pp: _recommend(console, served, budget, f"pipeline stage {pp}", cc=False)
              for pp, served in per_stage.items()}
    pipeline = _recommend(console, pipeline_served(per_stage), budget,
                          f"the pipeline ({len(stages)} stages, times added)")
    if len({tuple(sizes) for sizes in chosen.values()}) > 1:
        console.print("note: the stages differ: " + "; ".join(
            f"stage {pp}: {sizes}" for pp, sizes in chosen.items()) + f". vLLM takes one set "
            f"for all stages: the pipeline's ({pipeline}) minimises the time of a batch "
            "through every stage", soft_wrap=True)
    return 0


def _served(reports: list[dict[str, Any]]) -> list[Served]:
    # a size of 0 (an empty batch) has no tokens to pad or to time per token
    return [s for s in served_sizes(reports) if s.size > 0]


def _recommend(console: Any, served: list[Served], budget: int, what: str,
               cc: bool = True) -> list[int]:
    """Print what ``what`` served and the sizes recommended for it; returns them."""
    rec = recommend_one_run(served, budget)
    table = Table(title=f"fxflops tune: the sizes {what} served")
    for c in ("size", "calls", "share", "median ms", "ran as", "padding"):
        table.add_column(c, justify="right")
    calls = sum(s.calls for s in served)
    for s in served:
        table.add_row(str(s.size), str(s.calls), fmt_pct(s.calls / calls),
                      f"{s.median_ms:.3f}", s.kind, fmt_pct(s.padding_share))
    console.print(table)
    if rec.sizes:
        chosen = Table(title=f"recommended ({rec.mode}, at most {budget} sizes)")
        for c in ("size", "traffic", "saves per step"):
            chosen.add_column(c, justify="right")
        counts = traffic(served)
        forwards = sum(counts.values())
        for size in rec.sizes:
            gain = rec.gains_ms.get(size)
            chosen.add_row(str(size), fmt_pct(counts.get(size, 0) / forwards),
                           "unknown" if gain is None else f"{gain:+.4f} ms")
        console.print(chosen)
    expected = "unknown" if rec.expected_ms is None else f"{rec.expected_ms:.4f} ms"
    console.print(f"expected time per step: {rec.now_ms:.4f} ms as run; {expected} with the "
                  "recommendation")
    for note in rec.notes:
        console.print(f"note: {note}", soft_wrap=True)
    if not cc:
        console.print(f"{what}: would take {rec.sizes}")
    elif rec.cc:
        console.print("recommended: -cc '" + json.dumps(rec.cc) + "'", soft_wrap=True)
    else:
        console.print("recommended: no sizes to add for this traffic")
    return sorted(rec.sizes)
