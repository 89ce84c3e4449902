"""The report's schema: its version, the rows it holds as types (``RowFigures``,
``GraphRow``, ``FlatRow``, ``PeakFigures``: what crosses from the recorder to the report,
the outputs and the CLI), and the validation that refuses, in one line for the user, any
report that is not whole and sane (``ReportError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypedDict

from fxflops.placement import FIELDS as PLACEMENT_FIELDS

SCHEMA = "fxflops.report/1"


# --- the rows, as types (at run time they are the dicts the JSON holds) ----------------------


class PeakFigures(TypedDict):
    """A report's ``peak``: the device's dense TFLOP/s for the dtype, its GB/s, and where
    they come from (``table:<device>:<dtype>``, ``measured``, ``derived: ...``, ``env``,
    ``none``)."""

    tflops: float | None
    gbps: float | None
    source: str


class Throughput(TypedDict):
    """Achieved rates and the roofline verdict (``figures.throughput``)."""

    tflops: float | None
    gbps: float | None
    mfu: float | None
    hfu: float | None
    intensity: float | None
    bound: str | None
    roofline_ms: float | None
    roofline_share: float | None


class _RowFiguresAlways(Throughput):
    size: int | str
    key: list[int]
    calls: int
    chosen_calls: int
    timed_calls: int
    lost_samples: int
    total_ms: float
    median_ms: float
    p10_ms: float
    p90_ms: float
    flops: int
    matmul_flops: int
    runtime_flops: int
    runtime_bytes: int
    total_runtime_flops: int
    total_runtime_bytes: int
    bytes_io: int
    bytes_nodes: int
    gflops: float
    recomputed_flops: int
    recomputed_matmul_flops: int
    estimated_flops: int
    total_flops: int
    total_matmul_flops: int
    total_bytes: int


class Padding(TypedDict, total=False):
    """What padding cost a whole forward's row (``figures.padding_figures``)."""

    scheduled_tokens: int
    padding_tokens: int
    padding_share: float
    padding_flops_share: float
    padding_ms: float
    scheduled: dict[str, int]
    captured: int


class KernelFigures(TypedDict, total=False):
    """A mapped graph's row's kernels (``figures.kernel_figures``)."""

    kernels: list[dict[str, Any]]
    kernels_profile: dict[str, Any]


class RowFigures(_RowFiguresAlways, Padding, KernelFigures, total=False):
    """One (graph, size) row of a report (``graphs[i].rows``, ``forward``, ``warmup``):
    what ``figures.row_figures`` makes, and what some rows add (docs/reference.md)."""

    # a whole forward's run-time FLOPs per call by kind
    runtime_kinds: dict[str, float]
    # a row timed by CUDA events: "host" where most samples were paced by the host's
    # launches (the device idle), else "device"; those samples; and the samples shared
    # with another thread's call open on the device at once (recording/cuda_events.py)
    time_bound: str
    host_bound_calls: int
    shared_calls: int
    # a backward graph's: the process's backward passes at this size
    backward_passes: int
    # a warm-up row's phase
    warmup: str


class GraphRow(RowFigures):
    """A row of ``fxflops.recorder().stats()`` and ``fxflops.scope().rows()``: a report
    row with its graph's name and id."""

    graph: str
    graph_id: int


class FlatRow(RowFigures, total=False):
    """A row of ``rows.flat_rows``: a report row tagged with its run, process, placement
    and graph (what merges, tables and plots read)."""

    graph: str
    run: str
    rank: int | str | None
    pid: int | None
    place: str
    fingerprint: str | None
    phase: str | None
    source: str | None
    frame: int | str | None
    piece: int | None
    workload: str | None
    collective_bytes_total: int
    world: int | None
    dp: int | None
    dp_size: int | None
    pp: int | None
    pp_size: int | None
    tp: int | None
    tp_size: int | None
    node: int | None
    nodes: int | None


class ReportError(ValueError):
    """A report that cannot be read: the message is one line for the user."""


# Every number in a report is a count, a time, FLOPs, bytes, or a rate or share of them:
# never negative, never NaN or infinite, and far below 1e30 (a year at an exaFLOP/s is
# 3e25 FLOPs). Past that, a number is damage, and the CLI's sums, products and float
# conversions of it would overflow.
MAX_NUMBER = 10**30


# a size is a tensor dimension (or, for ``BxS``, a product of them): an int64
MAX_SIZE = 2**63 - 1


