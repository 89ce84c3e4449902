"""The JSON report: one file per process (rank), written atomically; load, validate, merge."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable, Iterable
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


def process_rank() -> int | None:
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
    rank = info.get("rank", process_rank())
    return {
        "pid": os.getpid(), "host": socket.gethostname(), "rank": rank,
        "device": info.get("device"), "dtype": info.get("dtype"),
        "torch": torch.__version__, "vllm": getattr(vllm, "__version__", None),
        "argv": sys.argv[:8],
    }


def report_filename(info: dict[str, Any]) -> str:
    rank = info.get("rank", process_rank())
    suffix = f"-rank{rank}" if rank is not None else ""
    return f"fxflops-{socket.gethostname()}-{os.getpid()}{suffix}.json"


def _rollups(rollups: dict[str, Rollup], limit: int = 50) -> list[dict[str, Any]]:
    return [{"name": k, "flops": _count(r.flops), "matmul_flops": _count(r.matmul_flops),
             "bytes": _count(r.bytes), "nodes": r.count}
            for k, r in list(rollups.items())[:limit]]


def row_figures(row: SizeStats, peak: dict[str, Any]) -> dict[str, Any]:
    """A row's figures; recomputed only when the row changed since they were last made (a
    flush of thousands of sizes redoes only those that ran since the last one)."""
    stamp = (row.count, row.runtime_calls, row.cost, peak.get("tflops"), peak.get("gbps"))
    if row.figures is not None and row.figures[0] == stamp:
        return row.figures[1]
    pct = row.percentiles()
    calls = row.runtime_calls
    runtime_flops = row.runtime_flops / calls if calls else 0
    runtime_bytes = row.runtime_bytes / calls if calls else 0
    cost = row.cost
    flops = (cost.flops if cost else 0) + runtime_flops
    matmul = (cost.matmul_flops if cost else 0) + runtime_flops
    bytes_io = (cost.bytes_io if cost else 0) + int(runtime_bytes)
    fig: dict[str, Any] = {
        "size": row.size, "key": list(row.key), "calls": row.count,
        "total_ms": row.total_ns / 1e6, **pct,
        "flops": int(flops), "matmul_flops": int(matmul), "runtime_flops": int(runtime_flops),
        "runtime_bytes": int(runtime_bytes),
        "bytes_io": bytes_io, "bytes_nodes": cost.bytes_nodes if cost else 0,
        "gflops": flops / 1e9,
        "recomputed_flops": cost.recomputed_flops if cost else 0,
        "recomputed_matmul_flops": cost.recomputed_matmul_flops if cost else 0,
    }
    fig["total_flops"], fig["total_matmul_flops"], fig["total_bytes"], _ = row.totals()
    fig.update(throughput(flops, matmul, bytes_io, pct["median_ms"] / 1e3,
                          peak.get("tflops"), peak.get("gbps"), fig["recomputed_matmul_flops"]))
    row.figures = (stamp, fig)
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


def forward_costs(rec: Recorder) -> None:
    """A whole forward costs what its graphs cost at its size (attention, which runs
    outside piecewise graphs, is added per call from the forward's own run-time count)."""
    by_size: dict[Any, list[CostAt]] = {}
    for g in rec.graphs:
        for r in g.rows.values():
            if r.cost is not None:
                by_size.setdefault(r.size, []).append(r.cost)
    for row in rec.forwards.values():
        costs = by_size.get(row.size, [])
        row.cost = CostAt(*(sum(c[i] for c in costs) for i in range(len(CostAt._fields))))


def padding_figures(row: SizeStats, flops_at: Callable[[int], int | None]) -> dict[str, Any]:
    """What padding cost a whole-forward row: its forwards ran at the row's size with fewer
    tokens scheduled (vLLM pads a step up to the next CUDA-graph size). Token share exact;
    FLOPs share from the graphs' own cost at the scheduled sizes (``flops_at``; None when
    no graph is general enough to tell, and then in proportion to the tokens); the time
    spent on padding is the median apportioned by that FLOPs share (an estimate: a
    memory-bound step costs padding less)."""
    scheduled = row.scheduled or {}
    forwards, real = row.scheduled_tokens()
    size = row.key[0] if row.key else 0
    if not forwards or not size:
        return {"scheduled_tokens": 0, "padding_tokens": 0, "padding_share": 0.0,
                "padding_flops_share": 0.0, "padding_ms": 0.0, "scheduled": {},
                "captured": row.captured}
    padding = forwards * size - real
    full = flops_at(size)
    if full:
        wasted = sum(c * (full - (flops_at(n) or 0)) for n, c in scheduled.items())
        flops_share = wasted / (forwards * full)
    else:
        flops_share = padding / (forwards * size)
    return {"scheduled_tokens": real, "padding_tokens": padding,
            "padding_share": padding / (forwards * size), "padding_flops_share": flops_share,
            "padding_ms": row.percentiles()["median_ms"] * flops_share,
            # the sizes served (what fxflops tune reads), and how many ran as graph replays
            "scheduled": {str(n): c for n, c in sorted(scheduled.items())},
            "captured": row.captured}


def _general_flops(rec: Recorder) -> Callable[[int], int | None]:
    """FLOPs of one forward at ``n`` tokens by the general graphs (those with size symbols,
    every symbol bound to ``n``: vLLM's token count); None without such graphs."""
    general = [g.cost for g in rec.graphs if g.cost.symbols]
    graphs, cache = rec.flops_at_cache  # kept across flushes while no graph is added
    if graphs != len(rec.graphs):
        cache = {}
        rec.flops_at_cache = (len(rec.graphs), cache)

    def flops_at(n: int) -> int | None:
        if n not in cache:
            cache[n] = sum(c.at(n).flops for c in general) if general else None
        return cache[n]

    return flops_at


def graph_summary(g: GraphRecord) -> dict[str, Any]:
    """What a report says of a graph apart from its rows (it never changes: made once)."""
    if g.summary is None:
        c = g.cost
        g.summary = {
            "id": g.id, "name": g.name, "fingerprint": c.fingerprint(), "nodes": c.num_nodes,
            "meta": g.meta, "symbols": [str(s) for s in c.symbols],
            "flops": _count(c.flops), "matmul_flops": _count(c.matmul_flops),
            "bytes_io": _count(c.bytes_io), "bytes_nodes": _count(c.bytes_nodes),
            "runtime_ops": sorted({f"{n.runtime}:{n.op}" for n in c.runtime_nodes}),
            "by_op": _rollups(c.by_op()), "by_module": _rollups(c.by_module()),
            "uncounted": c.uncounted,
        }
    return g.summary


def build_report(rec: Recorder) -> dict[str, Any]:
    peak = rec.peak()
    graphs = [{**graph_summary(g), "dropped_sizes": g.dropped_sizes,
               "rows": [row_figures(r, peak) for r in sorted_rows(g.all_rows())]}
              for g in rec.graphs]
    forward_costs(rec)
    flops_at = _general_flops(rec)
    forward = [{**row_figures(r, peak), **padding_figures(r, flops_at)}
               for r in sorted_rows(rec.forwards.values())]
    import hashlib

    model = hashlib.sha1(",".join(sorted(g["fingerprint"] for g in graphs)).encode())
    run = {"id": rec.run_id, "started": rec.started, "fingerprint": model.hexdigest()[:12]}
    data = {"schema": SCHEMA, "run": run, "process": process_info(rec.info), "peak": peak,
            "graphs": graphs, "forward": forward}
    if any(g.meta.get("phase") == "backward" for g in rec.graphs):
        from fxflops.steps import training_steps

        data["steps"] = training_steps(flat_rows([data]), peak)
    return data


def run_id(report: dict[str, Any]) -> str:
    """The run a report belongs to (reports from before run ids: one run per file)."""
    run = report.get("run") or {}
    return str(run.get("id") or report.get("_path", "?"))


def write_atomic(data: dict[str, Any], path: str | os.PathLike[str]) -> str:
    # compact: json's C encoder (indenting takes its pure-Python path, several times
    # slower on a report of thousands of sizes, and it runs beside the host's work)
    return atomic_text(json.dumps(data, separators=(",", ":"), default=str), path)


# --- loading ----------------------------------------------------------------------------


# a report of every size of a large piecewise model is tens of MB; past this, it is none
MAX_REPORT_BYTES = 512 << 20

_NUMBER = (int, float)
_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "size": (int, str), "calls": (int,), "total_ms": _NUMBER, "median_ms": _NUMBER,
    "p90_ms": _NUMBER, "flops": _NUMBER, "matmul_flops": _NUMBER, "runtime_flops": _NUMBER,
    "bytes_io": _NUMBER,
}
_ROW_OPTIONAL: dict[str, tuple[type, ...]] = {
    "key": (list,), "p10_ms": _NUMBER, "bytes_nodes": _NUMBER, "gflops": _NUMBER,
    "tflops": (*_NUMBER, type(None)), "gbps": (*_NUMBER, type(None)),
    "mfu": (*_NUMBER, type(None)), "hfu": (*_NUMBER, type(None)),
    "recomputed_flops": _NUMBER, "recomputed_matmul_flops": _NUMBER,
    "total_flops": _NUMBER, "total_matmul_flops": _NUMBER, "total_bytes": _NUMBER,
    "scheduled_tokens": _NUMBER, "padding_tokens": _NUMBER, "padding_share": _NUMBER,
    "padding_flops_share": _NUMBER, "padding_ms": _NUMBER, "scheduled": (dict,),
    "captured": (int,),
}
_GRAPH_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "rows": (list,)}
_GRAPH_OPTIONAL: dict[str, tuple[type, ...]] = {
    "meta": (dict,), "symbols": (list,), "uncounted": (dict,), "dropped_sizes": (int,),
    "fingerprint": (str,), "id": (int,)}


