"""``fxflops plot PATH -o OUT.png``: throughput and time against size, and a roofline.

Its roofs are the run's peak, the one ``fxflops report`` reads MFU and bound against
(``report.run_peak``), and every roofline's title says where that peak came from.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from fxflops.peaks.of_run import no_roofline, run_device, run_peak, source_label
from fxflops.recording.size_stats import parse_size
from fxflops.report.files import load_reports, run_id
from fxflops.report.merge import describe, merge_rows
from fxflops.report.rows import WHOLE_FORWARDS, flat_rows
from fxflops.report.schema import ReportError
from fxflops.util import write_output


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="plot GFLOP/s and time per size, and a roofline")
    p.add_argument("paths", nargs="+", help="report files or folders")
    p.add_argument("-o", "--output", default="fxflops.png",
                   help="image to write: PNG, or the format its suffix names (.svg, .pdf)")
    p.add_argument("--kernels", action="store_true",
                   help="a roofline with one point per kernel and size (FXFLOPS_KERNELS runs)")
    p.set_defaults(func=run)


def tokens(row: Mapping[str, Any]) -> int | None:
    """The x of a row: its size, or the product of a ``BxS`` size (tokens of a batch)."""
    numbers = parse_size(row["size"])
    return prod(numbers) if numbers is not None else None


def _label(text: str) -> str:
    """Text shown as is: matplotlib reads ``$...$`` in a label as mathtext, and a graph
    name holding ``$`` would fail to draw."""
    return text.replace("$", r"\$")


def image_format(path: str, supported: dict[str, str]) -> str:
    """The format the path's suffix names, else PNG. Given explicitly to matplotlib, which
    would otherwise append ``.png`` to a name without a suffix, and write another file
    than the one named."""
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    return suffix if suffix in supported else "png"


def draw_roofs(ax: Any, peak: Mapping[str, Any], intensities: Sequence[float]) -> None:
    """The two roofs of ``peak`` on a roofline's axes (FLOP per byte against GFLOP/s),
    each a line of its own: the memory roof (``gid`` "memory roof": GB/s x intensity, up
    to the ridge) and the compute roof ("compute roof": the peak GFLOP/s, from the ridge),
    over the points' intensities and the ridge with room either side."""
    gflops, gbps = peak["tflops"] * 1e3, peak["gbps"]
    ridge = gflops / gbps  # FLOP per byte where the roofs meet
    low, high = min([*intensities, ridge]) / 4, max([*intensities, ridge]) * 4
    ax.plot([low, ridge], [low * gbps, gflops], "k--", gid="memory roof",
            label=f"memory roof: {gbps:.4g} GB/s")
    ax.plot([ridge, high], [gflops, gflops], "k-", gid="compute roof",
            label=f"compute roof: {gflops:.4g} GFLOP/s")


def roofline_title(what: str, peak: Mapping[str, Any], device: str | None) -> str:
    """A roofline's title: what it shows and, in brackets, where its peak came from (as
    ``fxflops report`` takes it); with no roofs, why not and how to give it them."""
    missing = no_roofline(peak, device)
    if missing is None:
        return f"{what} [{source_label(peak.get('source'))}]"
    return textwrap.fill(f"{what}: {missing}", 60)


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'fxflops[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    skipped: list[str] = []
    reports = load_reports(args.paths, skipped)
    for line in skipped:
        print(f"fxflops plot: skipped {line}", file=sys.stderr)
    runs = {run_id(r) for r in reports}
    if len(runs) > 1:
        raise ReportError(f"{len(runs)} runs given: plot one run at a time "
                          "(fxflops report shows which files belong to which)")
    if args.kernels:
        fig = kernels_figure(plt, reports)
        _save(plt, fig, args.output)
        print(f"wrote {args.output}: {len(kernel_points(reports))} kernel points")
        return 3 if skipped else 0
    merged = merge_rows(flat_rows(reports), run_peak(reports))
    # calls past FXFLOPS_MAX_SIZES have no one size: said under the figure, not dropped
    overflow = sum(r["calls"] for r in merged if r["size"] == "overflow")
    fig = sizes_figure(plt, reports, merged)
    if overflow:
        note = f"+ {overflow:,} calls at sizes past FXFLOPS_MAX_SIZES (overflow rows, not drawn)"
        fig.text(0.5, 0.005, note, ha="center", fontsize=8, color="darkred")
        print(note)
    fig.tight_layout(rect=(0, 0.03 if overflow else 0, 1, 1))
    _save(plt, fig, args.output)
    for line in describe(merged):
        print(line)
    print(f"wrote {args.output}")
    return 3 if skipped else 0


