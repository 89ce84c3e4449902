"""Training steps: a run's forward and backward rows rolled up per step.

A compiled training step runs, per Dynamo graph, a forward graph and (inside
``loss.backward()``) its backward graph; ``fxflops.autograd`` names them ``<source>`` (the
name the Dynamo graph would have had) and ``<source>.backward``. Graphs Dynamo compiled
from one Python frame (``meta["frame"]``) are recompiles of each other, of which a step
runs one: their figures are averaged, weighted by calls; graphs of different frames (a
graph break, the optimizer) all run, and add up.

Per process and size, a step is:

- per frame, the forward and the backward at that size: calls-weighted medians and FLOPs;
- every frame of graphs that are neither (an optimizer's compiled ``step``, a compiled
  ``zero_grad``) whose calls, over all its graphs and sizes, equal the process's steps: it
  ran once a step; its calls-weighted median and FLOPs. A frame that ran a different
  number of times (an evaluation forward) is not in the step, nor is the model's own frame
  compiled again under ``no_grad`` (evaluation between steps, however often it runs).

The process's steps are the calls of its most-called frame's backward graphs. MFU counts
model FLOPs (recomputation left out), HFU every FLOP that ran; see docs/conventions.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fxflops.stats import throughput

_TRAINING = ("forward", "backward")
_SUMMED = ("flops", "matmul_flops", "bytes_io", "recomputed_flops", "recomputed_matmul_flops")


def training_steps(rows: list[dict[str, Any]], peak: dict[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per (run, rank, process, size) that ran backward graphs; ``rows`` as
    ``report.flat_rows`` makes them (merged rows of several ranks are left out)."""
    peak = peak or {}
    by_process: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("rank") != "all" and r.get("graph") != "<forward>" and r.get("calls"):
            by_process[(r.get("run"), r.get("rank"), r.get("pid"))].append(r)
    out = []
    for (run, rank, pid), proc_rows in by_process.items():
        backward_calls: dict[Any, int] = defaultdict(int)
        for r in proc_rows:
            if r.get("phase") == "backward":
                backward_calls[_frame(r)] += r["calls"]
        if not backward_calls:
            continue
        steps_total = max(backward_calls.values())
        once_a_step = _once_a_step(proc_rows, steps_total)
        sizes: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in proc_rows:
            if r.get("phase") in _TRAINING:
                sizes[str(r["size"])].append(r)
        for size_rows in sizes.values():
            if any(r["phase"] == "backward" for r in size_rows):
                out.append(_step_row(run, rank, pid, size_rows, once_a_step, steps_total, peak))
    return out


def _frame(r: dict[str, Any]) -> Any:
    """The frame a row's graph was compiled from (reports without it: its own graph)."""
    frame = r.get("frame")
    return ("frame", frame) if frame is not None else ("graph", r.get("source") or r["graph"])


def _once_a_step(rows: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Rows of the frames (of graphs not forward or backward) whose calls equal ``steps``.
    A frame that has training graphs is the model's: its other graphs (compiled under
    ``no_grad``, ``phase`` "inference" or none) are evaluation between steps, not in them."""
    training = {_frame(r) for r in rows if r.get("phase") in _TRAINING}
    by_frame: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        frame = _frame(r)
        if r.get("phase") not in (*_TRAINING, "inference") and frame not in training:
            by_frame[frame].append(r)
    return [r for frame_rows in by_frame.values()
            if sum(r["calls"] for r in frame_rows) == steps for r in frame_rows]


def _per_call(rows: list[dict[str, Any]], field: str) -> float:
    """Per frame, the calls-weighted mean of ``field`` over its rows; summed over frames."""
    by_frame: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_frame[_frame(r)].append(r)
    return sum(sum((r.get(field) or 0) * r["calls"] for r in fr) / sum(r["calls"] for r in fr)
               for fr in by_frame.values())


def _step_row(run: Any, rank: Any, pid: Any, rows: list[dict[str, Any]],
              others: list[dict[str, Any]], steps_total: int, peak: dict[str, Any]
              ) -> dict[str, Any]:
    fw = [r for r in rows if r["phase"] == "forward"]
    bw = [r for r in rows if r["phase"] == "backward"]
    calls_by_frame: dict[Any, int] = defaultdict(int)
    for r in bw:
        calls_by_frame[_frame(r)] += r["calls"]

    def other(field: str) -> float:
        # each frame ran once a step, ``steps_total`` times in all
        return sum((r.get(field) or 0) * r["calls"] for r in others) / steps_total

    row: dict[str, Any] = {
        "run": run, "rank": rank, "pid": pid, "size": bw[0]["size"],
        "steps": max(calls_by_frame.values()),
        "forward_ms": _per_call(fw, "median_ms"), "backward_ms": _per_call(bw, "median_ms"),
        "other_ms": other("median_ms"),  # medians: a first call's warm-up is no step
        "other_graphs": sorted({r["graph"] for r in others}),
    }
    row["step_ms"] = row["forward_ms"] + row["backward_ms"] + row["other_ms"]
    for field in _SUMMED:
        row[field] = int(_per_call(fw, field) + _per_call(bw, field) + other(field))
    row["model_flops"] = row["flops"] - row["recomputed_flops"]
    row["backward_flops"] = int(_per_call(bw, "flops"))
    seconds = row["step_ms"] / 1e3
    row.update(throughput(row["flops"], row["matmul_flops"], row["bytes_io"], seconds,
                          peak.get("tflops"), peak.get("gbps"),
                          row["recomputed_matmul_flops"]))
    row["model_tflops"] = row["model_flops"] / seconds / 1e12 if seconds > 0 else None
    return row
