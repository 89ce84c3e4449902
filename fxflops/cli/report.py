"""``fxflops report PATH...``: per-rank and merged rows of one or more report files."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from typing import Any, cast

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fxflops.cli.args import positive_int
from fxflops.cli.tables import fmt_bytes, fmt_num, fmt_pct, make_console
from fxflops.peaks.of_run import run_peak
from fxflops.placement import place_of
from fxflops.report.figures import size_order
from fxflops.report.files import load_reports, run_id
from fxflops.report.merge import describe, merge_rows, merge_steps, merged_anything
from fxflops.report.rows import WHOLE_FORWARDS, flat_rows
from fxflops.report.schema import ReportError
from fxflops.report.steps import training_steps
from fxflops.util import write_output


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="show report files or folders (ranks merged)")
    p.add_argument("paths", nargs="+", help="report files or folders of them")
    p.add_argument("--json", metavar="OUT", help="write the rows as JSON ('-' for stdout)")
    p.add_argument("--csv", metavar="OUT", help="write the rows as CSV ('-' for stdout)")
    p.add_argument("--kernels", type=positive_int, nargs="?", const=10, default=None,
                   metavar="N", help="per graph and size, its N slowest kernels (default 10) "
                   "and those furthest from the roofline (FXFLOPS_KERNELS runs)")
    p.add_argument("--warmup", action="store_true",
                   help="show the warm-up rows too (vLLM's profile run, warm-up compiles, "
                   "CUDA-graph capture: left out by default, they are not traffic)")
    p.set_defaults(func=run)


# shown, but some files given were not reports (each named on stderr)
EXIT_SKIPPED = 3

COLUMNS = ["rank", "graph", "size", "calls", "median_ms", "p90_ms", "flops", "matmul_flops",
           "bytes_io", "tflops", "gbps", "mfu", "intensity", "bound", "outside_share", "run", "place",
           "stage", "warmup",
           "phase", "recomputed_flops", "hfu", "padding_share", "workload"]


def forward_outside_share(rows: list[dict[str, Any]]) -> None:
    """For whole-forward rows: the share of the forward spent outside compiled graphs.

    Per run, process (or merged place: a stage, the whole job) and size: 1 - (sum over
    graphs of median x calls per forward) / forward median; the target's ``<forward>``
    over its graphs, a drafter's ``<draft>`` over the drafter's (``workload: draft``).
    """
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        process = r.get("pid") if r.get("rank") != "all" else None
        return (r.get("run"), r.get("place"), r.get("rank"), process, r.get("warmup"),
                str(r["size"]), r.get("workload") == "draft")

    graph_time: dict[tuple[Any, ...], float] = defaultdict(float)
    fwd = {key(r): r for r in rows if r["graph"] in WHOLE_FORWARDS}
    for r in rows:
        if r["graph"] in WHOLE_FORWARDS:
            continue
        k = key(r)
        f = fwd.get(k)
        if f and f["calls"]:
            graph_time[k] += r["median_ms"] * r["calls"] / f["calls"]
    for k, f in fwd.items():
        if f["median_ms"] and k in graph_time:
            f["outside_share"] = max(0.0, 1 - graph_time[k] / f["median_ms"])
            f["graphs_ms"] = graph_time[k]


def report_rows(reports: list[dict[str, Any]], warmup: bool = False
                ) -> tuple[list[dict[str, Any]], bool]:
    """Every rank's rows, and for a run of several ranks their merged rows too (rows of
    different runs are never merged); with ``warmup``, the warm-up rows too."""
    # (the CLI adds figures to the rows it shows: plain dicts from here on)
    rows = cast("list[dict[str, Any]]", flat_rows(reports, warmup))
    if not rows:
        raise ReportError("the reports hold no timed calls (did the compiled model run?)")
    forward_outside_share(rows)
    by_run: dict[Any, set[Any]] = defaultdict(set)
    for r in rows:
        by_run[r["run"]].add((r["rank"], r.get("place")))
    multi = any(len(ranks) > 1 for ranks in by_run.values())
    if multi:
        several = [r for r in rows if len(by_run[r["run"]]) > 1]
        # (a merged row of one process is that process's row again: not shown twice)
        merged = [r for r in merge_rows(several, run_peak(reports)) if merged_anything(r)]
        forward_outside_share(merged)
        rows = rows + merged
    return rows, multi


def run(args: argparse.Namespace) -> int:
    skipped: list[str] = []
    reports = load_reports(args.paths, skipped)
    for line in skipped:
        print(f"fxflops report: skipped {line}", file=sys.stderr)
    rows, multi = report_rows(reports, args.warmup)
    if args.json:
        _write(args.json, json.dumps(rows, indent=1, default=str))
    if args.csv:
        _write_csv(args.csv, rows)
    if args.json == "-" or args.csv == "-":
        return EXIT_SKIPPED if skipped else 0
    console = make_console()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rep in reports:
        runs[run_id(rep)].append(rep)
    if len(runs) > 1:
        console.print(f"{len(runs)} runs: each is shown on its own, never added to another")
    for run_name, run_reports in sorted(runs.items(), key=lambda kv: _started(kv[1])):
        _print_run(console, run_name, run_reports, [r for r in rows if r["run"] == run_name],
                   multi)
    if args.kernels:
        print_kernels(console, reports, args.kernels)
    if skipped:
        console.print(f"[yellow]{len(skipped)} file(s) skipped (listed on stderr)")
        return EXIT_SKIPPED
    return 0


def print_kernels(console: Console, reports: list[dict[str, Any]], limit: int) -> None:
    """Per graph and size with kernels (``FXFLOPS_KERNELS``): the slowest ``limit`` kernels
    (by FLOPs where none was profiled) and the furthest from their roofline."""
    shown = 0
    for rep in reports:
        for g in rep["graphs"]:
            for row in g["rows"]:
                kernels = row.get("kernels")
                if not kernels:
                    continue
                shown += 1
                prof = row.get("kernels_profile")
                title = f"kernels of {g['name']} at size {row['size']} ({len(kernels)})"
                table = Table(title=escape(title))
                for c in ("kernel", "GFLOPs", "matmul", "MB", "FLOP/B", "median ms",
                          "GFLOP/s", "GB/s", "of roofline", "bound"):
                    table.add_column(c, justify="left" if c == "kernel" else "right")
                order = sorted(kernels, key=lambda k: (k.get("median_ms") or 0, k["flops"]),
                               reverse=True)
                for k in order[:limit]:
                    table.add_row(escape(k["kernel"]), fmt_num(k["flops"] / 1e9),
                                  "yes" if k["matmul_flops"] else "",
                                  fmt_num(k["bytes"] / 1e6), fmt_num(k.get("intensity")),
                                  f"{k['median_ms']:.4f}" if "median_ms" in k else "-",
                                  fmt_num((k.get("tflops") or 0) * 1e3) if "median_ms" in k
                                  else "-", fmt_num(k.get("gbps")),
                                  fmt_pct(k.get("roofline_share")), k.get("bound") or "-")
                console.print(table)
                if prof:
                    console.print(escape(
                        f"{prof['calls']} calls profiled: median {prof['median_ms']:.3f} ms, "
                        f"in kernels {prof['kernels_ms']:.3f} ms, outside kernels (the "
                        f"wrapper's) {prof['overhead_ms']:.3f} ms"), soft_wrap=True)
                far = sorted((k for k in kernels if k.get("roofline_share") is not None),
                             key=lambda k: k["roofline_share"])[:3]
                if far:
                    console.print(escape("furthest from the roofline: " + ", ".join(
                        f"{k['kernel']} ({k['roofline_share']:.1%})" for k in far)))
    if not shown:
        console.print("[yellow]no kernels in these reports: run with FXFLOPS_KERNELS=N "
                      "(or fxflops.backend(kernels=N)) to map and profile them")


def _started(reports: list[dict[str, Any]]) -> float:
    return min(float((r.get("run") or {}).get("started") or 0) for r in reports)


def _print_run(console: Console, run_name: str, reports: list[dict[str, Any]],
               rows: list[dict[str, Any]], multi: bool) -> None:
    peak = run_peak(reports)  # (the one plot and compare use)
    procs = ", ".join(sorted({_place(r) for r in reports}))
    for line in estimated_lines(reports):  # before the figures they change
        console.print("[yellow]" + escape(line))
    table = Table(title=escape(
        f"fxflops: run {run_name}: {len(reports)} report(s) ({procs}); peak: "
        f"{peak.get('tflops') or '-'} TFLOP/s, {peak.get('gbps') or '-'} GB/s "
        f"[{peak.get('source')}]"))
    cols = (["where"] if multi else []) + ["graph", "size", "calls", "median ms", "p90 ms",
                                          "GFLOPs", "GFLOP/s", "GB/s", "MFU", "bound",
                                          "outside graphs", "padding"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("graph", "where") else "right")
    for r in sorted(rows, key=_order):
        cells = [_where(r)] if multi else []
        graph = r["graph"] + (f" ({r['warmup']})" if r.get("warmup") else "")
        cells += [graph, str(r["size"]), str(r["calls"]), f"{r['median_ms']:.3f}",
                  f"{r.get('p90_ms', 0):.3f}", fmt_num(r["flops"] / 1e9),
                  fmt_num((r.get("tflops") or 0) * 1e3), fmt_num(r.get("gbps")),
                  fmt_pct(r.get("mfu")), r.get("bound") or "-",
                  fmt_pct(r.get("outside_share")), fmt_pct(r.get("padding_share"))]
        table.add_row(*map(escape, cells))
    console.print(table)
    for line in symbol_lines(reports):  # what the sizes (AxB: the symbols' values) are of
        console.print(escape(line))
    for line in describe(rows):
        console.print(escape(line))
    steps = training_steps([r for r in rows if r["rank"] != "all"], peak)
    if len({s["rank"] for s in steps}) > 1:  # many ranks: the job's step too
        steps += merge_steps(steps, peak)
    if steps:
        _print_steps(console, steps, multi)
    for rep in reports:
        for g in rep["graphs"]:
            uncompiled = (g.get("meta") or {}).get("uncompiled")
            if uncompiled:  # no graph compiled: its calls counted from the ops they ran
                console.print(escape(f"{g['name']}: {uncompiled}; counted from the ops its "
                                     "calls ran (a census per size)"))
            if g.get("uncounted"):
                console.print("[yellow]" + escape(f"{g['name']}: uncounted ops (0 FLOPs): " + ", ".join(
                    f"{k} x{v}" for k, v in g["uncounted"].items())))
            if g.get("dropped_sizes"):
                console.print("[yellow]" + escape(
                    f"{g['name']}: {g['dropped_sizes']} sizes past FXFLOPS_MAX_SIZES: their "
                    "calls are in its 'overflow' row"))
    for line in features_off_lines(reports):
        console.print("[yellow]" + escape(line))
    for rep in reports:
        for u in rep.get("uninstrumented") or []:
            console.print("[yellow]" + escape(
                f"{u['name']}: NOT INSTRUMENTED ({u['reason']}); {u['calls']} calls ran "
                "uncounted"))
    for rep in reports:
        if rep.get("engine"):
            _print_engine(console, rep["engine"], _place(rep) if len(reports) > 1 else "")
    total_bytes = sum(r["bytes_io"] for r in rows if r["rank"] != "all")
    console.print(f"{len(rows)} rows; bytes (I/O) per call summed over rows: "
                  f"{fmt_bytes(total_bytes)}")


def symbol_lines(reports: list[dict[str, Any]], shown: int = 3) -> list[str]:
    """One line per distinct set of size symbols, naming its graphs (the same graph on every
    rank once) and what each symbol is: ``size symbols of graph1: s72 =
    input_ids.size(0), s70 = input_ids.size(1)``. Reports written before symbols were
    named have none to show."""
    graphs_of: dict[str, list[str]] = {}
    for rep in reports:
        for g in rep["graphs"]:
            named = g.get("symbol_sources") or []
            if not named:
                continue
            legend = ", ".join(f"{s['symbol']} = {s['where']}" for s in named)
            names = graphs_of.setdefault(legend, [])
            if g["name"] not in names:
                names.append(g["name"])
    lines = []
    for legend, names in graphs_of.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        lines.append(f"size symbols of {', '.join(names[:shown])}{more}: {legend}")
    return lines


def features_off_lines(reports: list[dict[str, Any]]) -> list[str]:
    """One line per distinct set of features an engine integration had off (vLLM's runner
    hooks a release lacks), each with the version and why: the rows they would have given
    are missing, not zero."""
    seen: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for rep in reports:
        off = tuple(sorted((rep["process"].get("features_off") or {}).items()))
        if off:
            seen.setdefault(off, []).append(_place(rep))
    many = len(reports) > 1
    return [("features off" + (f" ({', '.join(sorted(set(places)))})" if many else "") + ": "
             + "; ".join(f"{feature} ({why})" for feature, why in off))
            for off, places in seen.items()]


def estimated_lines(reports: list[dict[str, Any]]) -> list[str]:
    """One line per graph with layers counted from their sizes (an op no formula counts
    right): the op and the layers, so that the figures below are read knowingly."""
    lines = []
    seen: set[tuple[str, ...]] = set()
    for rep in reports:
        for g in rep["graphs"]:
            estimated = (g.get("layers") or {}).get("estimated") or []
            by_op: dict[str, list[str]] = {}
            for e in estimated:
                for op in e.get("ops") or ["?"]:
                    by_op.setdefault(str(op), []).append(str(e.get("layer")))
            for op, layer_names in by_op.items():
                key = (g["name"], op, *layer_names)
                if key in seen:  # the same graph on every rank
                    continue
                seen.add(key)
                shown = ", ".join(layer_names[:4]) + (
                    f" and {len(layer_names) - 4} more" if len(layer_names) > 4 else "")
                lines.append(f"{g['name']}: ESTIMATED: {len(layer_names)} layer(s) counted from "
                             f"their sizes, no formula counts {op}: {shown}")
    return lines


def _print_engine(console: Console, engine: dict[str, Any], where: str) -> None:
    """vLLM's own estimate beside the measured FLOPs, per forward size, and speculative
    decoding's drafts (``fxflops.report.engine``)."""
    from fxflops.report.engine import COMPONENTS, TOLERANCE

    prefix = f"{where}: " if where else ""
    compared = engine.get("estimate_vs_measured") or []
    if compared:
        table = Table(title=escape(
            f"{prefix}measured graph FLOPs vs vLLM's own estimate (--enable-mfu-metrics), per "
            f"step; ratio with the LM head aside, tolerance {100 * TOLERANCE:g}%"))
        for c in ("size", "steps", "measured GFLOPs", "vLLM GFLOPs", "vLLM LM head",
                  "ratio", "differs"):
            table.add_column(c, justify="left" if c == "differs" else "right")
        for r in compared:
            measured = sum(r["measured"].get(k, 0) for k in COMPONENTS)
            differs = ", ".join(
                f"{d['component']} ({fmt_num(d['measured'] / 1e9)} vs "
                f"{fmt_num(d['estimate'] / 1e9)})" for d in r["differs"]) or "-"
            table.add_row(*map(escape, (
                str(r["size"]), f"{r['steps']}/{r['estimate_steps']}",
                fmt_num(measured / 1e9), fmt_num(r["estimate"]["total"] / 1e9),
                fmt_num(r["estimate"].get("lm_head", 0) / 1e9),
                "-" if r.get("ratio") is None else f"{r['ratio']:.4f}", differs)))
        console.print(table)
        named = {d["component"]: d["why"] for r in compared for d in r["differs"]}
        for component, why in named.items():
            console.print(escape(f"  {component}: {why}"))
    spec = engine.get("spec_decode")
    if spec:
        rejected = spec.get("rejected_flops")
        console.print(escape(
            f"{prefix}speculative decoding: {spec['drafts']} drafts, {spec['proposed']} tokens "
            f"proposed, {spec['accepted']} accepted "
            f"({fmt_pct(spec.get('acceptance_rate'))}), {spec['rejected']} rejected"
            + (f": about {fmt_num(rejected / 1e9)} GFLOPs of the target's spent on them"
               if rejected is not None else "")))


