"""Prometheus counters of the recorder's rows: the rows' totals, never touched per call.

Two ways out, one set of samples (:func:`samples`):

- **files**, at each flush, in ``prometheus_client``'s multi-process format: into
  ``PROMETHEUS_MULTIPROC_DIR`` when it is set (vLLM sets it for several API servers; its
  ``/metrics`` then collects every process's files), else into ``FXFLOPS_PROMETHEUS_DIR``,
  which the vLLM plugin makes in the API server, collects there, and hands down to the
  engine and worker processes (``fxflops.integrations.vllm.plugin``);
- **a collector**, read at scrape time: ``fxflops.recorder().register_prometheus(registry)``
  for any process that serves its own registry.

Names follow Prometheus' conventions: counters end in ``_total``, units are base units
(FLOPs, bytes, seconds). Labels: ``graph``, ``size`` and ``rank``. The label sets stay
bounded: per graph, the first ``FXFLOPS_PROMETHEUS_SIZES`` sizes seen keep a ``size`` label
of their own (so a size's counter never changes label); calls at any other size, and the
graph's overflow row, add up under ``size="other"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from fxflops import config

if TYPE_CHECKING:
    from fxflops.recording import Recorder
    from fxflops.stats import SizeStats

OTHER = "other"

# (name without _total, help); the same for compiled graphs and whole forwards
_ROW_COUNTERS = (
    ("calls", "calls"),
    ("flops", "FLOPs done (matmul and vector; attention counted from real context lengths)"),
    ("matmul_flops", "matmul-class FLOPs done (what MFU is measured on)"),
    ("bytes", "bytes moved (inputs, outputs and weights; the KV cache attention reads)"),
    ("seconds", "device seconds (CUDA events on a GPU, the CPU clock on CPU)"),
)
_FORWARD_COUNTERS = (
    ("tokens", "tokens the forwards ran at (padded up to a CUDA-graph size)"),
    ("scheduled_tokens", "tokens the scheduler gave the forwards (the rest is padding)"),
)
_GAUGES = (
    ("fxflops_peak_flops_per_second", "the device's peak FLOP/s (MFU = rate(matmul FLOPs) / "
     "this)", "tflops", 1e12),
    ("fxflops_peak_bytes_per_second", "the device's peak memory bandwidth, bytes/s", "gbps",
     1e9),
)


class Sample(NamedTuple):
    kind: str  # "counter" or "gauge"
    family: str  # the metric's name (a counter's without "_total")
    help: str
    labels: tuple[tuple[str, str], ...]
    value: float


def samples(rec: Recorder) -> list[Sample]:
    """Every counter and gauge of this process, from its rows as they are now."""
    from fxflops.report import forward_cost, forward_costs, process_rank

    rank = rec.info.get("rank", process_rank())
    rank_label = str(rank) if rank is not None else "0"
    limit = config.PROMETHEUS_SIZES.get()
    out: list[Sample] = []
    for g in rec.graphs_snapshot():
        estimated = g.cost.estimated
        for size, rows in _bounded(list(g.rows.values()), g.overflow, limit):
            labels: tuple[tuple[str, str], ...] = (("graph", g.name), ("size", size),
                                                   ("rank", rank_label))
            out += _row_samples("fxflops_graph", "compiled graph", labels, rows)
            if estimated:
                value = sum((r.cost.estimated_flops if r.cost else 0) * r.count for r in rows)
                out.append(Sample("counter", "fxflops_graph_estimated_flops",
                                  "fxflops: matmul FLOPs counted from layers' sizes (an op no "
                                  "formula counts right; see fxflops_graph_estimated_layers)",
                                  labels, value))
        ops: dict[str, int] = {}
        for e in estimated:
            for op in e.ops:
                ops[op] = ops.get(op, 0) + 1
        for op, count in sorted(ops.items()):
            out.append(Sample("gauge", "fxflops_graph_estimated_layers",
                              "fxflops: layers counted from their sizes because no formula "
                              "counts this op (the report names them)",
                              (("graph", g.name), ("op", op), ("rank", rank_label)), count))
    costs = forward_costs(rec)
    for size, rows in _bounded(rec.forwards_snapshot(), None, limit):
        labels = (("size", size), ("rank", rank_label))
        out += _row_samples("fxflops_forward", "whole forward (vLLM)", labels, rows,
                            [forward_cost(costs, r) for r in rows])
        per_row = [(int(r.key[0]) if r.key else 0, *r.scheduled_tokens()) for r in rows]
        padded = sum(size * forwards for size, forwards, _ in per_row)
        scheduled = sum(tokens for _, _, tokens in per_row)
        for (name, text), value in zip(_FORWARD_COUNTERS, (padded, scheduled)):
            out.append(Sample("counter", f"fxflops_forward_{name}", f"fxflops: {text}",
                              labels, value))
    for entry in list(rec.uninstrumented):
        out.append(Sample("counter", "fxflops_uninstrumented_calls",
                          "fxflops: calls of a graph fxflops could not instrument (the report "
                          "says why)", (("graph", entry.name), ("rank", rank_label)),
                          entry.calls))
    peak = rec.peak()
    for name, text, field, unit in _GAUGES:
        if peak.get(field):
            out.append(Sample("gauge", name, f"fxflops: {text}", (("rank", rank_label),),
                              float(peak[field]) * unit))
    return out


def _bounded(rows: Any, overflow: SizeStats | None, limit: int
             ) -> Iterator[tuple[str, list[SizeStats]]]:
    """(size label, rows) with at most ``limit`` labels of their own and ``"other"``."""
    rest: list[SizeStats] = [overflow] if overflow is not None and overflow.count else []
    for i, row in enumerate(rows):  # in the order sizes were first seen
        if i < limit:
            if row.count:
                yield str(row.size), [row]
        else:
            rest.append(row)
    if rest:
        yield OTHER, rest


def _row_samples(prefix: str, what: str, labels: tuple[tuple[str, str], ...],
                 rows: list[SizeStats], costs: list[Any] | None = None) -> list[Sample]:
    flops = matmul = bytes_ = calls = 0
    ns = 0
    for i, r in enumerate(rows):
        f, m, b, n = r.totals(costs[i] if costs is not None else None)
        flops, matmul, bytes_, calls, ns = flops + f, matmul + m, bytes_ + b, calls + n, \
            ns + r.total_ns
    values = (calls, flops, matmul, bytes_, ns / 1e9)
    return [Sample("counter", f"{prefix}_{name}", f"fxflops: {what}: {text}", labels, value)
            for (name, text), value in zip(_ROW_COUNTERS, values)]


# --- at flush time: prometheus_client's multi-process files ----------------------------


def files_dir() -> str | None:
    """Where this process writes its counters' files: ``PROMETHEUS_MULTIPROC_DIR`` (which
    vLLM's ``/metrics`` collects), else ``FXFLOPS_PROMETHEUS_DIR``; None: neither is set."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or config.PROMETHEUS_DIR.get()