def _save(plt: Any, fig: Any, output: str) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format=image_format(output, fig.canvas.get_supported_filetypes()), dpi=110)
    plt.close(fig)
    write_output(output, buf.getvalue())  # the path named, and no other


def sizes_figure(plt: Any, reports: Sequence[Mapping[str, Any]],
                 merged: Sequence[Mapping[str, Any]]) -> Any:
    """Achieved GFLOP/s and median time against size, per graph, and a roofline of every
    (graph, size) under the run's peak (``run_peak``, the one ``fxflops report`` uses)."""
    rows = [r for r in merged if tokens(r) is not None]
    if not rows:
        raise ReportError("no rows with a numeric size to plot")
    peak = run_peak(reports)
    series: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:  # a pipeline's stages run different graphs: each its own series
        series[r["graph"] + (f" [{r['stage']}]" if r.get("stage") else "")].append(r)
    fig, (ax_tp, ax_t, ax_roof) = plt.subplots(1, 3, figsize=(16, 4.8))
    intensities: list[float] = []
    for name, rs in sorted(series.items()):
        rs.sort(key=lambda r: tokens(r) or 0)
        sizes = [tokens(r) for r in rs]
        ax_t.plot(sizes, [r["median_ms"] for r in rs], marker="o", label=_label(name))
        if not name.startswith(WHOLE_FORWARDS):  # (whole forwards: their time only)
            ax_tp.plot(sizes, [(r.get("tflops") or 0) * 1e3 for r in rs], marker="o",
                       label=_label(name))
            drawn = [r for r in rs if r["bytes_io"] and r.get("tflops")]
            pts = [(r["flops"] / r["bytes_io"], r["tflops"] * 1e3) for r in drawn]
            if pts:
                ax_roof.scatter(*zip(*pts), label=_label(name))
                intensities += [x for x, _ in pts]
                for (x, y), r in zip(pts, drawn):
                    ax_roof.annotate(str(r["size"]), (x, y), fontsize=7)
    if no_roofline(peak) is None:
        draw_roofs(ax_roof, peak, intensities)
    for ax, title, ylabel in (
            (ax_tp, "achieved GFLOP/s", "GFLOP/s"), (ax_t, "median time per call", "ms"),
            (ax_roof, roofline_title("roofline", peak, run_device(reports)), "GFLOP/s")):
        ax.set_title(title, fontsize=10 if "\n" in title else None)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2) if ax is not ax_roof else ax.set_xscale("log")
        ax.set_xlabel("size (elements of the size key: tokens, or batch x seq)"
                      if ax is not ax_roof else "FLOP per byte (I/O)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax_roof.set_yscale("log")
    return fig


def kernel_points(reports: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any, Any]]:
    """(graph, size, kernel) of every profiled kernel with a time, bytes and FLOPs."""
    points = [(g["name"], row["size"], k) for rep in reports for g in rep["graphs"]
              for row in g["rows"] for k in row.get("kernels") or []
              if k.get("median_ms") and k.get("bytes") and k.get("flops")]
    if not points:
        raise ReportError("no profiled kernels to plot: run with FXFLOPS_KERNELS=N (or "
                          "fxflops.backend(kernels=N)) to profile N calls per size")
    return points


def kernels_figure(plt: Any, reports: Sequence[Mapping[str, Any]]) -> Any:
    """One point per profiled kernel and size: its arithmetic intensity (FLOP per byte at
    its boundary) against its GFLOP/s, under the roofs of the run's peak (``run_peak``)."""
    points = kernel_points(reports)
    peak = run_peak(reports)
    fig, ax = plt.subplots(figsize=(9, 6))
    by_kernel: dict[str, list[tuple[float, float, Any]]] = defaultdict(list)
    for graph, size, k in points:
        by_kernel[f"{graph}:{k['kernel']}"].append(
            (k["flops"] / k["bytes"], k["flops"] / (k["median_ms"] / 1e3) / 1e9, size))
    for name, pts in sorted(by_kernel.items()):
        xs, ys, sizes = zip(*pts)
        ax.scatter(xs, ys, label=_label(name), s=18)
        for x, y, size in pts:
            ax.annotate(str(size), (x, y), fontsize=6)
    if no_roofline(peak) is None:
        draw_roofs(ax, peak, [x for pts in by_kernel.values() for x, _, _ in pts])
    ax.set_title(roofline_title("kernels against the roofline", peak, run_device(reports)))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte (at the kernel's boundary)")
    ax.set_ylabel("GFLOP/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig
