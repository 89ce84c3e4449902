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

from fxflops import config
from fxflops.binder import SizeBinder, UnboundSymbolError
from fxflops.cost import CostAt, GraphCost, evaluate
from fxflops.stats import SizeStats, size_label
from fxflops.util import forget_warnings

log = logging.getLogger(__name__)


class GraphRecord:
    """One instrumented graph: its cost, where its size symbols come from, its rows."""

    def __init__(self, graph_id: int, name: str, cost: GraphCost,
                 static_size: int | str = "static", meta: dict[str, Any] | None = None) -> None:
        if cost.binder is None:
            raise UnboundSymbolError(f"graph {name}: its size symbols appear in no input")
        self.id = graph_id
        self.name = name
        self.cost = cost
        self.binder: SizeBinder = cost.binder
        self.static_size = static_size
        self.meta = meta or {}
        # keyed by what ``binder.key(args)`` returns (an int for one size symbol)
        self.rows: dict[Any, SizeStats] = {}
        self.max_sizes = config.MAX_SIZES.get()
        # calls at sizes past ``max_sizes``: counted and timed here, not per size
        self.overflow = SizeStats((), "overflow")
        self.dropped_keys: set[Any] = set()  # at most ``max_sizes`` of them are kept
        self.listing: list[str] | None = None  # the graph's source, for per-size dumps
        self.dumped_sizes: set[Any] = set()
        self._runtime_coeffs = [(n.runtime, n.runtime_coeff) for n in cost.runtime_nodes
                                if n.runtime]
        self.runtime_kinds = tuple(sorted({kind for kind, _ in self._runtime_coeffs}))

    @property
    def dropped_sizes(self) -> int:
        """Distinct sizes whose calls went to the overflow row (a lower bound past
        ``max_sizes`` of them)."""
        return len(self.dropped_keys)

    def new_row(self, raw_key: Any) -> SizeStats:
        """First call at a size: evaluate the cost expressions once for it."""
        row = self.rows.get(raw_key)
        if row is not None:
            return row
        if len(self.rows) >= self.max_sizes:
            if len(self.dropped_keys) < self.max_sizes:
                self.dropped_keys.add(raw_key)
            return self.overflow
        key = self.binder.as_tuple(raw_key)
        binding = dict(zip(self.cost.symbols, key))
        cost = CostAt(*(evaluate(c, binding) for c in (
            self.cost.flops, self.cost.matmul_flops, self.cost.bytes_io, self.cost.bytes_nodes)))
        row = SizeStats(key, size_label(key) if key else self.static_size, cost)
        row.runtime_coeff = sum(evaluate(c, binding) for _, c in self._runtime_coeffs)
        return self.rows.setdefault(raw_key, row)

    def all_rows(self) -> list[SizeStats]:
        """The per-size rows, and the overflow row once a call went there."""
        return [*self.rows.values(), *([self.overflow] if self.overflow.count else [])]


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

    def register(self, name: str, cost: GraphCost, static_size: int | str = "static",
                 meta: dict[str, Any] | None = None) -> GraphRecord:
        """A new graph; ``name`` may hold ``{index}`` (its place among this process's)."""
        with self._lock:
            index = next(self._ids)
            record = GraphRecord(index, name.format(index=index), cost, static_size, meta)
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
            g.overflow = SizeStats((), "overflow")
            g.dropped_keys.clear()
        self.forwards.clear()

    # --- background: periodic report file and log line ------------------------------

    def default_path(self) -> str | None:
        out = config.OUT.get()
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
        if not self._exit_hooked and config.OUT.get():
            self._exit_hooked = True
            atexit.register(self.flush)
        flush_s = config.FLUSH_S.get()
        log_s = config.LOG_INTERVAL.get()
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


def reset_recorder() -> Recorder:
    """Start over as a fresh process would: a new, empty recorder (graphs compiled before
    keep recording into their old records, which no report shows), warnings shown again."""
    global _RECORDER
    if _RECORDER is not None:
        _RECORDER.stop()
    _RECORDER = None
    forget_warnings()
    return recorder()
