"""Training steps: a run's forward and backward rows rolled up per step.

A compiled training step runs, per Dynamo graph, a forward graph and (inside
``loss.backward()``) its backward graph; ``fxflops.instrument.autograd`` names them ``<source>`` (the
name the Dynamo graph would have had) and ``<source>.backward``. Graphs Dynamo compiled
from one Python frame (``meta["frame"]``) are recompiles of each other, of which a step
runs one: their figures are averaged, weighted by calls; graphs of different frames (a
graph break, the optimizer) all run, and add up, as do the pieces DDP's optimizer splits a
frame's graph into at its gradient buckets (``meta["piece"]``).

Per process and size, a step is:

- every forward and backward graph at that size, its median and FLOPs times its calls, over
  the process's backward passes at that size (each ``loss.backward()`` is one autograd
  graph task, counted by the backward graphs themselves: ``backward_passes``). Reports
  from before those were counted: per frame, the calls-weighted medians and FLOPs;
- every frame of graphs that are neither (an optimizer's compiled ``step``, a compiled
  ``zero_grad``) whose calls, over all its graphs and sizes, equal the process's steps: it
  ran once a step; its calls-weighted median and FLOPs. A frame that ran a different
  number of times (an evaluation forward) is not in the step, nor is the model's own frame
  compiled again under ``no_grad`` (evaluation between steps, however often it runs).

The process's steps are its backward passes (before: the calls of its most-called frame's
backward graphs). MFU counts
model FLOPs (recomputation left out), HFU every FLOP that ran; see docs/conventions.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from fxflops.report.figures import throughput

_TRAINING = ("forward", "backward")
_SUMMED = ("flops", "matmul_flops", "bytes_io", "recomputed_flops", "recomputed_matmul_flops")


def training_steps(rows: Sequence[Mapping[str, Any]], peak: Mapping[str, Any] | None = None
                   ) -> list[dict[str, Any]]:
    """One row per (run, rank, process, size) that ran backward graphs; ``rows`` as
    ``report.flat_rows`` makes them (merged rows of several ranks are left out)."""
    peak = peak or {}
    by_process: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("rank") != "all" and r.get("graph") != "<forward>" and r.get("calls") and \
                not r.get("warmup"):
            by_process[(r.get("run"), r.get("rank"), r.get("pid"))].append(r)
    out = []
    for (run, rank, pid), proc_rows in by_process.items():
        backward_calls: dict[Any, int] = defaultdict(int)
        for r in proc_rows:
            if r.get("phase") == "backward":
                backward_calls[_frame(r)] += r["calls"]
        if not backward_calls:
            continue
        passes = _passes(proc_rows)
        steps_total = sum(passes.values()) if passes else max(backward_calls.values())
        once_a_step = _once_a_step(proc_rows, steps_total)
        sizes: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for r in proc_rows:
            if r.get("phase") in _TRAINING:
                sizes[str(r["size"])].append(r)
        for size, size_rows in sizes.items():
            if any(r["phase"] == "backward" for r in size_rows):
                row = _step_row(run, rank, pid, size_rows, once_a_step, steps_total, peak,
                                passes.get(size) if passes else None)
                total = size_rows[0].get("collective_bytes_total")
                if total is not None:  # outside the graphs (FSDP2's), per step
                    row["collective_bytes"] = total // max(steps_total, 1)
                out.append(row)
    return out


def _passes(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Backward passes per size, as the process counted them (its backward rows'
    ``backward_passes``; reports from before: empty)."""
    out: dict[str, int] = {}
    for r in rows:
        if r.get("phase") == "backward" and r.get("backward_passes"):
            out[str(r["size"])] = max(out.get(str(r["size"]), 0), r["backward_passes"])
    return out


def _frame(r: Mapping[str, Any]) -> Any:
    """The frame a row's graph was compiled from (reports without it: its own graph), and
    its piece where DDP's optimizer split the frame's graph (every piece runs a step)."""
    frame = r.get("frame")
    if frame is None:
        return ("graph", r.get("source") or r["graph"])
    return ("frame", frame, r.get("piece"))


def _once_a_step(rows: Sequence[Mapping[str, Any]], steps: int
                 ) -> list[Mapping[str, Any]]:
    """Rows of the frames (of graphs not forward or backward) whose calls equal ``steps``.
    A frame that has training graphs is the model's: its other graphs (compiled under
    ``no_grad``, ``phase`` "inference" or none) are evaluation between steps, not in them."""
    training = {_frame(r) for r in rows if r.get("phase") in _TRAINING}
    by_frame: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        frame = _frame(r)
        if r.get("phase") not in (*_TRAINING, "inference") and frame not in training:
            by_frame[frame].append(r)
    return [r for frame_rows in by_frame.values()
            if sum(r["calls"] for r in frame_rows) == steps for r in frame_rows]


def _per_call(rows: Sequence[Mapping[str, Any]], field: str) -> float:
    """Per frame, the calls-weighted mean of ``field`` over its rows; summed over frames."""
    by_frame: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_frame[_frame(r)].append(r)
    return sum(sum((r.get(field) or 0) * r["calls"] for r in fr) / sum(r["calls"] for r in fr)
               for fr in by_frame.values())


def _step_row(run: Any, rank: Any, pid: Any, rows: Sequence[Mapping[str, Any]],
              others: Sequence[Mapping[str, Any]], steps_total: int, peak: Mapping[str, Any],
              passes: int | None = None) -> dict[str, Any]:
    """One step at one size. With the backward passes counted (``passes``): every forward
    and backward graph's figures times its calls, over the passes (a model compiled block
    by block, or split by DDP's optimizer, runs many graphs of one frame each step);
    reports from before: per frame, its calls-weighted mean."""
    fw = [r for r in rows if r["phase"] == "forward"]
    bw = [r for r in rows if r["phase"] == "backward"]
    calls_by_frame: dict[Any, int] = defaultdict(int)
    for r in bw:
        calls_by_frame[_frame(r)] += r["calls"]
    def per_step(rows: Sequence[Mapping[str, Any]], field: str) -> float:
        if not passes:
            return _per_call(rows, field)
        return sum((r.get(field) or 0) * r["calls"] for r in rows) / passes

    def other(field: str) -> float:
        # each frame ran once a step, ``steps_total`` times in all
        return sum((r.get(field) or 0) * r["calls"] for r in others) / steps_total

    row: dict[str, Any] = {
        "run": run, "rank": rank, "pid": pid, "size": bw[0]["size"],
        "steps": passes or max(calls_by_frame.values()),
        "forward_ms": per_step(fw, "median_ms"), "backward_ms": per_step(bw, "median_ms"),
        "other_ms": other("median_ms"),  # medians: a first call's warm-up is no step
        "other_graphs": sorted({r["graph"] for r in others}),
    }
    row["step_ms"] = row["forward_ms"] + row["backward_ms"] + row["other_ms"]
    for field in _SUMMED:
        row[field] = int(per_step(fw, field) + per_step(bw, field) + other(field))
    row["model_flops"] = row["flops"] - row["recomputed_flops"]
    row["backward_flops"] = int(per_step(bw, "flops"))
    seconds = row["step_ms"] / 1e3
    row.update(throughput(row["flops"], row["matmul_flops"], row["bytes_io"], seconds,
                          peak.get("tflops"), peak.get("gbps"),
                          row["recomputed_matmul_flops"]))
    row["model_tflops"] = row["model_flops"] / seconds / 1e12 if seconds > 0 else None
    return row
