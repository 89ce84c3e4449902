"""CUDA-event timing without synchronisation, CUDA-graph replays included.

A call is *counted* when it is made and *timed* when its events are read: the count never
waits for the device, and only the sample arrives later (``SizeStats.add_call`` /
``add_late`` / ``add_lost``). One :class:`CudaClock` per process (per CUDA module: tests
pass a simulator) holds every pair in flight, under one lock: every write to an
event-timed row's counters is made under it, by whichever thread makes it.

**Eager calls.** A start/end ``Event(enable_timing=True)`` pair from a per-device pool is
recorded on the current stream around the call. Pairs are read with ``query()`` (never a
wait on the calling thread), oldest first, when a later call starts and at every
collection (the report's flush). At most ``max_in_flight`` pairs wait; past that the
oldest pair's sample is given up (the call stays counted; its row's ``lost`` says so).

**CUDA graphs.** ``CUDAGraph.capture_begin/capture_end/replay`` are wrapped once. A call
made while its stream captures records an ``external=True`` pair, which becomes part of the
graph and is recorded again at every replay; the graph's entry keeps which instrumented
calls it holds (graph record and size key, never a row: a replay's calls go to the rows of
the phase it is *replayed* in, not the one it was captured in). At each replay, on the
replaying thread, O(1) in the number of calls captured:

- a graph holding one instrumented call (vLLM's piecewise graphs) gets a pooled eager pair
  around ``replay()``: that call's count and its time, which no later replay overwrites;
- a graph holding several (a FULL graph: the whole forward, which an integration's forward
  row times) counts its replay in a per-phase counter, turned into one call of each held
  graph's row at the next collection; its per-call times are read from the captured pairs
  when the previous replay has finished, at most once every ``len(calls)`` replays (one
  ``query()`` per replay), and those not read are counted lost.

**Capture is never disturbed.** While any capture is in progress (in any thread, in any
capture mode) fxflops makes no ``query``, ``synchronize``, ``elapsed_time`` or profiling
call: the calling thread skips reading, and a collection on another thread skips its round
(``Collected.skipped_capture``). Reads from fxflops' own threads run on the event's device.

**Bounded waits.** A collection may wait for pairs in flight, by polling ``query()`` until a
deadline, never with ``synchronize()``, and never holding the lock while it sleeps: a hung
device or NCCL costs at most that deadline. A collection from a signal handler takes the
lock with a timeout (the interrupted thread may hold it) and skips what it cannot reach.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from fxflops.recording import phases
from fxflops.recording.runtime_costs import charge_runtime


def _torch_cuda() -> Any:
    import torch

    return torch.cuda


class _Pending:
    """An eager pair in flight: read when its end event has completed."""

    __slots__ = ("start", "end", "row", "device")

    def __init__(self, start: Any, end: Any, row: Any, device: int) -> None:
        self.start, self.end, self.row, self.device = start, end, row, device


class _Held:
    """One instrumented call inside a captured graph: where its replays are counted."""

    __slots__ = ("record", "key", "start", "end", "runtime")

    def __init__(self, record: Any, key: Any, start: Any, end: Any) -> None:
        self.record, self.key, self.start, self.end = record, key, start, end
        self.runtime = bool(getattr(record, "runtime_kinds", ()))


class CapturedGraph:
    """What fxflops knows of one CUDA graph: the instrumented calls it holds, and its replays
    per phase (several calls: counted at the next collection)."""

    __slots__ = ("calls", "runtime", "device", "rows", "pending", "unread", "last_phase",
                 "next_read", "__weakref__")

    def __init__(self, device: int) -> None:
        self.calls: list[_Held] = []
        # the held calls with run-time costs (vLLM attention in a whole-model graph), by
        # index: charged per replay from the step's lengths (set when the capture ends)
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


@dataclasses.dataclass
class Collected:
    """What one collection did: samples credited, pairs still in flight after it, and
    whether it skipped its round (a capture in progress, or the lock out of reach)."""

    samples: int = 0
    in_flight: int = 0
    skipped_capture: bool = False
    skipped_lock: bool = False


class CudaClock:
    """The process's CUDA-event clock for one CUDA module (``torch.cuda``, or a test's)."""

    def __init__(self, cuda: Any, max_in_flight: int = 1024) -> None:
        self.cuda = cuda
        self.max_in_flight = max_in_flight
        self.lock = threading.Lock()
        self.pending: deque[_Pending] = deque()
        self.pools: dict[int, list[tuple[Any, Any]]] = {}
        self.dropped = 0  # samples given up past max_in_flight
        self.capturing = 0  # captures in progress, in any thread
        self.replays = 0  # replays of graphs holding instrumented calls (host side)
        self.graphs: weakref.WeakKeyDictionary[Any, CapturedGraph] = weakref.WeakKeyDictionary()
        self._capture = threading.local()  # .graphs: the graphs this thread captures, innermost last
        self._patch()

    # --- eager calls --------------------------------------------------------------------

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any,
                  record: Any = None, key: Any = None) -> Any:
        """Run ``fn(*args)``: timed by an eager pair, or (the stream capturing) held by the
        graph being captured, whose replays count it in ``record``'s row for ``key``."""
        if self.cuda.is_current_stream_capturing():
            return self._captured_call(fn, args, record, key)
        token = self.start(row)
        out = fn(*args)
        self.stop(token)
        return out

    def start(self, row: Any) -> _Pending:
        """Record a start event for a call of ``row`` (not under stream capture); ``stop``
        the token after the call."""
        device = self.cuda.current_device()
        with self.lock:
            if not self.capturing:  # no query while anything captures
                self._read_finished()
            pool = self.pools.get(device)
            start, end = pool.pop() if pool else self._new_pair()
        start.record()
        return _Pending(start, end, row, device)

    def stop(self, token: _Pending) -> None:
        """Record the end event: the call is counted now, timed when the pair is read."""
        token.end.record()
        with self.lock:
            token.row.add_call()
            if len(self.pending) >= self.max_in_flight:
                self.pending.popleft().row.add_lost()
                self.dropped += 1
            self.pending.append(token)

    def _new_pair(self) -> tuple[Any, Any]:
        return (self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True))

    def _read_finished(self, limit: int | None = None) -> int:
        """(Under the lock, no capture in progress.) Credit the finished pairs, oldest first."""
        done = 0
        pending = self.pending
        while pending and (limit is None or done < limit):
            token = pending[0]
            if not token.end.query():
                break
            pending.popleft()
            try:
                ns = int(token.start.elapsed_time(token.end) * 1e6)
            except RuntimeError:  # (not readable after all: its sample is lost)
                token.row.add_lost()
            else:
                token.row.add_late(ns)
            self.pools.setdefault(token.device, []).append((token.start, token.end))
            done += 1
        return done

    # --- CUDA graphs --------------------------------------------------------------------

    def _captured_call(self, fn: Callable[..., Any], args: Sequence[Any], record: Any,
                       key: Any) -> Any:
        """A call made while the stream captures: nothing runs now (no call is counted);
        the pair recorded here runs at each replay."""
        start = self.cuda.Event(enable_timing=True, external=True)
        end = self.cuda.Event(enable_timing=True, external=True)
        start.record()
        out = fn(*args)
        end.record()
        graphs = getattr(self._capture, "graphs", None)
        if graphs and record is not None:
            with self.lock:
                graphs[-1].calls.append(_Held(record, key, start, end))
        return out

    def _patch(self) -> None:
        """Wrap the graph class once; the wrappers find the class's current clock."""
        from fxflops.patching import patch_method

        graph_cls = self.cuda.CUDAGraph
        _CLOCKS[graph_cls] = self  # the newest clock of a class is its current one

        def wrap_begin(begin: Any) -> Any:
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return _CLOCKS[graph_cls].capture_begun(graph, begin, args, kwargs)

            return capture_begin

        def wrap_end(end: Any) -> Any:
            def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return _CLOCKS[graph_cls].capture_ended(graph, end, args, kwargs)

            return capture_end

        def wrap_replay(replay: Any) -> Any:
            def patched_replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
                clock = _CLOCKS[graph_cls]
                entry = clock.graphs.get(graph)
                if entry is None or not entry.calls:
                    return replay(graph, *args, **kwargs)
                return clock.replayed(entry, replay, graph, args, kwargs)

            return patched_replay

        patch_method(graph_cls, "capture_begin", "capture", wrap_begin)
        patch_method(graph_cls, "capture_end", "capture", wrap_end)
        patch_method(graph_cls, "replay", "capture", wrap_replay)

    def capture_begun(self, graph: Any, begin: Any, args: Any, kwargs: Any) -> Any:
        with self.lock:  # (a collection on another thread finishes its reads first)
            self.capturing += 1
        try:
            entry = CapturedGraph(self.cuda.current_device())
            with self.lock:
                self.graphs[graph] = entry
            stack = getattr(self._capture, "graphs", None)
            if stack is None:
                stack = self._capture.graphs = []
            stack.append(entry)
            return begin(graph, *args, **kwargs)
        except BaseException:
            self._capture_done(graph)
            raise

    def capture_ended(self, graph: Any, end: Any, args: Any, kwargs: Any) -> Any:
        try:
            return end(graph, *args, **kwargs)
        finally:
            self._capture_done(graph)

    def _capture_done(self, graph: Any) -> None:
        stack = getattr(self._capture, "graphs", None) or []
        entry = self.graphs.get(graph)
        if entry is not None:
            entry.runtime = [i for i, held in enumerate(entry.calls) if held.runtime]
            if entry in stack:
                stack.remove(entry)
        with self.lock:
            self.capturing = max(0, self.capturing - 1)

    def replayed(self, entry: CapturedGraph, replay: Any, graph: Any, args: Any,
                 kwargs: Any) -> Any:
        """One replay: its calls counted in the current phase's rows, and timed."""
        phase = phases.phase()
        rows = entry.rows.get(phase) or entry.rows_in(phase)
        self.replays += 1
        for i in entry.runtime:  # run-time costs (vLLM attention) of this step
            charge_runtime(rows[i])
        if len(rows) == 1:
            token = self.start(rows[0])
            out = replay(graph, *args, **kwargs)
            self.stop(token)
            return out
        with self.lock:
            self._read_last_replay(entry)
            entry.pending[phase] = entry.pending.get(phase, 0) + 1
        entry.last_phase = phase
        return replay(graph, *args, **kwargs)

    def _read_last_replay(self, entry: CapturedGraph) -> None:
        """(Under the lock, before a replay of a graph holding several calls.) The previous
        replay's per-call times: read when it has finished (one ``query()``) and a read is
        due (once every ``len(calls)`` replays: O(1) per replay), else counted lost."""
        phase = entry.last_phase
        if phase is None:
            return
        entry.last_phase = None
        entry.next_read -= 1
        if entry.next_read < 0 and not self.capturing and entry.calls[-1].end.query():
            entry.next_read = len(entry.calls)
            self._read_held(entry, phase)
        else:
            entry.unread[phase] = entry.unread.get(phase, 0) + 1

    def _read_held(self, entry: CapturedGraph, phase: str) -> None:
        """(Under the lock, the replay finished.) Each held call's sample."""
        for held, row in zip(entry.calls, entry.rows_in(phase)):
            try:
                row.add_late(int(held.start.elapsed_time(held.end) * 1e6))
            except RuntimeError:
                row.add_lost()

    def _count_replays(self) -> None:
        """(Under the lock.) Replays of graphs holding several calls, counted in their rows."""
        for entry in list(self.graphs.values()):
            for phase, n in list(entry.pending.items()):
                if n:
                    entry.pending[phase] = 0
                    lost = entry.unread.get(phase, 0)
                    entry.unread[phase] = 0
                    for row in entry.rows_in(phase):
                        row.add_calls(n)
                        with row.lock:
                            row.lost += lost

    # --- collection (the report's flush, exit, a signal) --------------------------------

    def collect(self, wait_s: float = 0.0, lock_timeout: float = -1,
                final: bool = False) -> Collected:
        """Count pending replays and credit the pairs that have finished; with ``wait_s``,
        poll until the pairs in flight now have finished or the time is up (never a
        ``synchronize()``, never holding the lock while waiting). ``final`` (at exit, when
        nothing replays any more): the last replays' captured pairs too. Skipped while any
        capture is in progress. ``lock_timeout``: how long to wait for the lock (a signal
        handler's: its own thread may hold it)."""
        out = Collected()
        deadline = time.monotonic() + wait_s
        target: _Pending | None = None
        delay = 0.0005
        while True:
            if not self.lock.acquire(timeout=lock_timeout):
                out.skipped_lock = True
                return out
            try:
                if self.capturing:
                    out.skipped_capture = True
                    out.in_flight = len(self.pending)
                    return out
                self._count_replays()
                if target is None and self.pending:
                    target = self.pending[-1]
                out.samples += self._read_on_devices()
                if final:
                    self._read_last_replays()
                out.in_flight = len(self.pending)
                waiting = target is not None and any(p is target for p in self.pending)
            finally:
                self.lock.release()
            if not waiting or time.monotonic() >= deadline:
                return out
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def _read_on_devices(self) -> int:
        """(Under the lock.) Finished pairs read on their own device (fxflops' own threads
        never make CUDA calls on a device they were not told to)."""
        done = 0
        while self.pending:
            device = self.pending[0].device
            with self.cuda.device(device):
                n = self._read_finished_on(device)
            if not n:
                break
            done += n
        return done

    def _read_finished_on(self, device: int) -> int:
        done = 0
        while self.pending and self.pending[0].device == device:
            before = len(self.pending)
            if not self._read_finished(limit=1):
                break
            done += before - len(self.pending)
        return done

    def _read_last_replays(self) -> None:
        """(Under the lock, at exit.) Each graph's last replay, read if it has finished."""
        for entry in list(self.graphs.values()):
            phase = entry.last_phase
            if phase is None or len(entry.calls) < 2:
                continue
            with self.cuda.device(entry.device):
                if entry.calls[-1].end.query():
                    self._read_held(entry, phase)
                else:
                    for row in entry.rows_in(phase):
                        row.add_lost()
            entry.last_phase = None

    def is_capturing(self) -> bool:
        """A capture in progress anywhere (then fxflops makes no query, wait or profile)."""
        return bool(self.capturing) or bool(self.cuda.is_current_stream_capturing())


