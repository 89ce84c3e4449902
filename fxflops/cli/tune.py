"""``fxflops tune RUN`` and ``fxflops tune BASE SIZED``: which sizes to compile or capture.

One run (a report, or a folder of one run's ranks): the sizes it served, and the
``compile_sizes`` / ``cudagraph_capture_sizes`` that minimise the expected time per step for
that traffic within ``--max-sizes``.

Two runs or more, to confirm: a size is *specialised* in a run when a static graph (no size
symbols) ran at it; otherwise the general (dynamic) graph served it. For every size seen
both ways, the gain is the general median over the specialised one; sizes whose gain beats
the threshold are recommended, ranked by gain weighted by how often the size was called.

Both are ``fxflops.report.tuning``'s; this module reads the arguments and prints.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from fxflops.cli.args import non_negative_float, positive_int
from fxflops.cli.tables import fmt_pct, make_console
from fxflops.report.files import load_reports, run_id
from fxflops.report.schema import ReportError
from fxflops.report.tuning import (
    Served,
    by_stage,
    confirm,
    layout,
    pipeline_served,
    served_sizes,
    size_times,
    traffic,
)
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


def run(args: argparse.Namespace) -> int:
    if len(args.runs) == 1:  # one run (its ranks: a folder); several: one path per run
        reports = load_reports(args.runs)
        if len({run_id(r) for r in reports}) > 1:
            raise ReportError(f"{args.runs[0]}: holds reports of several runs; give each "
                              "run's folder to compare them, or one run's to tune it")
        return _one_run(reports, args.max_sizes)
    rows = confirm(size_times([load_reports([path]) for path in args.runs]), args.threshold)
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
        _recommend(console, served_sizes(reports), budget, "this run")
        return 0
    # a pipeline: each stage its own figures and recommendation; vLLM takes one set of
    # sizes for every stage, and a batch goes through them all: the pipeline's is the one
    per_stage = {pp: served_sizes(reps) for pp, reps in stages.items()}
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
