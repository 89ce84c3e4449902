"""Annotated graph dumps: the graph as readable Python, each node's cost as a comment.

Written under ``$FXFLOPS_OUT/graphs/`` (one file per graph, and one per size once sizes
are seen), under ``$FXFLOPS_DUMP_DIR`` (the vLLM integration sets it to
``<debug_dump_path>/rank_i_j/fxflops`` beside depyf's dump), and emitted through
``torch._logging.trace_structured`` so that ``tlparse`` shows it. A graph is dumped when it
is registered (``dump_graph``, from ``instrument.plan``); its sizes at each flush
(``SizeDumps``, a sink of the recorder).
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fxflops import config, torch_compat
from fxflops.cost.graph_cost import Count, GraphCost, NodeCost, evaluate
from fxflops.recording.recorder import Sink, Snapshot
from fxflops.util import atomic_text, host_raised, human, warn_once

if TYPE_CHECKING:
    from fxflops.recording.store import GraphRecord

_ASSIGN = re.compile(r"^\s+(\w+)\s*(?::\s*\"[^\"]*\"\s*)?=")


def readable_source(gm: torch.fx.GraphModule) -> list[str]:
    text = gm.print_readable(print_output=False, include_stride=False, include_device=False)
    return text.rstrip().splitlines()


def _fmt(count: Count, binding: Mapping[Any, int] | None, unit: str) -> str:
    if isinstance(count, int):
        return human(count, unit)
    if binding is not None:
        return human(evaluate(count, binding), unit)
    return f"{count} {unit}".rstrip()


def annotate(lines: list[str], cost: GraphCost, name: str,
             binding: Mapping[Any, int] | None = None, size: Any = None,
             kernels: list[Any] | None = None) -> str:
    """The graph's source with a cost comment on every costed node and a header of totals.

    With ``binding`` (a size), every figure is a number; without, dynamic graphs show the
    expressions of their size symbols. With ``kernels`` (``fxflops.cost.kernels``): each node
    says the kernel(s) Inductor computed it in, and the header lists every kernel's cost.
    """
    by_name: dict[str, NodeCost] = {n.name: n for n in cost.nodes}
    kernel_of: dict[str, list[str]] = {}
    for k in kernels or []:
        for node in k.nodes:
            kernel_of.setdefault(node, []).append(k.name)
    flops_total = evaluate(cost.flops, binding or {}) if binding is not None or \
        not cost.symbols else None

    def node_flops(n: NodeCost) -> int | None:
        if binding is None and cost.symbols:
            return None
        return evaluate(n.flops, binding or {})

    out = []
    for line in lines:
        m = _ASSIGN.match(line)
        n = by_name.get(m.group(1)) if m else None
        if n is not None and (n.flops != 0 or n.bytes != 0 or n.runtime or n.uncounted):
            parts = [f"{_fmt(n.flops, binding, 'FLOP')}"]
            f = node_flops(n)
            if f is not None and flops_total:
                parts[0] += f" ({100 * f / flops_total:.1f}%)"
            if n.matmul_flops != 0:
                parts.append("matmul")
            parts.append(_fmt(n.bytes, binding, "B"))
            if n.runtime:
                parts.append(f"+ {n.runtime} at run time: {n.runtime_coeff} FLOP/pair, "
                             f"{n.runtime_bytes} B/context token")
            if n.uncounted:
                parts.append("UNCOUNTED: " + ", ".join(n.uncounted))
            if n.module:
                parts.append(n.module)
            line = f"{line}  # {'; '.join(parts)}"
        if n is not None and kernels is not None:
            line += ("  # " if "  # " not in line else "; ") + (
                "kernel " + ", ".join(kernel_of[n.name]) if n.name in kernel_of
                else "in no kernel")
        out.append(line)
    return header(cost, name, binding, size) + kernel_header(kernels, binding) + \
        "\n".join(out) + "\n"


def kernel_header(kernels: list[Any] | None, binding: Mapping[Any, int] | None) -> str:
    """The kernels Inductor made of the graph, in the order it runs them, with their
    FLOPs, matmul FLOPs and boundary bytes (at the size, or as expressions)."""
    if not kernels:
        return ""
    lines = [f"# kernels ({len(kernels)}, in the order they run):"]
    if binding is not None:
        from fxflops.cost.kernels import at_size

        for k, fig in zip(kernels, at_size(kernels, binding)):
            intensity = fig["flops"] / fig["bytes"] if fig["bytes"] else 0.0
            lines.append(f"#   {k.name:<44} {human(fig['flops'], 'FLOP')}"
                         f"{' (matmul)' if fig['matmul_flops'] else ''}, "
                         f"{human(fig['bytes'], 'B')}, {intensity:.1f} FLOP/B; "
                         f"{len(k.nodes)} nodes")
    else:
        for k in kernels:
            lines.append(f"#   {k.name:<44} {_fmt(k.flops, None, 'FLOP')}, "
                         f"{_fmt(k.bytes, None, 'B')}; {len(k.nodes)} nodes")
    return "\n".join(lines) + "\n\n"


def header(cost: GraphCost, name: str, binding: Mapping[Any, int] | None, size: Any) -> str:
    def fmt(c: Count, unit: str) -> str:
        return _fmt(c, binding, unit) + (f"   [{c}]" if not isinstance(c, int) else "")

    vector = cost.vector_flops
    lines = [
        f"# fxflops: graph {name}" + (f" at size {size}" if size is not None else ""),
        f"# nodes: {cost.num_nodes}; size symbols: {', '.join(map(str, cost.symbols)) or 'none'}",
        *symbol_lines(cost, binding),
        f"# FLOPs:         {fmt(cost.flops, 'FLOP')}",
        f"#   matmul:      {fmt(cost.matmul_flops, 'FLOP')}",
        f"#   vector:      {fmt(vector, 'FLOP')}",
        f"# bytes (I/O):   {fmt(cost.bytes_io, 'B')}",
        f"# bytes (nodes): {fmt(cost.bytes_nodes, 'B')}",
    ]
    if cost.runtime_nodes:
        lines.append(f"# run-time costed: {len(cost.runtime_nodes)} nodes "
                     "(attention: FLOPs from the KV lengths of each call)")
    if cost.uncounted:
        lines.append("# UNCOUNTED ops (0 FLOPs): " + ", ".join(
            f"{k} x{v}" for k, v in cost.uncounted.items()))
    lines.append("# top modules:")
    for mod, r in list(cost.by_module().items())[:5]:
        lines.append(f"#   {mod:<40} {_fmt(r.flops, binding, 'FLOP')}")
    lines.append("# top nodes:")
    top = sorted(cost.nodes, key=lambda n: evaluate(n.flops, binding) if binding is not None
                 else _at64(n.flops), reverse=True)[:5]
    for n in top:
        lines.append(f"#   {n.name:<40} {_fmt(n.flops, binding, 'FLOP')}  ({n.op})")
    return "\n".join(lines) + "\n\n"


def symbol_lines(cost: GraphCost, binding: Mapping[Any, int] | None) -> list[str]:
    """What each size symbol is (``#   s70 = input_ids.size(1)``), its value at the size,
    Dynamo's own name of it and the input of this graph it is read from (a piece's own)."""
    values = {str(s): v for s, v in (binding or {}).items()}
    lines = []
    for named in cost.symbol_sources:
        line = f"#   {named}" + (f" = {values[named.symbol]}" if named.symbol in values else "")
        notes = ([f"Dynamo: {named.source}"] if named.source else []) + (
            [f"this graph reads it from {named.read_from}"] if named.read_from else [])
        lines.append(line + (f"   [{'; '.join(notes)}]" if notes else ""))
    return lines


def _at64(c: Count) -> int:
    return c if isinstance(c, int) else int(c.xreplace({s: 64 for s in c.free_symbols}))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def dump_graph(gm: torch.fx.GraphModule | None, record: GraphRecord) -> None:
    """Dump the symbolic annotation now; sized dumps follow as sizes are seen. ``gm``
    None: the graph dumped before, again (its kernels are known now)."""
    lines = readable_source(gm) if gm is not None else _LISTINGS.get(record)
    if lines is None:
        return
    _LISTINGS[record] = lines
    text = annotate(lines, record.cost, record.name, kernels=record.kernels)
    # FXFLOPS_DUMP_DIR: set by the vLLM integration to sit beside depyf's dump
    dirs = [d for d in (_out_dir(), config.DUMP_DIR.get()) if d]
    for d in dirs:
        atomic_text(text, os.path.join(d, f"{_safe(record.name)}.py"))
    try:
        trace_structured = torch_compat.get("trace_structured")
        trace_structured("artifact", metadata_fn=lambda: {
            "name": f"fxflops_{_safe(record.name)}", "encoding": "string"},
            payload_fn=lambda: text)
    except Exception:
        pass


# per-size dumps per graph: the first sizes seen; the symbolic dump covers every other one
MAX_SIZE_DUMPS = 64
# this module's state beside the store's graphs: each graph's source, and the sizes dumped
_LISTINGS: weakref.WeakKeyDictionary[GraphRecord, list[str]] = weakref.WeakKeyDictionary()
_DUMPED: weakref.WeakKeyDictionary[GraphRecord, set[Any]] = weakref.WeakKeyDictionary()


def dump_sizes(record: GraphRecord) -> None:
    """One dump per size seen so far, each written once, for the first ``MAX_SIZE_DUMPS``
    sizes (called when a report is flushed, never per call)."""
    lines = _LISTINGS.get(record)
    out = _out_dir()
    if not lines or not out or not record.cost.symbols:
        return
    done = _DUMPED.setdefault(record, set())
    for raw_key, row in list(record.rows.items()):
        if len(done) >= MAX_SIZE_DUMPS:
            return
        if raw_key in done:
            continue
        binding = dict(zip(record.cost.symbols, row.key))
        text = annotate(lines, record.cost, record.name, binding, row.size, record.kernels)
        atomic_text(text, os.path.join(out, f"{_safe(record.name)}.size{_safe(str(row.size))}.py"))
        done.add(raw_key)


def _out_dir() -> str | None:
    out = config.OUT.get()
    return os.path.join(out, "graphs") if out else None


class SizeDumps(Sink):
    """At each flush (with ``$FXFLOPS_OUT``): the dumps of the sizes seen since the last
    (``dump_sizes``); a bad folder stops the dumps, never the report."""

    def writes(self) -> bool:
        return bool(config.OUT.get())

    def record(self, snapshot: Snapshot) -> None:
        if snapshot.beside:
            return
        try:
            for g in snapshot.recorder.graphs:
                dump_sizes(g)
        except Exception as e:
            if host_raised(e):
                raise
            warn_once(f"dumps:{type(e).__name__}", "fxflops: no per-size graph dumps (%s: %s)",
                      type(e).__name__, e)
