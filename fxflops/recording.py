"""The process-wide recorder: every instrumented graph, its per-size rows, whole forwards.

Writing the report and the periodic log happen on a daemon thread and at exit, never in
the hot path.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fxflops import config
from fxflops.binder import SizeBinder, UnboundSymbolError
from fxflops.cost import CostAt, GraphCost, evaluate
from fxflops.stats import SizeStats, size_label
from fxflops.util import forget_warnings, warn_once

log = logging.getLogger(__name__)


# distinct sizes past the cap that are still told apart (to count them; a few MiB at most)
MAX_DROPPED_KEYS = 65536


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
        self.dropped_keys: set[Any] = set()  # at most ``MAX_DROPPED_KEYS`` of them
        self.listing: list[str] | None = None  # the graph's source, for per-size dumps
        self.dumped_sizes: set[Any] = set()
        self.summary: dict[str, Any] | None = None  # the report's part that never changes
        # (kind, layer, FLOPs per pair, KV bytes per context token) of each run-time node
        self._runtime_terms = [(n.runtime, n.runtime_layer, n.runtime_coeff, n.runtime_bytes)
                               for n in cost.runtime_nodes if n.runtime]
        self.runtime_kinds = tuple(sorted({t[0] for t in self._runtime_terms}))

    @property
    def dropped_sizes(self) -> int:
        """Distinct sizes whose calls went to the overflow row (a lower bound past
        ``MAX_DROPPED_KEYS`` of them)."""
        return len(self.dropped_keys)

    def new_row(self, raw_key: Any) -> SizeStats:
        """First call at a size: evaluate the cost expressions once for it."""
        row = self.rows.get(raw_key)
        if row is not None:
            return row
        if len(self.rows) >= self.max_sizes:
            if len(self.dropped_keys) < MAX_DROPPED_KEYS:
                self.dropped_keys.add(raw_key)
            return self.overflow
        key = self.binder.as_tuple(raw_key)
        binding = dict(zip(self.cost.symbols, key))
        cost = CostAt(*(evaluate(c, binding) for c in self.cost.totals()))
        row = SizeStats(key, size_label(key) if key else self.static_size, cost)
        row.runtime_terms = [(kind, layer, evaluate(f, binding), evaluate(b, binding))
                             for kind, layer, f, b in self._runtime_terms]
        return self.rows.setdefault(raw_key, row)

    def all_rows(self) -> list[SizeStats]:
        """The per-size rows, and the overflow row once a call went there."""
        return [*self.rows.values(), *([self.overflow] if self.overflow.count else [])]


def _no_counts(window: int | None) -> None:
    return None


def _no_window(layer: str | None) -> None:
    return None


class RuntimeCoster:
    """A late-bound source of run-time counts of one kind. For "attention": ``counts(window)``
    gives the current call's (query, key) pairs and KV-cache context tokens with that
    sliding window (None: none), and ``window_of(layer)`` a layer's window. Graphs hold the
    object; an integration sets both whenever it loads, before or after the graphs were
    compiled or deserialised."""

    __slots__ = ("counts", "window_of")

    def __init__(self) -> None:
        self.counts: Callable[[int | None], tuple[int, int] | None] = _no_counts
        self.window_of: Callable[[str | None], int | None] = _no_window


# by kind; process-wide (not the recorder's): an integration wires them once, and graphs
# and recorders made later, a reset one included, find them wired
COSTERS: dict[str, RuntimeCoster] = {}


def coster(kind: str) -> RuntimeCoster:
    """The run-time coster of ``kind``, made unwired (counting nothing) on first use."""
    found = COSTERS.get(kind)
    if found is None:
        found = COSTERS.setdefault(kind, RuntimeCoster())
    return found


def charge_runtime(row: SizeStats, costers: dict[str, RuntimeCoster] = COSTERS) -> None:
    """Add the current call's run-time FLOPs and bytes to ``row``: per group of layers that
    share a window, its FLOPs per pair times the call's pairs, and its bytes per context
    token times the call's context tokens. The groups are made at the row's first call."""
    groups = row.runtime_groups
    if groups is None:
        merged: dict[tuple[str, int | None], list[int]] = {}
        for kind, layer, flops, bytes_ in row.runtime_terms:
            key = (kind, costers[kind].window_of(layer))
            acc = merged.setdefault(key, [0, 0])
            acc[0] += flops
            acc[1] += bytes_
        groups = row.runtime_groups = [(costers[k], w, f, b) for (k, w), (f, b) in merged.items()]
    counted = False
    for coster, window, flops, bytes_ in groups:
        got = coster.counts(window)
        if got is not None:
            row.runtime_flops += flops * got[0]
            row.runtime_bytes += bytes_ * got[1]
            counted = True
    if counted:
        row.runtime_calls += 1


def _metrics_dir() -> str | None:
    """Where the Prometheus counters' files go (None: not asked for, or nowhere to go)."""
    if not config.PROMETHEUS.get():
        return None
    from fxflops.metrics import files_dir

    return files_dir()