def _check(obj: Any, where: str, required: dict[str, tuple[type, ...]],
           optional: dict[str, tuple[type, ...]]) -> None:
    if not isinstance(obj, dict):
        raise ReportError(f"{where}: not an object")
    for fields, needed in ((required, True), (optional, False)):
        for field, types in fields.items():
            if field not in obj:
                if needed:
                    raise ReportError(f"{where}: no '{field}'")
                continue
            value = obj[field]
            if isinstance(value, bool) or not isinstance(value, types):
                raise ReportError(f"{where}: '{field}' is {type(value).__name__}, expected "
                                  + " or ".join(t.__name__ for t in types))


def validate(data: Any, where: str) -> None:
    """Types and required fields of a report, its graphs and rows; one line if wrong."""
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("fxflops.report/"):
        raise ReportError(f"{where}: not an fxflops report (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise ReportError(f"{where}: report schema {data['schema']} is not {SCHEMA}")
    _check(data, where, {"process": (dict,), "graphs": (list,), "forward": (list,)},
           {"run": (dict,), "peak": (dict,), "steps": (list,)})
    for i, g in enumerate(data["graphs"]):
        _check(g, f"{where}: graphs[{i}]", _GRAPH_FIELDS, _GRAPH_OPTIONAL)
        for j, r in enumerate(g["rows"]):
            _check(r, f"{where}: graphs[{i}].rows[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)
    for j, r in enumerate(data["forward"]):
        _check(r, f"{where}: forward[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file fxflops may read: a regular file, under the size cap, valid JSON."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{p}: no such file")
    if p.is_dir():
        raise ReportError(f"{p}: is a folder (pass it to load_reports)")
    if not p.is_file():
        raise ReportError(f"{p}: not a regular file")
    with open(p, "rb") as f:
        raw = f.read(MAX_REPORT_BYTES + 1)
    if len(raw) > MAX_REPORT_BYTES:
        raise ReportError(f"{p}: larger than {MAX_REPORT_BYTES >> 20} MiB: not a report")
    text = raw.decode("utf-8", errors="replace")
    if not text.strip():
        raise ReportError(f"{p}: empty file")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else "too deep"
        raise ReportError(f"{p}: not valid JSON (truncated?): {msg}") from None


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one report file; a ReportError says in one line what is wrong."""
    data = read_json(path)
    validate(data, str(path))
    data["_path"] = str(path)
    return data


def is_export(data: Any) -> bool:
    """What fxflops writes beside reports that is not one: ``report --json`` rows (a list),
    or another fxflops schema."""
    return isinstance(data, list) or (
        isinstance(data, dict) and str(data.get("schema", "")).startswith("fxflops.")
        and not str(data["schema"]).startswith("fxflops.report/"))


def load_reports(paths: Iterable[str | os.PathLike[str]],
                 skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """Files, or folders of ``*.json`` reports (non-recursive, ``graphs/`` dumps skipped).

    A folder is read file by file: with ``skipped`` given, a bad file in it is listed there
    (one line each) and the good ones are still returned; without, the first bad one
    raises. Exports fxflops wrote there (``report --json``) are not reports and are passed
    over. A file named on its own must be a good report.
    """
    reports = []
    for path in paths:
        p = Path(path)
        if not p.is_dir():
            reports.append(load_report(p))
            continue
        files = sorted(f for f in p.glob("*.json") if not f.name.startswith("."))
        found = 0
        for f in files:
            try:
                data = read_json(f)
                if is_export(data):
                    continue
                found += 1
                validate(data, str(f))
                data["_path"] = str(f)
                reports.append(data)
            except ReportError as e:
                if skipped is None:
                    raise
                skipped.append(str(e))
        if not found:
            raise ReportError(f"{p}: no report files (*.json) in this folder")
    if not reports:
        raise ReportError("no readable report among " + ", ".join(map(str, paths)))
    return _latest_per_process(reports)


def _latest_per_process(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per process: a copy saved elsewhere by the same process is not a rank."""
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rep in reports:
        p = rep["process"]
        key: tuple[Any, ...] = (run_id(rep), p.get("host"), p.get("pid"), p.get("rank"))
        if p.get("pid") is None:
            key = (rep["_path"],)
        old = latest.get(key)
        if old is None or os.path.getmtime(rep["_path"]) >= os.path.getmtime(old["_path"]):
            latest[key] = rep
    return list(latest.values())


def flat_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every (graph, size) row of every report, tagged with its run, rank and process.

    Graphs that share a name in one report are kept apart: the second is ``name#2``.
    Rows of a training step's graphs carry their ``phase`` and ``source``.
    """
    rows = []
    for rep in reports:
        proc = rep["process"]
        tags = {"run": run_id(rep), "rank": proc.get("rank"), "pid": proc.get("pid")}
        seen: dict[str, int] = {}
        for g in rep["graphs"]:
            seen[g["name"]] = seen.get(g["name"], 0) + 1
            name = g["name"] if seen[g["name"]] == 1 else f"{g['name']}#{seen[g['name']]}"
            meta = g.get("meta") or {}
            # a training graph's phase, the Dynamo graph it came from, the Python frame
            # (fxflops.autograd, fxflops.steps)
            origin = {k: meta[k] for k in ("phase", "source", "frame") if k in meta}
            for r in g["rows"]:
                rows.append({**tags, "graph": name, "fingerprint": g.get("fingerprint"),
                             **origin, **r})
        for r in rep["forward"]:
            rows.append({**tags, "graph": "<forward>", **r})
    return rows


def merge_rows(rows: list[dict[str, Any]], peak: dict[str, Any] | None = None
               ) -> list[dict[str, Any]]:
    """Merge rows of the same (graph, size) across processes and ranks.

    Another rank adds its shard's work: FLOPs and bytes add up over ranks. Calls add up over
    processes. The median is the slowest rank's (the step waits for it). The rates, MFU and
    roofline then come from ``throughput`` as a single row's do, against the peak of all
    the ranks' devices together (``peak`` per device times the number of ranks).
    """
    groups: dict[tuple[Any, str, str], list[dict[str, Any]]] = {}
    for r in rows:  # never across runs
        groups.setdefault((r.get("run"), r["graph"], str(r["size"])), []).append(r)
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
        for f in ("flops", "matmul_flops", "runtime_flops", "bytes_io", "bytes_nodes",
                  "recomputed_flops", "recomputed_matmul_flops"):
            m[f] = sum(r.get(f) or 0 for r in shards)
        for f in ("total_flops", "total_matmul_flops", "total_bytes"):  # over processes too
            m[f] = sum(r.get(f) or 0 for r in group)
        m["gflops"] = m["flops"] / 1e9
        for f in ("median_ms", "p10_ms", "p90_ms"):
            m[f] = max(r.get(f) or 0 for r in group)
        devices = len(shards)
        tflops, gbps = peak.get("tflops"), peak.get("gbps")
        m.update(throughput(m["flops"], m["matmul_flops"], m["bytes_io"], m["median_ms"] / 1e3,
                            tflops * devices if tflops else None,
                            gbps * devices if gbps else None, m["recomputed_matmul_flops"]))
        merged.append(m)
    return merged
