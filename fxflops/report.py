"""The JSON report: one file per process (rank), written atomically; load, validate, merge."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxflops import config
from fxflops.cost import CostAt, Count, Rollup
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


def _rank() -> int | None:
    rank = config.RANK.get()
    if rank is not None:
        return rank
    for var in ("RANK", "LOCAL_RANK"):  # torchrun's
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def process_info(info: dict[str, Any]) -> dict[str, Any]:
    import torch

    vllm = sys.modules.get("vllm")
    rank = info.get("rank", _rank())
    return {
        "pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
        "device": info.get("device"), "dtype": info.get("dtype"),
        "torch": torch.__version__, "vllm": getattr(vllm, "__version__", None),
        "argv": sys.argv[:8],
    }


def report_filename(info: dict[str, Any]) -> str:
    rank = info.get("rank", _rank())
    suffix = f"-rank{rank}" if rank is not None else ""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{suffix}.json"


def _rollups(rollups: dict[str, Rollup], limit: int = 50) -> list[dict[str, Any]]:
    return [{"name": k, "flops": _count(r.flops), "matmul_flops": _count(r.matmul_flops),
             "bytes": _count(r.bytes), "nodes": r.count}
            for k, r in list(rollups.items())[:limit]]


def row_figures(row: SizeStats, peak: dict[str, Any]) -> dict[str, Any]:
    pct = row.percentiles()
    runtime_flops = row.runtime_flops / row.runtime_calls if row.runtime_calls else 0
    cost = row.cost
    flops = (cost.flops if cost else 0) + runtime_flops
    matmul = (cost.matmul_flops if cost else 0) + runtime_flops
    bytes_io = cost.bytes_io if cost else 0
    fig: dict[str, Any] = {
        "size": row.size, "key": list(row.key), "calls": row.count,
        "total_ms": row.total_ns / 1e6, **pct,
        "flops": int(flops), "matmul_flops": int(matmul), "runtime_flops": int(runtime_flops),
        "bytes_io": bytes_io, "bytes_nodes": cost.bytes_nodes if cost else 0,
        "gflops": flops / 1e9,
    }
    fig.update(throughput(flops, matmul, bytes_io, pct["median_ms"] / 1e3,
                          peak.get("tflops"), peak.get("gbps")))
    return fig


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


def _with_graph_cost(forward_row: SizeStats, rec: Recorder) -> SizeStats:
    """A whole forward costs what its graphs cost at its size (attention, which runs
    outside piecewise graphs, is added per call from the forward's own run-time count)."""
    costs = [r.cost for g in rec.graphs for r in g.rows.values()
             if r.size == forward_row.size and r.cost is not None]
    forward_row.cost = CostAt(*(sum(c[i] for c in costs) for i in range(4)))
    return forward_row


def build_report(rec: Recorder) -> dict[str, Any]:
    peak = rec.peak()
    graphs = []
    for g in rec.graphs:
        c = g.cost
        graphs.append({
            "id": g.id, "name": g.name, "nodes": c.num_nodes, "meta": g.meta,
            "symbols": [str(s) for s in c.symbols],
            "flops": _count(c.flops), "matmul_flops": _count(c.matmul_flops),
            "bytes_io": _count(c.bytes_io), "bytes_nodes": _count(c.bytes_nodes),
            "runtime_ops": sorted({f"{n.runtime}:{n.op}" for n in c.runtime_nodes}),
            "by_op": _rollups(c.by_op()), "by_module": _rollups(c.by_module()),
            "uncounted": c.uncounted, "dropped_sizes": g.dropped_sizes,
            "rows": [row_figures(r, peak) for r in sorted_rows(g.all_rows())],
        })
    forward = [row_figures(_with_graph_cost(r, rec), peak)
               for r in sorted_rows(rec.forwards.values())]
    return {"schema": SCHEMA, "process": process_info(rec.info), "peak": peak,
            "graphs": graphs, "forward": forward}


def write_atomic(data: dict[str, Any], path: str | os.PathLike[str]) -> str:
    return atomic_text(json.dumps(data, indent=1, default=str), path)


# --- loading ----------------------------------------------------------------------------


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one report file; a ReportError says in one line what is wrong."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{p}: no such file")
    if p.is_dir():
        raise ReportError(f"{p}: is a folder (pass it to load_reports)")
    text = p.read_text(errors="replace")
    if not text.strip():
        raise ReportError(f"{p}: empty file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReportError(f"{p}: not valid JSON (truncated?): {e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("fxflops.report/"):
        raise ReportError(f"{p}: not an fxflops report (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise ReportError(f"{p}: report schema {data['schema']} is not {SCHEMA}")
    for key in ("process", "graphs", "forward"):
        if key not in data:
            raise ReportError(f"{p}: report has no '{key}'")
    data["_path"] = str(p)
    return data


def load_reports(paths: Iterable[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Files, or folders of ``*.json`` reports (non-recursive, ``graphs/`` dumps skipped)."""
    reports = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            files = sorted(f for f in p.glob("*.json") if not f.name.startswith("."))
            if not files:
                raise ReportError(f"{p}: no report files (*.json) in this folder")
            reports += [load_report(f) for f in files]
        else:
            reports.append(load_report(p))
    if not reports:
        raise ReportError("no reports given")
    return _latest_per_process(reports)


def _latest_per_process(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per process: a copy saved elsewhere by the same process is not a rank."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rep in reports:
        p = rep["process"]
        key: tuple[Any, ...] = (p.get("host"), p.get("pid"), p.get("rank"))
        if p.get("pid") is None:
            key = (rep["_path"],)
        old = latest.get(key)
        if old is None or os.path.getmtime(rep["_path"]) >= os.path.getmtime(old["_path"]):
            latest[key] = rep
    return list(latest.values())


def flat_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (graph, size) row of every report, tagged with its rank and process."""
    rows = []
    for rep in reports:
        proc = rep["process"]
        for g in rep["graphs"]:
            for r in g["rows"]:
                rows.append({"rank": proc.get("rank"), "pid": proc.get("pid"),
                             "graph": g["name"], **r})
        for r in rep["forward"]:
            rows.append({"rank": proc.get("rank"), "pid": proc.get("pid"),
                         "graph": "<forward>", **r})
    return rows


def merge_rows(rows: list[dict[str, Any]], peak: dict[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """Merge rows of the same (graph, size) across processes and ranks.

    Another rank adds its shard's work: FLOPs and bytes add up over ranks. Calls add up over
    processes. The median is the slowest rank's (the step waits for it). The rates, MFU and
    roofline then come from ``throughput`` as a single row's do, against the peak of all
    the ranks' devices together (``peak`` per device times the number of ranks).
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["graph"], str(r["size"])), []).append(r)
    peak = peak or {}
    merged = []
    for group in groups.values():
        first_of_rank: dict[Any, dict[str, Any]] = {}
        for r in group:
            first_of_rank.setdefault(r.get("rank"), r)
        shards = list(first_of_rank.values())
        m = {**group[0], "rank": "all", "ranks": len(shards)}
        for f in ("calls", "total_ms"):
            m[f] = sum(r.get(f) or 0 for r in group)
        for f in ("flops", "matmul_flops", "runtime_flops", "bytes_io", "bytes_nodes"):
            m[f] = sum(r.get(f) or 0 for r in shards)
        m["gflops"] = m["flops"] / 1e9
        for f in ("median_ms", "p10_ms", "p90_ms"):
            m[f] = max(r.get(f) or 0 for r in group)
        devices = len(shards)
        tflops, gbps = peak.get("tflops"), peak.get("gbps")
        m.update(throughput(m["flops"], m["matmul_flops"], m["bytes_io"], m["median_ms"] / 1e3,
                            tflops * devices if tflops else None,
                            gbps * devices if gbps else None))
        merged.append(m)
    return merged
