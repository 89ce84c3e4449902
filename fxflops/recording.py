"""The process-wide recorder: every instrumented graph, its per-size rows, whole forwards.

Writing the report and the periodic log happen on a daemon thread and at exit, never in
the hot path.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from fxflops.cost import CostAt, GraphCost, evaluate
from fxflops.stats import SizeStats, size_label

log = logging.getLogger("fxflops")

# a server that sees every token count from 1 to 8192 keeps 8192 rows per graph at most
MAX_SIZES = int(os.environ.get("FXFLOPS_MAX_SIZES", "8192"))


class GraphRecord:
    """One instrumented graph: its cost, where its size symbols come from, its rows."""

    def __init__(self, graph_id: int, name: str, cost: GraphCost, binder: Any,
                 static_size: int | str = "static", meta: dict[str, Any] | None = None) -> None:
        self.id = graph_id
        self.name = name
        self.cost = cost
        self.binder = binder
        self.static_size = static_size
        self.meta = meta or {}
        self.rows: dict[tuple[int, ...], SizeStats] = {}
        self.dropped_sizes = 0
        self._runtime_coeffs = [(n.runtime, n.runtime_coeff) for n in cost.runtime_nodes]
        self.runtime_kinds = tuple(sorted({kind for kind, _ in self._runtime_coeffs}))

    def new_row(self, key: tuple[int, ...]) -> SizeStats:
        """First call at a size: evaluate the cost expressions once for it."""
        row = self.rows.get(key)
        if row is not None:
            return row
        if len(self.rows) >= MAX_SIZES:
            self.dropped_sizes += 1
            return _OVERFLOW
        binding = dict(zip(self.cost.symbols, key))
        cost = CostAt(*(evaluate(c, binding) for c in (
            self.cost.flops, self.cost.matmul_flops, self.cost.bytes_io, self.cost.bytes_nodes)))
        row = SizeStats(key, size_label(key) if key else self.static_size, cost)
        row.runtime_coeff = sum(evaluate(c, binding) for _, c in self._runtime_coeffs)
        return self.rows.setdefault(key, row)


# where calls go once a graph has MAX_SIZES rows: counted, not kept per size
_OVERFLOW = SizeStats((), "overflow")


def _no_pairs() -> None:
    return None


class RuntimeCoster:
    """A late-bound source of run-time counts of one kind ("attention": the (query, key)
    pairs of the current call). Graphs hold the object; an integration sets ``pairs``
    whenever it loads, before or after the graphs were compiled or deserialised."""

    __slots__ = ("kind", "pairs")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.pairs: Callable[[], int | None] = _no_pairs


class Recorder:
    def __init__(self) -> None:
        self.graphs: list[GraphRecord] = []
        self.forwards: dict[int, SizeStats] = {}
        self.info: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._exit_hooked = False
        self.runtime_costers: dict[str, RuntimeCoster] = {}

    # --- registration (compile time) -------------------------------------------------

    def register(self, name: str, cost: GraphCost, binder: Any, static_size: int | str = "static",
                 meta: dict[str, Any] | None = None) -> GraphRecord:
        with self._lock:
            record = GraphRecord(next(self._ids), name, cost, binder, static_size, meta)
            self.graphs.append(record)
        self._start_background()
        return record

    def coster(self, kind: str) -> RuntimeCoster:
        coster = self.runtime_costers.get(kind)
        if coster is None:
            coster = self.runtime_costers.setdefault(kind, RuntimeCoster(kind))
        return coster

    def forward_row(self, size: int) -> SizeStats:
        row = self.forwards.get(size)
        if row is None:
            row = self.forwards.setdefault(size, SizeStats((size,), size))
        return row

    # --- reading ----------------------------------------------------------------------

    def stats(self) -> list[dict[str, Any]]:
        from fxflops.report import graph_rows

        return [row for g in self.graphs for row in graph_rows(g, self.peak())]

    def peak(self) -> dict[str, Any]:
        from fxflops.peaks import current_peak

        return current_peak(self.info.get("device"), self.info.get("dtype", "bf16"))

    def to_dict(self) -> dict[str, Any]:
        from fxflops.report import build_report

        return build_report(self)

    def save(self, path: str | os.PathLike[str]) -> str:
        from fxflops.report import write_atomic

        return write_atomic(self.to_dict(), path)

    def reset(self) -> None:
        """Forget every row (graphs stay registered: their callables still point here)."""
        for g in self.graphs:
            g.rows.clear()
        self.forwards.clear()

    # --- background: periodic report file and log line ------------------------------

    def default_path(self) -> str | None:
        out = os.environ.get("FXFLOPS_OUT")
        if not out:
            return None
        from fxflops.report import report_filename

        return os.path.join(out, report_filename(self.info))

    def flush(self) -> None:
        path = self.default_path()
        if path and self.graphs:
            try:
                from fxflops.dump import dump_sizes

                for g in self.graphs:
                    dump_sizes(g)
                self.save(path)
            except Exception as e:  # never let reporting break the process
                log.warning("fxflops: could not write %s: %s", path, e)

    def log_line(self) -> str:
        parts = []
        for row in self.stats():
            parts.append(f"({row['graph']}, {row['size']}, {row['calls']}, "
                         f"{row['median_ms']:.3f}, {row['gflops']:.2f}, "
                         f"{(row['tflops'] or 0) * 1e3:.1f})")
        return ("fxflops stats (graph, size, calls, median_ms, GFLOPs, GFLOP/s): ["
                + ", ".join(parts) + "]")

    def _start_background(self) -> None:
        if not self._exit_hooked and os.environ.get("FXFLOPS_OUT"):
            self._exit_hooked = True
            atexit.register(self.flush)
        flush_s = float(os.environ.get("FXFLOPS_FLUSH_S", "0") or 0)
        log_s = float(os.environ.get("FXFLOPS_LOG_INTERVAL", "0") or 0)
        if self._thread is not None or not (flush_s > 0 or log_s > 0):
            return

        def loop() -> None:
            period = min(x for x in (flush_s, log_s) if x > 0)
            last_flush = last_log = time.monotonic()
            while not self._stopped.wait(period):
                now = time.monotonic()
                if flush_s > 0 and now - last_flush >= flush_s:
                    self.flush()
                    last_flush = now
                if log_s > 0 and now - last_log >= log_s:
                    log.info(self.log_line())
                    last_log = now

        self._thread = threading.Thread(target=loop, name="fxflops-flush", daemon=True)
        self._thread.start()


    def stop(self) -> None:
        """End the background thread (the report is not written again by it)."""
        self._stopped.set()


_RECORDER: Recorder | None = None


def recorder() -> Recorder:
    """The process-wide recorder."""
    global _RECORDER
    if _RECORDER is None:
        _RECORDER = Recorder()
    return _RECORDER
