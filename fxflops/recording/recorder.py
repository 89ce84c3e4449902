"""The process's recorder: every graph and its rows, whole forwards, what a serving engine
says; its sinks, by composition; the process's one recorder (``recorder()``).

The recorder holds data and writes nothing. What writes (the report files and their
periodic flush, the Prometheus counters, the graph dumps: ``fxflops.outputs``) subscribes
to it as a ``Sink``: it is told when a graph is registered, after a fork, at a reset and at
a stop, and at each flush it is handed one ``Snapshot`` (the same for every sink), which
it writes from: a sink keeps no reference to the recorder to write from. Sinks are
attached by the layers above (``outputs.session.attach``,
called where a graph is first registered and by ``fxflops.recorder()``), never at import.

A flush is one writer at a time: the CUDA-event samples are collected (``settle``) once,
one snapshot is taken, then each sink records it. A signal handler's flush never waits for
the lock: where another thread is flushing, each sink is handed a snapshot marked
``beside`` and writes what it can beside that flush, whole files only; where its own
thread was flushing, what the signal does next is
deferred to the flush's end (``defer``).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from fxflops import placement
from fxflops.cost.graph_cost import GraphCost
from fxflops.recording import phases
from fxflops.recording.collection import collect_samples, forget_captured_rows
from fxflops.recording.engine_stats import EngineStats
from fxflops.recording.phases import phase
from fxflops.recording.scopes import RecordingScope
from fxflops.recording.size_stats import ForwardCounts, SizeStats
from fxflops.recording.store import BackwardPasses, GraphRecord, UninstrumentedGraph
from fxflops.util import forget_warnings


class Snapshot(NamedTuple):
    """What one flush hands every sink: the recorder as the flush found it (``recorder``:
    a read-only copy, its graphs and whole forwards as of the flush, the rows settled
    once), and whether another thread's flush is under way (``beside``: a signal's; write
    whole files only)."""

    recorder: Recorder
    beside: bool = False


class Sink:
    """What a recorder tells its subscribers (``Recorder.subscribe``). Every method does
    nothing unless a sink overrides it; none is ever called on the hot path."""

    def registered(self, recorder: Recorder, record: GraphRecord | UninstrumentedGraph
                   ) -> None:
        """A graph was registered (compile time)."""

    def writes(self) -> bool:
        """Whether a flush would write anything now (somewhere to write to)."""
        return False

    def record(self, snapshot: Snapshot) -> None:
        """Write ``snapshot`` now (under the recorder's flush lock, unless it is
        ``beside`` another thread's flush: then only what can be written beside it, whole
        files only, or nothing). Catches its own errors, except the host's
        (``util.host_raised``)."""

    def after_fork(self, recorder: Recorder) -> None:
        """(In a forked child, the recorder's counts already empty.)"""

    def reset(self, recorder: Recorder) -> None:
        """The recorder's rows were forgotten (``Recorder.reset``)."""

    def stop(self) -> None:
        """The recorder is no longer the process's: end any thread of the sink's."""


def _row_of(rows: dict[int, SizeStats], size: int) -> SizeStats:
    """A whole forward's row of ``size`` in ``rows``, made at its first step (setdefault:
    two threads that make it keep one)."""
    row = rows.get(size)
    if row is None:
        made = SizeStats((size,), size)
        made.forward = ForwardCounts()
        row = rows.setdefault(size, made)
    return row


class Recorder:
    """The process's graphs and rows, and the sinks that write them out."""

    def __init__(self) -> None:
        self.graphs: list[GraphRecord] = []
        # whole forwards (vLLM), per size: real traffic's, and each warm-up phase's
        self.forwards: dict[int, SizeStats] = {}
        self.warmup_forwards: dict[str, dict[int, SizeStats]] = {}
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
        # the sinks subscribed (outputs'), in the order they write
        self.sinks: list[Sink] = []
        # the open scopes (``recording.scopes``), in the order they opened
        self.scopes: list[RecordingScope] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        # one flush at a time; a signal handler only ever tries it
        self._flush_lock = threading.Lock()
        self._flushing = threading.local()  # .now: this thread is in flush()
        self._deferred: Callable[[], Any] | None = None  # run when this flush ends
        self.run_id = placement.run_id()
        self.started = time.time()

    # --- sinks ---------------------------------------------------------------------------

    def subscribe(self, sink: Sink) -> Sink:
        """Tell ``sink`` of this recorder's registrations, flushes, forks, resets and stop."""
        with self._lock:
            if sink not in self.sinks:
                self.sinks.append(sink)
        return sink

    def unsubscribe(self, sink: Sink) -> None:
        with self._lock:
            if sink in self.sinks:
                self.sinks.remove(sink)

    def sink(self, kind: type[Any]) -> Any:
        """The subscribed sink of class ``kind``, or None."""
        return next((s for s in list(self.sinks) if isinstance(s, kind)), None)

    # --- registration (compile time) -------------------------------------------------

    def register(self, name: str, cost: GraphCost, static_size: int | str = "static",
                 meta: dict[str, Any] | None = None) -> GraphRecord:
        """A new graph; ``name`` may hold ``{index}`` (its place among this process's)."""
        with self._lock:
            index = next(self._ids)
            record = GraphRecord(index, name.format(index=index), cost, static_size, meta)
            record.passes = self.backward_passes
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

    def registered(self, record: GraphRecord | UninstrumentedGraph) -> None:
        """Called after each registration: each sink is told."""
        for sink in list(self.sinks):
            sink.registered(self, record)

    def reserve_index(self) -> int:
        """An index no graph of this process has (to name a backward graph whose forward
        could not be registered: ``graph3.backward``)."""
        with self._lock:
            return next(self._ids)

    def forward_row(self, size: int) -> SizeStats:
        """A whole forward's row: its size's in the phase now."""
        return _row_of(phases.rows_of(phase(), self.forwards, self.warmup_forwards), size)

    def draft_forward_row(self, size: int) -> SizeStats | None:
        """A drafter pass's row; None during a warm-up phase (vLLM's drafter warm-ups are
        dummy passes, which count nothing)."""
        if phases.IN_PROGRESS:
            return None
        return _row_of(self.draft_forwards, size)

    # --- warm-up and scopes -------------------------------------------------------------

    def open_scope(self) -> RecordingScope:
        """A new scope: a mark of every row, the CUDA-graph replays counted first (see
        ``recording.scopes``). O(rows), never a cost on the hot path."""
        self.settle()
        with self._lock:
            scope = RecordingScope(list(self.graphs), self.backward_passes)
            self.scopes.append(scope)
            return scope

    def close_scope(self, scope: RecordingScope) -> None:
        """Close ``scope``: a mark of every row, the CUDA-graph replays counted first.
        Scopes may close in any order (threads); closing one twice does nothing."""
        self.settle()
        with self._lock:
            if scope.closed:
                return
            if scope not in self.scopes:
                raise RuntimeError("fxflops: this scope is not open in this process's recorder")
            scope.close(list(self.graphs))
            self.scopes.remove(scope)

    def open_scopes(self) -> list[RecordingScope]:
        """The open scopes, innermost (the latest opened) first."""
        return self.scopes[::-1]

    # --- reading ----------------------------------------------------------------------

    def graphs_snapshot(self) -> list[GraphRecord]:
        return list(self.graphs)

    def forwards_snapshot(self, workload: str = "target") -> list[SizeStats]:
        """Whole-forward rows: the target model's, or (``"draft"``) its drafter's passes."""
        return list((self.draft_forwards if workload == "draft" else self.forwards).values())

    def warmup_forwards_snapshot(self) -> dict[str, list[SizeStats]]:
        return {phase: list(rows.values()) for phase, rows in list(self.warmup_forwards.items())
                if rows}

    def settle(self, wait: bool = False, final: bool = False, in_signal: bool = False) -> None:
        """Bring the rows up to date before they are read: the CUDA-graph replays counted
        and the CUDA-event samples that have arrived (``collection.collect_samples``)."""
        collect_samples(wait=wait, final=final, in_signal=in_signal)

    def snapshot(self, beside: bool = False) -> Snapshot:
        """This recorder as it is now, for the sinks: its graphs and whole forwards
        listed once (the rows are the live ones: a row only adds to its counters)."""
        view = copy.copy(self)
        view.graphs = self.graphs_snapshot()
        view.forwards, view.draft_forwards = dict(self.forwards), dict(self.draft_forwards)
        view.warmup_forwards = {phase: dict(rows)
                                for phase, rows in list(self.warmup_forwards.items())}
        view.uninstrumented = list(self.uninstrumented)
        view.sinks, view.scopes = [], []
        return Snapshot(view, beside)

    def has_data(self) -> bool:
        return bool(self.graphs or self.uninstrumented or self.forwards)

    # --- writing (the sinks) -----------------------------------------------------------

    def flush(self, final: bool = False, in_signal: bool = False) -> None:
        """Every sink writes (those with somewhere to write), the rows settled first (CUDA
        samples in flight waited for on this thread, the host's never waits; ``final``, at
        exit: CUDA-graph replays too). ``in_signal``: from a signal handler, which never
        waits for the flush lock."""
        sinks = [s for s in list(self.sinks) if s.writes()]
        if not sinks or not self.has_data():
            return
        if not self._flush_lock.acquire(blocking=not in_signal):
            # another thread is flushing (a signal arrived meanwhile): beside it
            beside = self.snapshot(beside=True)
            for s in sinks:
                s.record(beside)
            return
        self._flushing.now = True
        try:
            self.settle(wait=True, final=final, in_signal=in_signal)
            snapshot = self.snapshot()
            for s in sinks:
                s.record(snapshot)
        finally:
            self._flushing.now = False
            self._flush_lock.release()
            deferred, self._deferred = self._deferred, None
        if deferred is not None:  # a signal that came during the flush: now it acts
            deferred()

    def flushing_here(self) -> bool:
        """Whether this thread is inside this recorder's flush (a signal handler that
        interrupted it must not flush again)."""
        return getattr(self._flushing, "now", False)

    def defer(self, action: Callable[[], Any]) -> None:
        """Run ``action`` when this thread's flush ends (a signal's own action, deferred)."""
        self._deferred = action

    def stop(self) -> None:
        """This recorder is done (replaced): its sinks end their threads."""
        for sink in list(self.sinks):
            sink.stop()

    def reset(self) -> None:
        """Forget every row (graphs stay registered: their callables still point here;
        open scopes forget theirs too)."""
        for g in self.graphs_snapshot():
            g.clear_counts()
        forget_captured_rows()  # (a captured graph's replays: in the rows made from now on)
        self._forget()
        for scope in self.open_scopes():
            scope.clear()
        for sink in list(self.sinks):
            sink.reset(self)

    def _forget(self) -> None:
        self.forwards.clear()
        self.draft_forwards.clear()
        for forwards in list(self.warmup_forwards.values()):  # (a phase's first may come)
            forwards.clear()
        self.collectives.clear()
        self.backward_passes.by_size.clear()
        self.engine.clear()
        for entry in list(self.uninstrumented):
            entry.forget()

    def after_fork(self) -> None:
        """(In a forked child.) Start from empty counts and new locks: the parent's calls
        are the parent's report's; then each sink starts over."""
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._flushing = threading.local()
        self._deferred = None
        for g in self.graphs_snapshot():
            g.after_fork()  # (its own new lock, then the same clearing as reset's)
        self._forget()
        for scope in self.open_scopes():
            scope.clear()
        self.started = time.time()
        for sink in list(self.sinks):
            sink.after_fork(self)


# --- the process's recorder ------------------------------------------------------------------
# made at first use; a signal or exit hook reads it with ``current()``, which never makes one

_RECORDER: Recorder | None = None
_MAKING = threading.Lock()


def recorder() -> Recorder:
    """The process-wide recorder (made at first use). Compile-time code and integrations
    record here; ``fxflops.recorder()`` is the same recorder with its outputs attached."""
    global _RECORDER
    rec = _RECORDER
    if rec is None:
        with _MAKING:
            if _RECORDER is None:
                _RECORDER = Recorder()
            rec = _RECORDER
    return rec


def current() -> Recorder | None:
    """The recorder if one was made (a signal or exit hook must not make one)."""
    return _RECORDER


def reset_recorder() -> Recorder:
    """Start over as a fresh process would: a new, empty recorder (graphs compiled before
    keep recording into their old records, which no report shows; the old one's sinks
    stop), warnings shown again."""
    global _RECORDER
    with _MAKING:
        old, _RECORDER = _RECORDER, None
    if old is not None:
        old.stop()
    forget_warnings()
    return recorder()