def _print_steps(console: Console, steps: list[dict[str, Any]], multi: bool) -> None:
    """The per-step roll-up of a training run (fxflops.report.steps)."""
    table = Table(title="training steps: forward + backward (+ graphs run once a step)")
    cols = (["where"] if multi else []) + [
        "size", "steps", "forward ms", "backward ms", "other ms", "step ms", "model GFLOPs",
        "hardware GFLOPs", "model GFLOP/s", "MFU", "HFU"]
    for c in cols:
        table.add_column(c, justify="left" if c == "where" else "right")
    for s in sorted(steps, key=lambda s: (str(s["rank"]), size_order(s["size"]))):
        cells = [f"all ({s['ranks']} ranks)" if s["rank"] == "all" else f"rank {s['rank']}"] \
            if multi else []
        cells += [str(s["size"]), str(s["steps"]), f"{s['forward_ms']:.3f}",
                  f"{s['backward_ms']:.3f}", f"{s['other_ms']:.3f}", f"{s['step_ms']:.3f}",
                  fmt_num(s["model_flops"] / 1e9), fmt_num(s["flops"] / 1e9),
                  fmt_num((s.get("model_tflops") or 0) * 1e3), fmt_pct(s.get("mfu")),
                  fmt_pct(s.get("hfu"))]
        table.add_row(*map(escape, cells))
    console.print(table)
    others = sorted({g for s in steps for g in s["other_graphs"]})
    if others:
        console.print(escape("once a step besides forward and backward: " + ", ".join(others)))


def _where(r: dict[str, Any]) -> str:
    """Where a row ran: a process's place (``pp1 tp0``, ``rank1``), a merged stage
    (``pp1``) or the whole job (``all``)."""
    return str(r.get("place") or r["rank"])


def _place(report: dict[str, Any]) -> str:
    return place_of(report["process"])


def _order(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["rank"] == "all", _where(r), r["graph"] in (*WHOLE_FORWARDS, "<pipeline>"),
            r["graph"], r.get("warmup") or "", size_order(r["size"]))


def _write(dest: str, text: str) -> None:
    if dest == "-":
        sys.stdout.write(text + "\n")
    else:
        write_output(dest, text)


def _write_csv(dest: str, rows: list[dict[str, Any]]) -> None:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    _write(dest, buf.getvalue().rstrip("\n"))