_LIMITS = {MAX_NUMBER: "1e30", MAX_SIZE: "2**63-1 (a size)"}


_NUMBER = (int, float)


_MAYBE_NUMBER = (int, float, type(None))


_MAYBE_STR = (str, type(None))


_MAYBE_INT = (int, type(None))


_ROW_FIELDS: dict[str, tuple[type, ...]] = {
    "size": (int, str), "calls": (int,), "total_ms": _NUMBER, "median_ms": _NUMBER,
    "p90_ms": _NUMBER, "flops": _NUMBER, "matmul_flops": _NUMBER, "runtime_flops": _NUMBER,
    "bytes_io": _NUMBER,
}


_ROW_OPTIONAL: dict[str, tuple[type, ...]] = {
    "key": (list,), "p10_ms": _NUMBER, "bytes_nodes": _NUMBER, "gflops": _NUMBER,
    "tflops": _MAYBE_NUMBER, "gbps": _MAYBE_NUMBER, "mfu": _MAYBE_NUMBER, "hfu": _MAYBE_NUMBER,
    "intensity": _MAYBE_NUMBER, "bound": _MAYBE_STR, "roofline_ms": _MAYBE_NUMBER,
    "roofline_share": _MAYBE_NUMBER, "runtime_bytes": _NUMBER,
    "recomputed_flops": _NUMBER, "recomputed_matmul_flops": _NUMBER,
    "total_flops": _NUMBER, "total_matmul_flops": _NUMBER, "total_bytes": _NUMBER,
    "total_runtime_flops": _NUMBER, "total_runtime_bytes": _NUMBER,
    "scheduled_tokens": _NUMBER, "padding_tokens": _NUMBER, "padding_share": _NUMBER,
    "padding_flops_share": _NUMBER, "padding_ms": _NUMBER, "scheduled": (dict,),
    "captured": (int,), "timed_calls": (int,), "lost_samples": (int,), "chosen_calls": (int,),
    "time_bound": (str,), "host_bound_calls": (int,), "shared_calls": (int,),
    "estimated_flops": _NUMBER, "backward_passes": (int,), "kernels": (list,),
    "kernels_profile": (dict,),
    "collective_bytes_total": (int,),
    # what flat_rows and the CLI add to a row: a row's own would override them, so they
    # must be what the CLI groups by and prints (hashable, text)
    "graph": (str,), "graph_id": (int,), "run": (str,), "rank": (int, str, type(None)),
    "pid": _MAYBE_INT, "fingerprint": _MAYBE_STR, "phase": _MAYBE_STR,
    "source": _MAYBE_STR, "frame": (int, str, type(None)), "ranks": (int,), "piece": _MAYBE_INT,
    "outside_share": _MAYBE_NUMBER, "graphs_ms": _NUMBER, "place": (str,), "stage": (str,),
    "warmup": (str,), "workload": _MAYBE_STR,
    **{f: _MAYBE_INT for f in PLACEMENT_FIELDS if f != "rank"},
}


_GRAPH_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "rows": (list,)}


_GRAPH_OPTIONAL: dict[str, tuple[type, ...]] = {
    "meta": (dict,), "symbols": (list,), "uncounted": (dict,), "dropped_sizes": (int,),
    "fingerprint": (str,), "id": (int,), "nodes": (int,),
    # an int for a static graph, else the expression of its size symbols
    "flops": (int, str), "matmul_flops": (int, str), "bytes_io": (int, str),
    "bytes_nodes": (int, str), "runtime_ops": (list,), "by_op": (list,), "by_module": (list,),
    "layers": (dict,), "warmup": (list,), "kernels": (list,),
    # what each size symbol is (absent from reports written before it)
    "symbol_sources": (list,)}


# one size symbol: ``where`` is what the CLI prints (``s70 = input_ids.size(1)``)
_SYMBOL_FIELDS: dict[str, tuple[type, ...]] = {"symbol": (str,), "where": (str,)}


_SYMBOL_OPTIONAL: dict[str, tuple[type, ...]] = {
    "source": _MAYBE_STR, "input": _MAYBE_STR, "dim": _MAYBE_INT}


_LAYERS_OPTIONAL: dict[str, tuple[type, ...]] = {"checked": (int,), "estimated": (list,)}


_UNINSTRUMENTED_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "reason": (str,), "calls": (int,)}


_ESTIMATED_FIELDS: dict[str, tuple[type, ...]] = {
    "layer": (str,), "ops": (list,), "flops": (int, str)}