class Recorder:
    def __init__(self) -> None:
        self.graphs: list[GraphRecord] = []
        self.forwards: dict[int, SizeStats] = {}
        self.info: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._flush_lock = threading.RLock()
        # when the last periodic flush ended, and how long to wait before the next one
        self._last_flush: float | None = None
        self._flush_gap = 0.0
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._exit_hooked = False
        self.run_id = config.run_id()
        self.started = time.time()
        # (graphs when made, {tokens: FLOPs of a forward}): report.padding_figures' cache
        self.flops_at_cache: tuple[int, dict[int, int | None]] = (0, {})

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

    def reserve_index(self) -> int:
        """An index no graph of this process has (to name a backward graph whose forward
        could not be registered: ``graph3.backward``)."""
        with self._lock:
            return next(self._ids)

    def forward_row(self, size: int) -> SizeStats:
        row = self.forwards.get(size)
        if row is None:
            row = self.forwards.setdefault(size, SizeStats((size,), size))
        return row

    # --- reading ----------------------------------------------------------------------

    def stats(self) -> list[dict[str, Any]]:
        from fxflops.report import graph_rows

        collect_samples()
        return [row for g in self.graphs for row in graph_rows(g, self.peak())]

    def peak(self) -> dict[str, Any]:
        from fxflops.peaks import current_peak

        return current_peak(self.info.get("device"), self.info.get("dtype", "bf16"))

    def to_dict(self) -> dict[str, Any]:
        from fxflops.report import build_report

        collect_samples()
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

    def flush(self, final: bool = False) -> None:
        """Write the report to ``$FXFLOPS_OUT`` (and the dumps of sizes new since the last
        flush), and with ``FXFLOPS_PROMETHEUS`` the counters' files (``fxflops.metrics``).
        CUDA-event samples still in flight are waited for first (on this thread: the host's
        never waits); ``final`` (at exit): CUDA-graph replays too. Never raises: a full
        disk or a bad folder is warned about once."""
        path = self.default_path()
        metrics_dir = _metrics_dir()
        if not (path or metrics_dir) or not self.graphs:
            return
        collect_samples(wait=True, final=final)
        with self._flush_lock:
            for where, write in ((path, self._write_report), (metrics_dir, self._write_metrics)):
                if not where:
                    continue
                try:
                    write(where)
                except Exception as e:  # never let reporting break the process
                    warn_once(f"flush:{where}:{type(e).__name__}", "fxflops: could not write "
                              "%s (%s: %s); will try again at the next flush", where,
                              type(e).__name__, e)

    def _write_report(self, path: str) -> None:
        from fxflops.dump import dump_sizes

        for g in self.graphs:
            dump_sizes(g)
        self.save(path)

    def _write_metrics(self, directory: str) -> None:
        from fxflops.metrics import write_files

        write_files(self, directory)

    def register_prometheus(self, registry: Any = None) -> Any:
        """Serve this recorder's counters from a ``prometheus_client`` registry (default:
        its global one), read from the rows at each scrape. Returns the collector."""
        from fxflops.metrics import RecorderCollector

        if registry is None:
            from prometheus_client import REGISTRY as registry
        collector = RecorderCollector(self)
        registry.register(collector)
        return collector

    def log_line(self) -> str:
        parts = []
        for row in self.stats():
            parts.append(f"({row['graph']}, {row['size']}, {row['calls']}, "
                         f"{row['median_ms']:.3f}, {row['gflops']:.2f}, "
                         f"{(row['tflops'] or 0) * 1e3:.1f})")
        return ("fxflops stats (graph, size, calls, median_ms, GFLOPs, GFLOP/s): ["
                + ", ".join(parts) + "]")

    def _start_background(self) -> None:
        if not self._exit_hooked and (config.OUT.get() or _metrics_dir()):
            self._exit_hooked = True
            atexit.register(_flush_current)
            _write_on_signals()
        flush_s = config.FLUSH_S.get()
        log_s = config.LOG_INTERVAL.get()
        if self._thread is not None or not (flush_s > 0 or log_s > 0):
            return
        self._thread = threading.Thread(target=self._background, args=(flush_s, log_s),
                                        name="fxflops-flush", daemon=True)
        self._thread.start()

    def _background(self, flush_s: float, log_s: float) -> None:
        """Flush every ``flush_s`` and log every ``log_s`` seconds, at most ``DUTY`` of the
        time: a flush that took t seconds waits at least t / DUTY before the next, so a
        report of thousands of sizes is written less often instead of slowing the host."""
        period = min(x for x in (flush_s, log_s) if x > 0)
        last_log = time.monotonic()
        if self._last_flush is None:
            self._last_flush, self._flush_gap = last_log, flush_s
        while not self._stopped.wait(period):
            now = time.monotonic()
            if flush_s > 0 and now - self._last_flush >= self._flush_gap:
                started = time.thread_time()
                self.flush()
                # the flush's own CPU time (not the wall time it spent waiting for the GIL)
                took = time.thread_time() - started
                self._last_flush = time.monotonic()
                self._flush_gap = max(flush_s, took / _DUTY)
            if log_s > 0 and now - last_log >= log_s:
                try:
                    log.info(self.log_line())
                except Exception as e:
                    warn_once("log-line", "fxflops: no periodic log line (%s: %s)",
                              type(e).__name__, e)
                last_log = now

    def stop(self) -> None:
        """End the background thread (the report is not written again by it)."""
        self._stopped.set()


