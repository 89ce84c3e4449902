"""``fxflops compare BASE NEW``: per (graph or whole forward, size), both medians and the gain."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from fxflops.cli.tables import fmt_num, make_console
from fxflops.report import ReportError, flat_rows, load_reports, merge_rows, size_order


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two runs per graph/forward and size")
    p.add_argument("base", help="report file or folder: the baseline run")
    p.add_argument("new", help="report file or folder: the run to compare")
    p.set_defaults(func=run)


def keyed(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    reports = load_reports([path])
    rows = merge_rows(flat_rows(reports), reports[0].get("peak"))
    return {(r["graph"], str(r["size"])): r for r in rows}


def compare_rows(base: dict, new: dict) -> list[dict[str, Any]]:
    if not set(base) & set(new):
        raise ReportError("the two runs share no (graph, size): nothing to compare "
                          "(graph names differ? compare whole-forward rows from vLLM runs)")
    out = []
    for key in sorted(set(base) | set(new), key=_order):
        b, n = base.get(key), new.get(key)
        row = {"graph": key[0], "size": key[1], "base": b, "new": n, "speedup": None}
        if b and n and n["median_ms"]:
            row["speedup"] = b["median_ms"] / n["median_ms"]
        out.append(row)
    return out


def _order(key: tuple[str, str]) -> tuple[Any, ...]:
    g, s = key
    return (g != "<forward>", g, size_order(int(s) if s.isdigit() else s))


def run(args: argparse.Namespace) -> int:
    rows = compare_rows(keyed(args.base), keyed(args.new))
    table = Table(title=f"fxflops compare: base={args.base}  new={args.new}")
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
        table.add_row(r["graph"], r["size"], cell(b, "median_ms"), cell(n, "median_ms"), speed,
                      cell(b, "flops", 1e-9), cell(n, "flops", 1e-9),
                      cell(b, "tflops", 1e3), cell(n, "tflops", 1e3))
    make_console().print(table)
    return 0
