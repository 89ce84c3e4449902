"""The records the recorder (``recording.recorder``) keeps: each instrumented graph and its
per-size rows (``GraphRecord``), the graphs fxflops could not instrument, the backward
passes.

They hold data and nothing else: the report, the metrics and the dumps read them (and keep
their own caches). The hot path only ever adds to a row; rows are made under a lock, and
readers iterate over snapshots (``list(...)``, one C-level copy under the GIL), so a reader
never sees a dict change size under it. A row is never replaced and never rebound (a scope
is marks of the rows: ``scopes``). A call's row is chosen in one place, ``row_in``, by its
phase and size: warm-up calls (``phases``) are not traffic, and have rows of their own, so
that no warm-up sample enters a serving row's sample window; the hot path keeps only the
serving rows at hand, read while no warm-up is in progress.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from fxflops import config, torch_compat
from fxflops.cost.binder import SizeBinder, UnboundSymbolError
from fxflops.cost.graph_cost import CostAt, GraphCost, evaluate
from fxflops.recording.phases import SERVING, phase, rows_of
from fxflops.recording.size_stats import (
    CallCounter,
    RuntimeCounts,
    SizeStats,
    size_label,
    taken,
)

log = logging.getLogger(__name__)


# distinct sizes past the cap that are still told apart (to count them; a few MiB at most)
MAX_DROPPED_KEYS = 65536

# the overflow row's key among a record's rows (``GraphRecord.every_row``)
OVERFLOW = "overflow"


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
        # rows of real traffic, and each warm-up phase's (``row_in``). Never rebound: the
        # callables that read them keep the same dicts for their life
        self.rows: dict[Any, SizeStats] = {}
        self.warmup: dict[str, dict[Any, SizeStats]] = {}
        # the process's backward passes (a backward graph's calls note theirs there; set
        # by ``Recorder.register``)
        self.passes: BackwardPasses | None = None
        # the kernels Inductor made of it (fxflops.cost.kernels.KernelCost), when mapped
        self.kernels: list[Any] | None = None
        # an uncompiled call's cost per shape class, counted from the ops it ran
        # (``cost.census``, ``instrument.eager``): where there is no expression to evaluate
        self.counted: dict[Any, CostAt] = {}
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

    def row(self, raw_key: Any) -> SizeStats:
        """The row a call at ``raw_key`` made now goes to: its size's in the phase now
        (``phases.phase``), made if new."""
        return self.row_in(phase(), raw_key)

    def row_in(self, phase: str, raw_key: Any) -> SizeStats:
        """The row of ``raw_key`` in ``phase``'s rows, made if new (the one place a row is
        chosen: a call's, in the phase it is made in; a CUDA graph's replay's, in the phase
        it is replayed in). A new size's cost expressions are evaluated once for it (under
        the lock: two threads at one new size get one row)."""
        rows = self.rows if phase == SERVING else self.warmup.get(phase, {})
        row = rows.get(raw_key)
        if row is not None:
            return row
        with self._lock:
            return self._make(self.phase_rows(phase), raw_key)

    def _make(self, rows: dict[Any, SizeStats], raw_key: Any) -> SizeStats:
        """(Under the lock.) The row of ``raw_key`` in ``rows``, made if new, its cost
        evaluated for its size; the overflow row past ``max_sizes``."""
        row = rows.get(raw_key)
        if row is not None:
            return row
        # (a record costed per size counted, an uncompiled call's: none for any other)
        if len(rows) >= self.max_sizes or (self.counted and raw_key not in self.counted):
            if len(self.dropped_keys) < MAX_DROPPED_KEYS:
                self.dropped_keys.add(raw_key)
            return self.overflow
        key = self.binder.as_tuple(raw_key)
        binding = dict(zip(self.cost.symbols, key))
        cost = self.counted.get(raw_key)
        if cost is None:
            cost = CostAt(*(evaluate(c, binding) for c in self.cost.totals()))
        row = SizeStats(key, size_label(key) if key else self.static_size, cost)
        if self._runtime_terms:
            row.runtime = RuntimeCounts([(kind, layer, evaluate(f, binding),
                                          evaluate(b, binding))
                                         for kind, layer, f, b in self._runtime_terms])
        rows[raw_key] = row
        return row

    def phase_rows(self, phase: str) -> dict[Any, SizeStats]:
        """The process-wide rows of ``phase`` (``SERVING``: the real traffic's)."""
        return rows_of(phase, self.rows, self.warmup)

    def every_row(self) -> list[tuple[str, Any, SizeStats]]:
        """A snapshot of every row: (phase, size key, row), each phase's, and the overflow
        row (key ``OVERFLOW``, in the serving phase)."""
        out = [(SERVING, key, row) for key, row in list(self.rows.items())]
        out += [(phase, key, row) for phase, rows in list(self.warmup.items())
                for key, row in list(rows.items())]
        out.append((SERVING, OVERFLOW, self.overflow))
        return out

    def with_rows(self, by_phase: dict[str, dict[Any, SizeStats]]) -> GraphRecord:
        """A read-only copy of this record whose rows are ``by_phase``'s (a scope's, by
        phase: ``RecordingScope.rows_of``): what a scope's report reads. Its cost, names
        and kernels are this one's."""
        view = copy.copy(self)
        view.rows = dict(by_phase.get(SERVING, {}))
        view.overflow = view.rows.pop(OVERFLOW, SizeStats((), "overflow"))
        view.warmup = {phase: dict(rows) for phase, rows in by_phase.items()
                       if phase != SERVING}
        view.dropped_keys = set()
        return view

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
        for rows in list(self.warmup.values()):  # (a phase's first row may come meanwhile)
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
    step's figures are divided by (``fxflops.report.steps``)."""

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
        self._calls = CallCounter()  # (see SizeStats.calls: exact under threads)

    def count(self) -> None:
        """One call (from any thread: each counts)."""
        next(self._calls)

    @property
    def calls(self) -> int:
        return taken(self._calls)

    def forget(self) -> None:
        """Its calls forgotten (the recorder's rows were reset, or a fork's child)."""
        self._calls = CallCounter()