# by CUDA-graph class: torch.cuda.CUDAGraph (tests use a simulator's)
_CLOCKS: dict[Any, CudaClock] = {}


def clock(cuda: Any = None) -> CudaClock:
    """The process's clock for ``cuda`` (default ``torch.cuda``), made at first use."""
    cuda = cuda or _torch_cuda()
    found = _CLOCKS.get(cuda.CUDAGraph)
    if found is None or found.cuda is not cuda:
        found = CudaClock(cuda)  # registers itself
    return found


class CudaEventClock:
    """The CUDA-event ``Clock`` (``recording/clocks.py``): a graph's (or a model
    runner's) handle on the process's ``CudaClock``."""

    __slots__ = ("clock",)

    def __init__(self, cuda: Any = None) -> None:
        self.clock = clock(cuda)

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any,
                  record: Any = None, key: Any = None) -> Any:
        return self.clock.time_call(fn, args, row, record, key)

    def start(self, row: Any) -> Any:
        return self.clock.start(row)

    def stop(self, token: Any) -> None:
        self.clock.stop(token)

    def is_capturing(self) -> bool:
        return self.clock.is_capturing()


def collect_all(wait_s: float = 0.0, lock_timeout: float = -1,
                final: bool = False) -> Collected:
    """Every clock's collection (``CudaClock.collect``), added up."""
    total = Collected()
    for c in list(_CLOCKS.values()):
        got = c.collect(wait_s, lock_timeout, final)
        total.samples += got.samples
        total.in_flight += got.in_flight
        total.skipped_capture |= got.skipped_capture
        total.skipped_lock |= got.skipped_lock
    return total


def status() -> dict[str, int]:
    """What the report says of CUDA timing: samples still in flight (their calls counted,
    untimed), samples given up past the in-flight cap, replays, captures in progress."""
    clocks = list(_CLOCKS.values())
    return {"in_flight": sum(len(c.pending) for c in clocks),
            "dropped": sum(c.dropped for c in clocks),
            "replays": sum(c.replays for c in clocks),
            "captures_in_progress": sum(c.capturing for c in clocks)}


def replays() -> int:
    """Replays of graphs holding instrumented calls so far (a step that replayed: the
    difference across it)."""
    return sum(c.replays for c in list(_CLOCKS.values()))