_open: dict[tuple[str, int, str], Any] = {}  # (folder, pid, kind) -> MmapedDict


def write_files(rec: Recorder, directory: str) -> int:
    """Write every sample into this process's files in ``directory`` (values, not
    increments: a counter file holds this process's totals). Returns the samples written."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    pid = os.getpid()
    written = 0
    for s in samples(rec):
        # the type is the file name's first part; a gauge's aggregation its second (max:
        # one value per rank); "fxflops-<pid>" keeps fxflops' files apart from vLLM's own
        kind = "counter" if s.kind == "counter" else "gauge_max"
        slot = (directory, pid, kind)
        mmap = _open.get(slot)
        if mmap is None:
            mmap = _open[slot] = MmapedDict(os.path.join(directory, f"{kind}_fxflops-{pid}.db"))
        sample_name = f"{s.family}_total" if s.kind == "counter" else s.family
        names, values = [k for k, _ in s.labels], [v for _, v in s.labels]
        mmap.write_value(mmap_key(s.family, sample_name, names, values, s.help), s.value, 0.0)
        written += 1
    return written


# --- at scrape time: a collector of a live recorder ------------------------------------


class RecorderCollector:
    """A ``prometheus_client`` collector of one recorder's samples, read at each scrape."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, Any] = {}
        for s in samples(self.rec):
            family = families.get(s.family)
            if family is None:
                make = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                family = families[s.family] = make(s.family, s.help,
                                                   labels=[k for k, _ in s.labels])
            family.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()
