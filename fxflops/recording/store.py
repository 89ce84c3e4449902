"""The process-wide store: every instrumented graph, its per-size rows, whole forwards.

It holds data and nothing else: the report, the metrics and the dumps read it (and keep
their own caches), and ``fxflops.session`` writes them out (on a daemon thread, at exit, at
a signal). The hot path only ever adds to a row; rows are made under a lock, and readers
iterate over snapshots (``list(...)``, one C-level copy under the GIL), so a reader never
sees a dict change size under it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from fxflops import config, placement, torch_compat
from fxflops.cost.binder import SizeBinder, UnboundSymbolError
from fxflops.cost.graph_cost import CostAt, GraphCost, evaluate
from fxflops.recording import phases
from fxflops.recording.engine_stats import EngineStats
from fxflops.recording.phases import SERVING, phase
from fxflops.recording.size_stats import SizeStats, size_label
from fxflops.util import forget_warnings

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
        # keyed by what ``binder.key(args)`` returns (an int for one size symbol): the
        # rows of real traffic
        self.rows: dict[Any, SizeStats] = {}
        # the rows calls go to now (``rows``, or a warm-up phase's), and the callables
        # that read them on their hot path, rebound when the phase changes
        self.active = self.rows
        self.warmup: dict[str, dict[Any, SizeStats]] = {}
        self.readers: weakref.WeakSet[Any] = weakref.WeakSet()
        # the process's backward passes (a backward graph's calls note theirs there; set
        # by ``Recorder.register``)
        self.passes: BackwardPasses | None = None
        # the kernels Inductor made of it (fxflops.cost.kernels.KernelCost), when mapped
        self.kernels: list[Any] | None = None
        self.max_sizes = config.MAX_SIZES.get()
        # calls at sizes past ``max_sizes``: counted and timed here, not per size
        self.overflow = SizeStats((), "overflow")
        self.dropped_keys: set[Any] = set()  # at most ``MAX_DROPPED_KEYS`` of them
        self._lock = threading.Lock()  # making a row (a new size): never on the hot path
        # (kind, layer, FLOPs per pair, KV bytes per context token) of each run-time node
        self._runtime_terms = [(n.runtime, n.runtime_layer, n.runtime_coeff, n.runtime_bytes)
                               for n in cost.runtime_nodes if n.runtime]
        self.runtime_kinds = tuple(sorted({t[0] for t in self._runtime_terms}))

    def runtime_terms(self) -> list[tuple[str, str | None, Any, Any]]:
        """(kind, layer, per-unit FLOPs, per-unit bytes) of each run-time-costed node."""
        return list(self._runtime_terms)

    @property
    def dropped_sizes(self) -> int:
        """Distinct sizes whose calls went to the overflow row (a lower bound past
        ``MAX_DROPPED_KEYS`` of them)."""
        return len(self.dropped_keys)

    def new_row(self, raw_key: Any) -> SizeStats:
        """First call at a size (in this phase): evaluate the cost expressions once for it
        (under the lock: two threads at one new size get one row)."""
        row = self.active.get(raw_key)
        return row if row is not None else self._row(None, raw_key)

    def row_in(self, phase: str, raw_key: Any) -> SizeStats:
        """The row of ``raw_key`` in ``phase``'s rows, made if new (a CUDA graph's replay
        counts its calls in the phase it is replayed in)."""
        rows = self.rows if phase == SERVING else self.warmup.get(phase, {})
        row = rows.get(raw_key)
        return row if row is not None else self._row(phase, raw_key)

    def _row(self, phase: str | None, raw_key: Any) -> SizeStats:
        """(``phase`` None: the active one.)"""
        with self._lock:
            if phase is None:
                rows = self.active
            else:
                rows = self.rows if phase == SERVING else self.warmup.setdefault(phase, {})
            row = rows.get(raw_key)
            if row is not None:
                return row
            if len(rows) >= self.max_sizes:
                if len(self.dropped_keys) < MAX_DROPPED_KEYS:
                    self.dropped_keys.add(raw_key)
                return self.overflow
            key = self.binder.as_tuple(raw_key)
            binding = dict(zip(self.cost.symbols, key))
            cost = CostAt(*(evaluate(c, binding) for c in self.cost.totals()))
            row = SizeStats(key, size_label(key) if key else self.static_size, cost)
            row.runtime_terms = [(kind, layer, evaluate(f, binding), evaluate(b, binding))
                                 for kind, layer, f, b in self._runtime_terms]
            rows[raw_key] = row
            return row

    def read_by(self, graph: Any) -> None:
        """``graph`` reads the active rows on its hot path (``graph.use_rows``)."""
        self.readers.add(graph)
        graph.use_rows(self.active)

    def enter_phase(self, phase: str) -> None:
        """Send calls from now on to ``phase``'s rows (``SERVING``: the real traffic's)."""
        with self._lock:
            self.active = self.rows if phase == SERVING else self.warmup.setdefault(phase, {})
            for graph in list(self.readers):
                graph.use_rows(self.active)

    def warmup_rows(self) -> dict[str, list[SizeStats]]:
        """A snapshot of each warm-up phase's rows."""
        return {phase: list(rows.values()) for phase, rows in list(self.warmup.items())
                if rows}

    def all_rows(self) -> list[SizeStats]:
        """A snapshot of the per-size rows, and the overflow row once a call went there."""
        rows = list(self.rows.values())
        return rows + [self.overflow] if self.overflow.count else rows

    def clear_counts(self) -> None:
        """Every row forgotten (its callables keep reading the same dicts)."""
        self.rows.clear()
        for rows in self.warmup.values():
            rows.clear()
        self.overflow = SizeStats((), "overflow")
        self.dropped_keys.clear()

    def after_fork(self) -> None:
        """(In a forked child.) Empty counts: the parent's calls are the parent's; a lock
        the parent held at the fork is a new one here."""
        self._lock = threading.Lock()
        self.clear_counts()


