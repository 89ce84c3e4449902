"""``fxflops compare BASE NEW``: per (graph or whole forward, size), both medians and the gain."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from fxflops.cli.tables import fmt_num, make_console
from fxflops.peaks.of_run import run_peak
from fxflops.report.figures import size_order
from fxflops.report.files import load_reports, run_id
from fxflops.report.merge import describe, merge_rows, merge_steps
from fxflops.report.rows import WHOLE_FORWARDS, flat_rows
from fxflops.report.schema import ReportError
from fxflops.report.steps import training_steps


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two runs per graph/forward and size")
    p.add_argument("base", help="report file or folder: the baseline run")
    p.add_argument("new", help="report file or folder: the run to compare")
    p.add_argument("--force", action="store_true",
                   help="compare rows whose FLOPs differ (a different model or config)")
    p.set_defaults(func=run)


def keyed(path: str) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str]]:
    """One run's rows by (graph, size), ranks merged, and what the merge merged
    (``merge.describe``). A graph is known by its fingerprint (its structure and FLOPs)
    where the report has one, so graphs match across runs whatever Dynamo named them;
    graphs sharing a name stay apart."""
    reports = load_reports([path])
    runs = {run_id(r) for r in reports}
    if len(runs) > 1:
        raise ReportError(f"{path}: holds {len(runs)} runs; give one run's reports "
                          "(fxflops report shows which files belong to which)")
    rows = merge_rows(flat_rows(reports), run_peak(reports))
    # a pipeline's stages are apart: the same graph name on two stages is two graphs
    return ({(_stage_prefix(r) + (r.get("fingerprint") or r["graph"]), str(r["size"])): r
             for r in rows}, describe(rows))


def _stage_prefix(r: dict[str, Any]) -> str:
    return f"{r['stage']}:" if r.get("stage") else ""


def _static_flops(r: dict[str, Any]) -> int:
    # run-time FLOPs (vLLM attention) follow the requests' context lengths, not the model
    return int(r["flops"]) - int(r.get("runtime_flops") or 0)


def compare_rows(base: dict, new: dict, force: bool = False) -> list[dict[str, Any]]:
    common = set(base) & set(new)
    if not common:
        raise ReportError("the two runs share no (graph, size): nothing to compare "
                          "(a different model? compare whole-forward rows from vLLM runs)")
    for key in sorted(common, key=_order):
        b, n = base[key], new[key]
        if _static_flops(b) != _static_flops(n) and not force:
            raise ReportError(
                f"{b['graph']} at size {key[1]}: FLOPs differ ({_static_flops(b):,} vs "
                f"{_static_flops(n):,}): not the same model or configuration "
                "(--force compares anyway)")
    out = []
    for key in sorted(set(base) | set(new), key=_order):
        b, n = base.get(key), new.get(key)
        shown = b or n or {}
        graph = shown.get("graph", key[0]) + (f" [{shown['stage']}]" if shown.get("stage") else "")
        row = {"graph": graph, "size": key[1], "base": b,
               "new": n, "speedup": None}
        if b and n and n["median_ms"]:
            row["speedup"] = b["median_ms"] / n["median_ms"]
        out.append(row)
    return out


def _order(key: tuple[str, str]) -> tuple[Any, ...]:
    g, s = key
    return (g not in WHOLE_FORWARDS, g, size_order(int(s) if s.isdigit() else s))


def run(args: argparse.Namespace) -> int:
    (base, base_merged), (new, new_merged) = keyed(args.base), keyed(args.new)
    rows = compare_rows(base, new, args.force)
    table = Table(title=escape(f"fxflops compare: base={args.base}  new={args.new}"))
    for c in ("graph", "size", "base ms", "new ms", "speedup", "base GFLOPs", "new GFLOPs",
              "base GFLOP/s", "new GFLOP/s"):
        table.add_column(c, justify="left" if c == "graph" else "right")

    def cell(r: dict | None, field: str, scale: float = 1.0) -> str:
        if r is None:
            return "-"
        v = r.get(field)
        return fmt_num(v * scale) if v is not None else "-"

    for r in rows:
        b, n = r["base"], r["new"]
        if r["speedup"] is not None:
            sp = r["speedup"]
            style = "green" if sp > 1.02 else "red" if sp < 0.98 else ""
            speed = f"[{style}]{sp:.2f}x[/]" if style else f"{sp:.2f}x"
        else:
            speed = "only in base" if n is None else "only in new"
        table.add_row(escape(r["graph"]), escape(r["size"]), cell(b, "median_ms"), cell(n, "median_ms"), speed,
                      cell(b, "flops", 1e-9), cell(n, "flops", 1e-9),
                      cell(b, "tflops", 1e3), cell(n, "tflops", 1e3))
    console = make_console()
    console.print(table)
    for which, lines in (("base", base_merged), ("new", new_merged)):
        for line in lines:
            console.print(escape(f"{which}: {line}"))
    _print_steps(console, steps_of(args.base), steps_of(args.new))
    return 0


def steps_of(path: str) -> dict[str, dict[str, Any]]:
    """A training run's per-step roll-up by size (fxflops.report.steps); empty for inference."""
    reports = load_reports([path])
    peak = run_peak(reports)
    steps = training_steps(flat_rows(reports), peak)
    if len({s["rank"] for s in steps}) > 1:  # many ranks: the job's step
        steps = merge_steps(steps, peak)
    return {str(s["size"]): s for s in steps}


def _print_steps(console: Any, base: dict[str, dict[str, Any]],
                 new: dict[str, dict[str, Any]]) -> None:
    common = sorted(set(base) & set(new), key=lambda s: size_order(int(s) if s.isdigit() else s))
    if not common:
        return
    table = Table(title="training steps (forward + backward + once-a-step graphs)")
    for c in ("size", "base step ms", "new step ms", "speedup", "base model GFLOPs",
              "new model GFLOPs"):
        table.add_column(c, justify="right")
    for size in common:
        b, n = base[size], new[size]
        speedup = b["step_ms"] / n["step_ms"] if n["step_ms"] else None
        table.add_row(size, f"{b['step_ms']:.3f}", f"{n['step_ms']:.3f}",
                      f"{speedup:.2f}x" if speedup else "-", fmt_num(b["model_flops"] / 1e9),
                      fmt_num(n["model_flops"] / 1e9))
    console.print(table)