# the share of the time the background thread may spend writing reports
_DUTY = 0.01


def _flush_current() -> None:
    if _RECORDER is not None:
        _RECORDER.flush(final=True)


def collect_samples(wait: bool = False, final: bool = False) -> None:
    """Read the CUDA-event samples that have arrived (``wait``: wait for the eager calls'
    still in flight; ``final``: for CUDA-graph replays too). Nothing to do, and nothing
    imported, where no CUDA timer was ever made."""
    timing = sys.modules.get("fxflops.timing")
    if timing is None:
        return
    try:
        if final:
            timing.finish_all()
        else:
            timing.harvest_all(wait=wait)
    except Exception as e:  # a device error must not stop the report
        warn_once("harvest", "fxflops: could not read CUDA-event samples (%s: %s)",
                  type(e).__name__, e)


_SIGNALS_HOOKED = False


def _write_on_signals() -> None:
    """SIGTERM and SIGINT write the report, then do what they did before: the host's or
    vLLM's handler is called, a default one runs as the default would (the process ends)."""
    global _SIGNALS_HOOKED
    if _SIGNALS_HOOKED or threading.current_thread() is not threading.main_thread():
        return
    _SIGNALS_HOOKED = True
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN or previous is None:
                continue  # ignored (or set outside Python): leave it so
            signal.signal(signum, _chained(signum, previous))
        except (ValueError, OSError) as e:
            warn_once(f"signal:{signum}", "fxflops: no report on signal %s (%s)", signum, e)


def _chained(signum: int, previous: Any) -> Callable[[int, Any], Any]:
    import signal

    def handler(sig: int, frame: Any) -> Any:
        _flush_current()
        if callable(previous):
            return previous(sig, frame)
        # SIG_DFL: restore it and raise the signal again, so the process ends as it would
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return None

    return handler


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