class BackwardPasses:
    """How many backward passes (``loss.backward()`` calls) ran compiled backward graphs,
    per size: each pass is one autograd graph task, whatever graphs it runs (a model
    compiled block by block, split by DDP's optimizer, or recompiled). What a training
    step's figures are divided by (``fxflops.steps``)."""

    def __init__(self) -> None:

        self.by_size: dict[Any, int] = {}
        self._last: int | None = None
        self._task_id = torch_compat.get("graph_task_id")

    def note(self, size: Any) -> None:
        """(From a backward graph's call.) Count the pass it runs in, once."""
        task = self._task_id()
        if task != self._last:
            self._last = task
            self.by_size[size] = self.by_size.get(size, 0) + 1


class UninstrumentedGraph:
    """A graph fxflops could not instrument: its name, why, and its calls (counted by the
    pass-through wrapper it runs in, where one could be kept)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        self.calls = 0
        self._lock = threading.RLock()  # (see SizeStats.lock)

    def count(self) -> None:
        """One call (from any thread: each counts)."""
        with self._lock:
            self.calls += 1


def _row_of(rows: dict[int, SizeStats], size: int) -> SizeStats:
    """A whole forward's row of ``size`` in ``rows``, made at its first step (setdefault:
    two threads that make it keep one)."""
    row = rows.get(size)
    if row is None:
        row = rows.setdefault(size, SizeStats((size,), size))
    return row


class Recorder:
    """The process's graphs and rows (``fxflops.outputs.session.Session`` adds the outputs)."""

    def __init__(self) -> None:
        self.graphs: list[GraphRecord] = []
        # whole forwards (vLLM), per size: real traffic's, and each warm-up phase's
        self.forwards: dict[int, SizeStats] = {}
        self.warmup_forwards: dict[str, dict[int, SizeStats]] = {}
        self._active_forwards = self.forwards
        # a speculative decoder's drafter passes (vLLM), per size: real traffic's only
        self.draft_forwards: dict[int, SizeStats] = {}
        # graphs fxflops could not instrument (they run as compiled, counted where possible)
        self.uninstrumented: list[UninstrumentedGraph] = []
        self.info: dict[str, Any] = {}
        # collectives outside the graphs (FSDP2's), by kind: [calls, bytes]
        self.collectives: dict[str, list[int]] = {}
        self.backward_passes = BackwardPasses()
        # what a serving engine says of its steps (its own estimate, its drafts' acceptance)
        self.engine = EngineStats()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.run_id = placement.run_id()
        self.started = time.time()
        now = phases.watch(self)
        if now != SERVING:  # made during a warm-up (its first graph compiled there)
            self.switch(now)

    # --- registration (compile time) -------------------------------------------------

    def register(self, name: str, cost: GraphCost, static_size: int | str = "static",
                 meta: dict[str, Any] | None = None) -> GraphRecord:
        """A new graph; ``name`` may hold ``{index}`` (its place among this process's)."""
        with self._lock:
            index = next(self._ids)
            record = GraphRecord(index, name.format(index=index), cost, static_size, meta)
            record.passes = self.backward_passes
            if phase() != SERVING:  # compiled during a warm-up: its calls there are warm-up
                record.enter_phase(phase())
            self.graphs.append(record)
        self.registered(record)
        return record

    def register_uninstrumented(self, name: str, reason: str) -> UninstrumentedGraph:
        """A graph that runs uninstrumented, and why (``name`` may hold ``{index}``)."""
        with self._lock:
            entry = UninstrumentedGraph(name.format(index=next(self._ids)), reason)
            self.uninstrumented.append(entry)
        self.registered(entry)
        return entry

    def unregister(self, record: GraphRecord) -> None:
        """Forget a graph whose compile failed after it was registered."""
        with self._lock:
            if record in self.graphs:
                self.graphs.remove(record)

    def registered(self, record: Any) -> None:
        """Called after each registration (the session starts its outputs there)."""

    def reserve_index(self) -> int:
        """An index no graph of this process has (to name a backward graph whose forward
        could not be registered: ``graph3.backward``)."""
        with self._lock:
            return next(self._ids)

    def forward_row(self, size: int) -> SizeStats:
        return _row_of(self._active_forwards, size)

    def draft_forward_row(self, size: int) -> SizeStats | None:
        """A drafter pass's row; None during a warm-up phase (vLLM's drafter warm-ups are
        dummy passes, which count nothing)."""
        if self._active_forwards is not self.forwards:
            return None
        return _row_of(self.draft_forwards, size)

    # --- warm-up ------------------------------------------------------------------------

    def switch(self, phase: str) -> None:
        """Send calls from now on to ``phase``'s rows (``warmup`` calls it)."""
        with self._lock:
            self._active_forwards = self.forwards if phase == SERVING else \
                self.warmup_forwards.setdefault(phase, {})
            for g in list(self.graphs):
                g.enter_phase(phase)

    # --- reading ----------------------------------------------------------------------

    def graphs_snapshot(self) -> list[GraphRecord]:
        return list(self.graphs)

    def forwards_snapshot(self, workload: str = "target") -> list[SizeStats]:
        """Whole-forward rows: the target model's, or (``"draft"``) its drafter's passes."""
        return list((self.draft_forwards if workload == "draft" else self.forwards).values())

    def warmup_forwards_snapshot(self) -> dict[str, list[SizeStats]]:
        return {phase: list(rows.values()) for phase, rows in list(self.warmup_forwards.items())
                if rows}

    def reset(self) -> None:
        """Forget every row (graphs stay registered: their callables still point here)."""
        for g in self.graphs_snapshot():
            g.clear_counts()
        self.forwards.clear()
        self.draft_forwards.clear()
        for forwards in self.warmup_forwards.values():
            forwards.clear()
        self.collectives.clear()
        self.backward_passes.by_size.clear()
        self.engine.clear()
        for entry in list(self.uninstrumented):
            entry.calls = 0

    def after_fork(self) -> None:
        """(In a forked child.) Start from empty counts and new locks: the parent's calls
        are the parent's report's."""
        self._lock = threading.Lock()
        for g in self.graphs_snapshot():
            g.after_fork()  # (its own new lock, then the same clearing as reset's)
        self.reset()
        self.started = time.time()


# the process's recorder: made by ``fxflops.outputs.session.recorder()`` (a Session: the
# store with its outputs), read here by whatever must not make one (a signal, an exit hook)
_RECORDER: Recorder | None = None
_MAKING = threading.Lock()


def current_or_make(make: Callable[[], Recorder], keep: Callable[[Recorder], bool]
                    ) -> Recorder:
    """The process's recorder if ``keep(it)``, else a new one from ``make()``, made once
    under a lock however many threads ask."""
    global _RECORDER
    with _MAKING:
        if _RECORDER is None or not keep(_RECORDER):
            _RECORDER = make()
        return _RECORDER


def current() -> Recorder | None:
    """The recorder if one was made (a signal or exit hook must not make one)."""
    return _RECORDER


def replace_recorder() -> Recorder | None:
    """Drop the current recorder (``session.reset_recorder``); returns it."""
    global _RECORDER
    old, _RECORDER = _RECORDER, None
    forget_warnings()
    return old