# the meta fields the CLI reads (steps group by frame, tune by compile size)
_GRAPH_META: dict[str, tuple[type, ...]] = {
    "phase": _MAYBE_STR, "source": _MAYBE_STR, "frame": (int, str, type(None)),
    "compile_size": _MAYBE_INT, "piece": _MAYBE_INT, "workload": _MAYBE_STR}


_PROCESS_OPTIONAL: dict[str, tuple[type, ...]] = {
    "pid": _MAYBE_INT, "rank": (int, str, type(None)), "host": _MAYBE_STR, "ranks": (dict,),
    # an engine integration's features that are off in this process: feature -> why
    "features_off": (dict,)}


_RUN_OPTIONAL: dict[str, tuple[type, ...]] = {
    "id": _MAYBE_STR, "started": _MAYBE_NUMBER, "fingerprint": _MAYBE_STR}


_PEAK_OPTIONAL: dict[str, tuple[type, ...]] = {
    "tflops": _MAYBE_NUMBER, "gbps": _MAYBE_NUMBER, "source": _MAYBE_STR}


# numbers bounded as sizes, not as counts
_SIZE_FIELDS = frozenset({"size", "compile_size"})


def _show(value: Any) -> str:
    """A value, short enough for a one-line message."""
    if isinstance(value, int) and abs(value) > MAX_NUMBER:
        return f"a {int(math.log10(abs(value))) + 1}-digit number"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_count(value: Any, low: int = 0, high: int = MAX_NUMBER) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number_problem(value: float, limit: int) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"is {value!r}: not a finite number"
    if value < 0:
        return f"is {_show(value)}: negative (no count, time, FLOPs or bytes is)"
    if value > limit:
        return f"is {_show(value)}: more than {_LIMITS[limit]}"
    return None


def _size_label_problem(size: str) -> str | None:
    """A ``BxS`` label must parse as ``stats.parse_size`` reads it (ASCII digits, whose
    product is a size); any other label ("overflow", "static") is only shown."""
    parts = size.split("x")
    if not all(p.isdigit() for p in parts):
        return None
    problem = f"is {_show(size)}: not a size (ASCII digits, product at most 2**63-1)"
    if not all(p.isascii() and len(p) <= 19 for p in parts):
        return problem
    numbers = [int(p) for p in parts]
    if 0 in numbers:
        return None
    product = 1
    for n in numbers:
        product *= n
        if product > MAX_SIZE:  # stop early: thousands of parts must not build a huge int
            return problem
    return None


def _key_problem(key: list[Any]) -> str | None:
    bad = [k for k in key if not _is_count(k, 0, MAX_SIZE)]
    return f"holds {_show(bad[0])}: expected sizes (whole numbers from 0)" if bad else None


def _scheduled_problem(scheduled: dict[Any, Any]) -> str | None:
    """Forwards per scheduled token count (``{"3": 5}``): both at least 1 (tune divides
    by them)."""
    for tokens, forwards in scheduled.items():
        text = str(tokens)  # int() of thousands of digits would raise: length first
        if not (text.isascii() and text.isdigit() and len(text) <= 19
                and _is_count(int(text), 1, MAX_SIZE) and _is_count(forwards, 1)):
            return (f"holds {_show(tokens)}: {_show(forwards)}: expected token counts and "
                    "forwards, whole numbers from 1")
    return None


def _uncounted_problem(uncounted: dict[Any, Any]) -> str | None:
    bad = next((k for k, v in uncounted.items() if not _is_count(v)), None)
    return None if bad is None else (
        f"holds {_show(bad)}: {_show(uncounted[bad])}: expected a count of calls")


# what a field holds, past its type
_CONTENTS: dict[str, Callable[[Any], str | None]] = {
    "size": _size_label_problem, "key": _key_problem, "scheduled": _scheduled_problem,
    "uncounted": _uncounted_problem}


def _value_problem(field: str, value: Any) -> str | None:
    if isinstance(value, _NUMBER):
        return _number_problem(value, MAX_SIZE if field in _SIZE_FIELDS else MAX_NUMBER)
    check = _CONTENTS.get(field)
    return check(value) if check is not None else None


def _check(obj: Any, where: str, required: dict[str, tuple[type, ...]],
           optional: dict[str, tuple[type, ...]]) -> None:
    """Types, then values (finite, in range, never negative) of an object's fields."""
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
            problem = _value_problem(field, value)
            if problem is not None:
                raise ReportError(f"{where}: '{field}' {problem}")


