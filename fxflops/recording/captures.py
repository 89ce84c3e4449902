"""What fxflops knows of CUDA graphs: the captures in progress, which one a call made now
belongs to, and, per graph captured, the instrumented calls it holds and its replays
(``recording.cuda_events`` says how they are counted and timed).

Nothing here has a lock of its own: every write is made under the clock's lock
(``CudaClock.lock``, which the tracker is given), except what a thread keeps for itself
(the captures it holds).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from fxflops.recording.size_stats import CallCounter
from fxflops.util import warn_once


class HeldCall:
    """One instrumented call inside a captured graph: its graph record and size key
    (never a row: a replay's call goes to the rows of the phase it is *replayed* in), and
    its captured pair, recorded again at every replay."""

    __slots__ = ("record", "key", "start", "end", "runtime")

    def __init__(self, record: Any, key: Any, start: Any, end: Any) -> None:
        self.record, self.key, self.start, self.end = record, key, start, end
        self.runtime = bool(getattr(record, "runtime_kinds", ()))


class SplitCall:
    """A call held by a run of graphs (a breakable capture's segments): its pair opens at
    its first graph's replay and closes after its last's, on the replaying thread."""

    __slots__ = ("held", "rows", "token")

    def __init__(self, held: HeldCall) -> None:
        self.held = held
        self.rows: dict[str, Any] = {}  # phase -> the call's row in it
        self.token: Any = None  # its open pair, between its first and its last graph

    def row_in(self, phase: str) -> Any:
        row = self.rows.get(phase)
        if row is None:
            row = self.rows[phase] = self.held.record.row_in(phase, self.held.key)
        return row


class CapturedGraph:
    """One CUDA graph: the instrumented calls it holds, and, holding several (a FULL graph:
    the whole forward), its replays per phase, counted in their rows at a collection."""

    __slots__ = ("calls", "runtime", "device", "stream", "thread", "rows", "pending",
                 "unread", "last_phase", "next_read", "opens", "closes", "keep", "active",
                 "graph", "one", "every", "replays", "__weakref__")

    def __init__(self, device: int, stream: Any = None, thread: int = 0,
                 every: int = 1, replays: Any = None) -> None:
        self.calls: list[HeldCall] = []
        # the serving row of its one call, where a served replay needs nothing else than
        # that row's count and, when due, its pair (no run-time costs, no split call):
        # the replay's fast path; None: each replay takes ``CudaClock.replayed``
        self.one: Any = None
        # FXFLOPS_REPLAY_SAMPLE_EVERY as the graph was captured
        self.every = every
        # the clock's count of replays (``CudaClock.replays``), counted by the fast path
        self.replays: Any = replays if replays is not None else CallCounter()
        # split calls that start in this graph, and those that end in it
        self.opens: list[SplitCall] = []
        self.closes: list[SplitCall] = []
        # captured pairs of no instrumented call (kept alive with the graph)
        self.keep: list[tuple[Any, Any]] = []
        self.active = False  # holds, opens or closes an instrumented call
        self.stream, self.thread = stream, thread  # where and by whom it is captured
        self.graph: Callable[[], Any] = lambda: None  # the graph, by weak reference
        # the held calls with run-time costs (vLLM attention in a whole-model graph), by
        # index: charged per replay from the step's lengths
        self.runtime: list[int] = []
        self.device = device
        self.rows: dict[str, list[Any]] = {}  # phase -> each held call's row in it
        self.pending: dict[str, int] = {}  # phase -> replays not yet counted in its rows
        self.unread: dict[str, int] = {}  # phase -> replays whose per-call times are lost
        self.last_phase: str | None = None  # the previous replay's, while its pairs are unread
        self.next_read = 0  # replays until the captured pairs are read again

    def rows_in(self, phase: str) -> list[Any]:
        """Each held call's row in ``phase`` (made at the first replay there, on the
        replaying thread: never by a collection, which must not wait on a record's lock)."""
        rows = self.rows.get(phase)
        if rows is None:
            rows = self.rows[phase] = [held.record.row_in(phase, held.key)
                                       for held in self.calls]
        return rows

    # --- a graph holding several calls (under the clock's lock) --------------------------

    def replayed_whole(self, phase: str, may_read: bool) -> None:
        """A replay in ``phase``, counted at the next collection; first, the previous
        replay's per-call times: read when it has finished (one ``query()``) and a read is
        due (once every ``len(calls)`` replays: O(1) per replay), else counted lost.
        ``may_read``: no capture is in progress."""
        last = self.last_phase
        if last is not None:
            self.next_read -= 1
            if self.next_read < 0 and may_read and self.finished():
                self.next_read = len(self.calls)
                self.read_held(last)
            else:
                self.unread[last] = self.unread.get(last, 0) + 1
        self.pending[phase] = self.pending.get(phase, 0) + 1
        self.last_phase = phase

    def finished(self) -> bool:
        """Whether the last replay has run (its last captured pair's end): an unreadable
        event is taken as not (the replay's samples are then lost)."""
        try:
            return bool(self.calls[-1].end.query())
        except RuntimeError:
            return False

    def read_held(self, phase: str) -> None:
        """(The replay finished.) Each held call's sample."""
        for held, row in zip(self.calls, self.rows_in(phase)):
            try:
                row.add_late(int(held.start.elapsed_time(held.end) * 1e6))
            except RuntimeError:
                row.add_lost()

    def count_replays(self) -> None:
        """The replays since the last collection, counted in their rows (and the replays
        whose per-call times were lost)."""
        for phase in list({**self.pending, **self.unread}):
            n, lost = self.pending.pop(phase, 0), self.unread.pop(phase, 0)
            if n or lost:  # (a replay's samples lost may come after its count)
                for row in self.rows_in(phase):
                    if n:
                        row.add_calls(n)
                    if lost:
                        row.add_lost(lost)

    def forget_rows(self) -> None:
        """(Under the clock's lock.) Its rows forgotten (a reset): looked up again at its
        next replay; the replays not counted yet, and the last one's pairs, forgotten."""
        self.drop_cached_rows()
        self.pending.clear()
        self.unread.clear()
        self.last_phase = None
        self.next_read = 0

    def drop_cached_rows(self) -> None:
        """(Under the clock's lock.) The rows it looked up, looked up again at its next
        replay."""
        self.one = None  # (set again by its next served replay)
        self.rows.clear()
        for split in (*self.opens, *self.closes):
            split.rows.clear()

    def forget_last(self) -> None:
        """(The graph was freed.) Its last replay's pairs will never be read: lost."""
        if self.last_phase is not None:
            self.unread[self.last_phase] = self.unread.get(self.last_phase, 0) + 1
            self.last_phase = None

    def read_last(self) -> None:
        """(At exit, on its device.) The last replay's per-call times, read if it has
        finished, else lost."""
        phase, self.last_phase = self.last_phase, None
        if phase is None or len(self.calls) < 2:
            return
        if self.finished():
            self.read_held(phase)
        else:
            for row in self.rows_in(phase):
                row.add_lost()


class CaptureTracker:
    """The captures in progress (in any thread) and the graphs captured. ``lock``: the
    clock's, which its writes are made under."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.capturing = 0  # captures in progress, in any thread
        self.captures: list[CapturedGraph] = []  # ... and their graphs
        self.unowned: list[tuple[Any, Any]] = []  # captured pairs no capture could be found for
        self.graphs: weakref.WeakKeyDictionary[Any, CapturedGraph] = weakref.WeakKeyDictionary()
        # graphs holding several calls, whose replays are counted at a collection: kept
        # until then even if the graph is freed first (vLLM releases graphs and captures
        # again while serving: elastic EP), so that no replay goes uncounted
        self.several: list[CapturedGraph] = []
        self.epoch = 0  # resets of the recorder's rows so far (``forget_rows``)
        self._mine = threading.local()  # .graphs: the graphs this thread captures, innermost last

    def forget_rows(self) -> None:
        """(Under the clock's lock.) The recorder forgot its rows (a reset): every graph
        looks its calls' rows up again at its next replay, in the rows made from then on,
        and the replays it had not counted yet (and the last one's pairs) are forgotten
        with the rest. A replay in progress meanwhile sees ``epoch`` move
        (``CudaClock.replayed``)."""
        self.epoch += 1
        for entry in {id(e): e for e in (*self.graphs.values(), *self.several)}.values():
            entry.forget_rows()

    def held_here(self) -> list[CapturedGraph]:
        """The captures this thread holds, innermost last."""
        stack = getattr(self._mine, "graphs", None)
        if stack is None:
            stack = self._mine.graphs = []
        return stack

    def capture(self, graph: Any, entry: CapturedGraph, begin: Callable[[], Any]) -> Any:
        """``graph``'s capture begins (``begin()``: CUDA's own), on this thread, as
        ``entry``; counted as in progress first (a collection on another thread finishes
        its reads before it), forgotten again if it fails to begin."""
        with self.lock:
            self.capturing += 1
        try:
            entry.graph = weakref.ref(graph)
            with self.lock:
                self.begun(graph, entry)
            try:
                graph._fxflops_entry = entry  # (a graph class without a __dict__: none)
            except AttributeError:
                pass
            return begin()
        except BaseException:
            with self.lock:
                self.ended(graph)
            raise

    def end(self, graph: Any, end: Callable[[], Any]) -> Any:
        """``graph``'s capture ends (``end()``: CUDA's own), whether or not CUDA's end
        succeeds."""
        try:
            return end()
        finally:
            with self.lock:
                self.ended(graph)

    def begun(self, graph: Any, entry: CapturedGraph) -> None:
        """(Under the lock, ``capturing`` counted already.) ``graph``'s capture begins, on
        this thread."""
        self.graphs[graph] = entry
        self.captures.append(entry)
        self.held_here().append(entry)

    def ended(self, graph: Any) -> None:
        """(Under the lock.) ``graph``'s capture ended (or failed to begin)."""
        entry = self.graphs.get(graph)
        if entry is not None:
            stack = self.held_here()
            if entry in stack:
                stack.remove(entry)
            if entry in self.captures:
                self.captures.remove(entry)
        self.capturing = max(0, self.capturing - 1)

    def capture_of_call(self, cuda: Any, captures: list[CapturedGraph]) -> CapturedGraph | None:
        """The capture a call made now belongs to, of ``captures`` (those in progress): the
        one on the call's stream, this thread's first (innermost first); else this
        thread's innermost (a stream joined to it); else the only one on the call's
        device."""
        if not captures:
            return None
        stack = self.held_here()
        stream = cuda.current_stream()
        for entry in [*reversed(stack), *captures]:
            if entry.stream == stream:
                return entry
        if stack:
            return stack[-1]
        device = cuda.current_device()
        on_device = [entry for entry in captures if entry.device == device]
        return on_device[0] if len(on_device) == 1 else None

    def hold(self, first: CapturedGraph | None, last: CapturedGraph | None, record: Any,
             key: Any, pair: tuple[Any, Any]) -> None:
        """(Under the lock.) A call captured from ``first``'s capture to ``last``'s
        (the same graph, or a breakable capture's segments), its pair ``pair``: kept by
        the graph (or graphs) holding it, alive as long as they are; counted at their
        replays in ``record``'s row for ``key`` (None: no instrumented call)."""
        if first is None or last is None:
            # (never dropped: the graph records into these events at every replay)
            self.unowned.append(pair)
            warn_once("cuda-capture-unowned", "fxflops: a call was captured in a CUDA "
                      "graph fxflops could not find (not this thread's, not on its "
                      "stream or device): its replays are not counted")
        elif record is None:
            last.keep.append(pair)
            if first is not last:
                first.keep.append(pair)
        elif first is last:
            held = HeldCall(record, key, *pair)
            last.calls.append(held)
            last.active = True
            if held.runtime:
                last.runtime.append(len(last.calls) - 1)
            if len(last.calls) == 2:  # (counted at collections from now on)
                self.several.append(last)
        else:  # a call split across captures: timed from its first graph to its last
            # (the first's capture has ended by now: it is made active here, not there)
            split = SplitCall(HeldCall(record, key, *pair))
            first.opens.append(split)
            last.closes.append(split)
            first.active = last.active = True
            # (a replay of either must open or close the split's pair from now on: not
            # the fast path, whatever its earlier replays took)
            first.one = last.one = None

    def count_replays(self) -> None:
        """(Under the lock.) Replays of graphs holding several calls, counted in their
        rows; a graph freed since is forgotten once counted."""
        for entry in list(self.several):
            if entry.graph() is None:
                self.several.remove(entry)
                entry.forget_last()
            entry.count_replays()
