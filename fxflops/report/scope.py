"""``fxflops.scope()``: what the instrumented graphs did while a block of code ran, as
``torch.utils.flop_counter.FlopCounterMode`` is used.

::

    compiled = torch.compile(model, backend="fxflops")
    compiled(warm_up)                      # outside: the process's rows only
    with fxflops.scope() as s:
        compiled(x)
    s.flops, s.matmul_flops, s.bytes       # over the calls made inside
    s.rows()                               # per graph and size: calls, FLOPs, median, ...
    print(s.table())                       # the same, as text
    s.report()                             # a report of the scope (schema fxflops.report/1)

A scope is what the process's rows recorded while the block ran: a mark of every row
when it opens and when it closes, and the differences (``recording.scopes``): graphs
compiled before the scope and inside it alike, calls from every thread, CUDA-graph replays
too; a size's next calls are each timed again (a scope of a few calls has its own median).
Scopes nest and may close in any order. Nothing is added to a call's path, inside a scope
or outside.
"""

from __future__ import annotations

import copy
from types import TracebackType
from typing import Any

from fxflops.recording.engine_stats import EngineStats
from fxflops.recording.recorder import Recorder, recorder
from fxflops.recording.scopes import RecordingScope
from fxflops.report.build import build_report, recorder_rows
from fxflops.report.schema import GraphRow
from fxflops.util import human


def scope_view(rec: Recorder, scope: RecordingScope) -> Recorder:
    """A read-only copy of ``rec`` that holds only what ``scope`` saw: the graphs that ran
    in it, with its rows (what a report of the scope is built from). Whole forwards,
    collectives and engine figures are the process's only."""
    view = rec.snapshot().recorder
    view.graphs = scope.graphs_run(view.graphs)
    view.forwards, view.warmup_forwards, view.draft_forwards = {}, {}, {}
    view.uninstrumented, view.collectives = [], {}
    passes = copy.copy(rec.backward_passes)
    passes.by_size = scope.backward_passes()
    view.backward_passes = passes
    view.engine = EngineStats()
    view.started = scope.started
    return view


class Scope:
    """The calls the instrumented graphs made while the scope was open (``fxflops.scope``).

    Readable while it is open (what it holds so far) and after it closed (final). One
    scope is entered once; make another for another block."""

    def __init__(self) -> None:
        self._recorder: Recorder | None = None
        self._scope: RecordingScope | None = None

    def __enter__(self) -> Scope:
        if self._scope is not None:
            raise RuntimeError("fxflops.scope(): this scope was entered already; "
                               "make a new one for another block")
        self._recorder = recorder()
        self._scope = self._recorder.open_scope()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        assert self._recorder is not None and self._scope is not None
        # (no wait for the device here: a sample still in flight is the scope's when it
        # comes, as its call is)
        self._recorder.close_scope(self._scope)

    @property
    def open(self) -> bool:
        """Whether the block is running (entered and not left)."""
        return self._scope is not None and not self._scope.closed

    def _view(self) -> Recorder:
        """The recorder as far as this scope saw it (``scope_view``)."""
        if self._scope is None or self._recorder is None:
            raise RuntimeError("fxflops.scope(): not entered yet (use it as `with "
                               "fxflops.scope() as s:`)")
        # CUDA-event samples of its calls, waited for (a bounded wait, as a flush's:
        # reading the times needs them)
        self._recorder.settle(wait=True)
        return scope_view(self._recorder, self._scope)

    # --- reading ----------------------------------------------------------------------

    def rows(self) -> list[GraphRow]:
        """Per graph and size, the calls made inside: ``graph``, ``size``, ``calls``,
        ``flops`` and ``matmul_flops`` and ``bytes_io`` per call, ``total_flops``,
        ``total_matmul_flops``, ``total_bytes``, ``median_ms``, rates and the rest of a
        report row (docs/reference.md); graphs that did not run inside are left out."""
        return recorder_rows(self._view())

    def report(self) -> dict[str, Any]:
        """A report of the scope (schema ``fxflops.report/1``; ``fxflops report`` reads it
        once saved as JSON): the graphs that ran inside, with the scope's rows only; whole
        forwards, collectives and an engine's figures are left to the process's report."""
        return build_report(self._view())

    @property
    def calls(self) -> int:
        """Instrumented calls made inside (every graph and size)."""
        return sum(r["calls"] for r in self.rows())

    @property
    def flops(self) -> int:
        """FLOPs done inside (matmul and vector; run-time counts summed as they ran)."""
        return sum(int(r["total_flops"]) for r in self.rows())

    @property
    def matmul_flops(self) -> int:
        """Matmul-class FLOPs done inside: what ``FlopCounterMode`` counts."""
        return sum(int(r["total_matmul_flops"]) for r in self.rows())

    @property
    def bytes(self) -> int:
        """Bytes moved inside (each call's inputs, outputs and weights)."""
        return sum(int(r["total_bytes"]) for r in self.rows())

    def table(self) -> str:
        """The rows as text (a ``rich`` table, as the CLI's): per graph and size, calls,
        FLOPs and bytes per call and in all, median and achieved rate; the totals last."""
        import io

        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for i, name in enumerate(("graph", "size", "calls", "FLOPs/call", "bytes/call",
                                  "FLOPs", "bytes", "median ms", "TFLOP/s")):
            table.add_column(name, justify="left" if i < 2 else "right")
        rows = self.rows()
        for r in rows:
            table.add_row(r["graph"], str(r["size"]), str(r["calls"]), human(r["flops"]),
                          human(r["bytes_io"], "B"), human(r["total_flops"]),
                          human(r["total_bytes"], "B"), f"{r['median_ms']:.4f}",
                          "-" if r["tflops"] is None else f"{r['tflops']:.3g}")
        table.add_row("total", "", str(sum(r["calls"] for r in rows)), "", "",
                      human(sum(r["total_flops"] for r in rows)),
                      human(sum(r["total_bytes"] for r in rows), "B"), "", "")
        out = io.StringIO()
        Console(file=out, width=200, color_system=None).print(table)
        return "\n".join(line.rstrip() for line in out.getvalue().splitlines())

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        state = "open" if self.open else "closed" if self._scope is not None else "not entered"
        return f"<fxflops.scope {state}>"


def scope() -> Scope:
    """A scope to use as ``with fxflops.scope() as s:``: the calls every instrumented graph
    makes inside the block, read from ``s`` during and after it (``Scope``)."""
    return Scope()