def _check_engine(engine: Any, where: str) -> None:
    """The engine's own figures (``fxflops.report.engine``)."""
    _check(engine, where, {}, {"estimate": (list,), "estimate_vs_measured": (list,),
                               "spec_decode": (dict,)})
    for i, r in enumerate(engine.get("estimate") or []):
        _check(r, f"{where}.estimate[{i}]", {f: (int,) for f in (
            "size", "steps", "flops", "read_bytes", "write_bytes")}, {"components": (dict,)})
    for i, r in enumerate(engine.get("estimate_vs_measured") or []):
        _check(r, f"{where}.estimate_vs_measured[{i}]",
               {"size": (int, str), "steps": (int,), "estimate_steps": (int,),
                "measured": (dict,), "estimate": (dict,), "differs": (list,)},
               {"ratio": (float, int, type(None))})
    if "spec_decode" in engine:
        _check(engine["spec_decode"], f"{where}.spec_decode",
               {f: (int,) for f in ("drafts", "proposed", "accepted", "rejected")},
               {"acceptance_rate": (float, int), "rejected_flops": (int, type(None))})


def validate(data: Any, where: str) -> None:
    """Types, values and required fields of a report, its graphs and rows; one line if
    wrong. What passes, the CLI can sum, divide, format and group without failing."""
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith("fxflops.report/"):
        raise ReportError(f"{where}: not an fxflops report (no 'schema': '{SCHEMA}')")
    if data["schema"] != SCHEMA:
        raise ReportError(f"{where}: report schema {data['schema'][:60]} is not {SCHEMA}")
    _check(data, where, {"process": (dict,), "graphs": (list,), "forward": (list,)},
           {"run": (dict,), "peak": (dict,), "steps": (list,), "uninstrumented": (list,),
            "forward_warmup": (list,), "draft_forward": (list,), "collectives": (dict,),
            "timing": (dict,), "engine": (dict,)})
    if "engine" in data:
        _check_engine(data["engine"], f"{where}: engine")
    if "timing" in data:
        _check(data["timing"], f"{where}: timing", {}, {k: (int,) for k in (
            "in_flight", "dropped", "replays", "captures_in_progress")})
    for kind, v in (data.get("collectives") or {}).items():
        _check(v, f"{where}: collectives.{kind}", {"calls": (int,), "bytes": (int,)}, {})
    for i, u in enumerate(data.get("uninstrumented") or []):
        _check(u, f"{where}: uninstrumented[{i}]", _UNINSTRUMENTED_FIELDS, {})
    _check(data["process"], f"{where}: process", {}, _PROCESS_OPTIONAL)
    for feature, why in (data["process"].get("features_off") or {}).items():
        if not isinstance(why, str):
            raise ReportError(f"{where}: process.features_off[{feature[:40]!r}] is "
                              f"{type(why).__name__}, expected str")
    if "ranks" in data["process"]:
        _check(data["process"]["ranks"], f"{where}: process.ranks", {},
               {f: (int,) for f in PLACEMENT_FIELDS})
    for part, fields in (("run", _RUN_OPTIONAL), ("peak", _PEAK_OPTIONAL)):
        if part in data:
            _check(data[part], f"{where}: {part}", {}, fields)
    for i, g in enumerate(data["graphs"]):
        _check(g, f"{where}: graphs[{i}]", _GRAPH_FIELDS, _GRAPH_OPTIONAL)
        if "meta" in g:
            _check(g["meta"], f"{where}: graphs[{i}].meta", {}, _GRAPH_META)
        for k, named in enumerate(g.get("symbol_sources", [])):
            _check(named, f"{where}: graphs[{i}].symbol_sources[{k}]", _SYMBOL_FIELDS,
                   _SYMBOL_OPTIONAL)
        if "layers" in g:
            _check(g["layers"], f"{where}: graphs[{i}].layers", {}, _LAYERS_OPTIONAL)
            for k, e in enumerate(g["layers"].get("estimated", [])):
                _check(e, f"{where}: graphs[{i}].layers.estimated[{k}]", _ESTIMATED_FIELDS, {})
        for part in ("rows", "warmup"):
            for j, r in enumerate(g.get(part, [])):
                _check(r, f"{where}: graphs[{i}].{part}[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)
    for part in ("forward", "forward_warmup", "draft_forward"):
        for j, r in enumerate(data.get(part, [])):
            _check(r, f"{where}: {part}[{j}]", _ROW_FIELDS, _ROW_OPTIONAL)


