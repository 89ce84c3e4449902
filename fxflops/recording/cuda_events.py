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

- a graph holding one instrumented call (vLLM's piecewise graphs) counts every replay in
  its row (``next(row.calls)``: exact under threads, no lock) and times a sample of them,
  each in a pooled eager pair around ``replay()``, which no later replay overwrites (see
  *Sampled replays*);
- a graph holding several (a FULL graph: the whole forward, which an integration's forward
  row times) counts its replay in a per-phase counter, turned into one call of each held
  graph's row at the next collection; its per-call times are read from the captured pairs
  when the previous replay has finished, at most once every ``len(calls)`` replays (one
  ``query()`` per replay), and those not read are counted lost.

**Sampled replays.** vLLM replays one graph per piece per step (60 pieces at 50 steps/s:
3,000 replays a second), and a timed replay costs the host five CUDA calls (two records, a
query, an elapsed time, a query that finds the device behind) and the clock's lock: several
microseconds, where a count costs a fraction of one. So a row's first ``MIN_TIMED_FIRST``
replays are timed, then one in ``FXFLOPS_REPLAY_SAMPLE_EVERY`` (N, read when the graph is
captured) on average: the next timed replay is a random stride on, drawn uniformly from
N - N // 2 to N + N // 2 (mean N; 1: every replay) by the clock's seeded generator, so a
run replayed in the same order times the same replays. A fixed stride is what it avoids:
pieces replayed in lockstep would all be timed in the same step, and a piece whose time
follows the steps' period would be sampled at one phase of it. A replay not due runs the
graph with nothing else (``patched_replay``: one attribute read, two ``next`` and a
comparison); a due one is *chosen* (``SizeStats.choose``) and timed as above, its sample
standing for the stretch of replays around it (the row's ``total_ns`` is unbiased). A
chosen replay whose sample never comes is ``lost``, as any call's: ``timed + lost =
chosen`` once read. Graphs holding several calls, split calls and eager calls are timed
every one, as before.

**Which capture a call belongs to.** A call made while its stream captures belongs to the
capture this thread holds (innermost first); failing that (vLLM's micro-batch threads run
the model while the main thread holds the capture), to the capture in progress on the
call's stream, or the only one on its device. A call that starts in one capture and ends
in a later one (vLLM's breakable CUDA graphs: a capture ended and begun again around each
eager op) is a *split* call: at replay, a pooled eager pair starts before its first
graph's replay and stops after its last's, so its time is its segments', eager ones
included. A captured pair is kept alive as long as its graph (a graph's record node does
not keep its event alive: a freed one would be recorded into after free).

**What a time says.** A pair spans whatever the device did between its records. Two calls
of different threads open at once on one device (vLLM's micro-batches, eager, share one
compute stream) each hold the other's kernels: their samples count as *shared*. A call
that found the device idle when it started (every pair before it read as finished) and
whose device time is within ``HOST_BOUND`` of the host's time between its two records was
paced by the host's launches, not by its kernels: its sample counts as *host-bound*.

**Capture is never disturbed.** While any capture is in progress (in any thread, in any
capture mode) fxflops makes no ``query``, ``synchronize``, ``elapsed_time`` or profiling
call: the calling thread skips reading, and a collection on another thread skips its round
(``Collected.skipped_capture``). Reads from fxflops' own threads run on the event's device.
``start`` made while the current stream captures records nothing (a capture runs nothing:
there is no call to count); an event that cannot be read (``query()`` raises) loses its
sample, never the call.

**Bounded waits.** A collection may wait for pairs in flight, by polling ``query()`` until a
deadline, never with ``synchronize()``, and never holding the lock while it sleeps: a hung
device or NCCL costs at most that deadline. A collection from a signal handler takes the
lock with a timeout (the interrupted thread may hold it) and skips what it cannot reach.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from fxflops import config
from fxflops.recording import phases
from fxflops.recording.runtime_costs import charge_runtime
from fxflops.recording.size_stats import CallCounter, taken
from fxflops.util import warn_once

# a call whose device time is at most this times the host's between its two records, and
# which found the device idle, was paced by the host (see the module's text)
HOST_BOUND = 1.25

# the seed of each clock's stride generator (``CudaClock.rng``): the same replays, in the
# same order, are timed in every run
REPLAY_SEED = 0x48

# a pair whose ``query()`` said unfinished is asked again by a chosen replay only once this
# many pairs were queued since (the device runs steps behind the host: asking at every
# chosen replay would be a CUDA call each, mostly answered no)
REREAD_AFTER = 2

# the warm-up phases in progress (``phases._PHASES``: one list, changed in place, never
# rebound): a replay made while it is empty is served, and may take the fast path
_WARMUPS = phases._PHASES


def _torch_cuda() -> Any:
    import torch

    return torch.cuda


class _Pending:
    """An eager pair in flight: read when its end event has been recorded (``armed``) and
    has completed; pooled per device with its events, reused once read."""

    __slots__ = ("start", "end", "row", "device", "thread", "t0", "host_ns", "idle",
                 "shared", "armed", "failed", "seq", "halves")

    def __init__(self, start: Any, end: Any, row: Any, device: int) -> None:
        self.start, self.end, self.row, self.device = start, end, row, device
        self.thread = self.t0 = self.host_ns = 0
        self.idle = self.shared = self.failed = False
        self.armed = True
        self.seq = 0  # its place in the queue (a pooled pair is queued again: not identity)
        self.halves = 2  # the calls its sample stands for, in halves (SizeStats.choose)


class _Split:
    """A call held by a run of graphs (a breakable capture's segments): its pair opens at
    its first graph's replay and closes after its last's, on the replaying thread."""

    __slots__ = ("held", "rows", "token")

    def __init__(self, held: _Held) -> None:
        self.held = held
        self.rows: dict[str, Any] = {}  # phase -> the call's row in it
        self.token: _Pending | None = None

    def row_in(self, phase: str) -> Any:
        row = self.rows.get(phase)
        if row is None:
            row = self.rows[phase] = self.held.record.row_in(phase, self.held.key)
        return row


class _Held:
    """One instrumented call inside a captured graph: where its replays are counted."""

    __slots__ = ("record", "key", "start", "end", "runtime")

    def __init__(self, record: Any, key: Any, start: Any, end: Any) -> None:
        self.record, self.key, self.start, self.end = record, key, start, end
        self.runtime = bool(getattr(record, "runtime_kinds", ()))


class CapturedGraph:
    """What fxflops knows of one CUDA graph: the instrumented calls it holds, and its replays
    per phase (several calls: counted at the next collection)."""

    __slots__ = ("calls", "runtime", "device", "stream", "thread", "rows", "pending",
                 "unread", "last_phase", "next_read", "opens", "closes", "keep", "active",
                 "graph", "one", "every", "replays", "__weakref__")

    def __init__(self, device: int, stream: Any = None, thread: int = 0,
                 every: int = 1, replays: Any = None) -> None:
        self.calls: list[_Held] = []
        # the serving row of its one call, where a served replay needs nothing else than
        # that row's count and, when due, its pair (no run-time costs, no split call):
        # the replay's fast path (``patched_replay``); None: each replay takes ``replayed``
        self.one: Any = None
        # FXFLOPS_REPLAY_SAMPLE_EVERY as the graph was captured (see the module's text)
        self.every = every
        # the clock's count of replays (``CudaClock.replays``), counted by the fast path
        self.replays: Any = replays if replays is not None else CallCounter()
        # split calls (``_Split``) that start in this graph, and those that end in it
        self.opens: list[_Split] = []
        self.closes: list[_Split] = []
        # captured pairs of no instrumented call (kept alive with the graph)
        self.keep: list[tuple[Any, Any]] = []
        self.active = False  # holds, opens or closes an instrumented call
        self.stream, self.thread = stream, thread  # where and by whom it is captured
        self.graph: Callable[[], Any] = lambda: None  # the graph, by weak reference
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
        # the host's clock the device's times are compared with (a simulator's own)
        self.now: Callable[[], int] = getattr(cuda, "host_clock_ns", None) or time.perf_counter_ns
        self.lock = threading.Lock()
        self.pending: deque[_Pending] = deque()
        self.open: list[_Pending] = []  # pairs started and not stopped yet
        self.pools: dict[int, list[_Pending]] = {}  # read pairs, for reuse, per device
        self.dropped = 0  # samples given up past max_in_flight
        self.queued = 0  # pairs queued so far (each pair's ``seq``)
        # the last pair found unfinished at the head of the queue: (its seq, ``queued``
        # then); a chosen replay asks it again only REREAD_AFTER pairs later
        self.stalled = (0, 0)
        # the chosen replays' strides (under the lock: see the module's text)
        self.rng = random.Random(REPLAY_SEED)
        self.capturing = 0  # captures in progress, in any thread
        self.captures: list[CapturedGraph] = []  # ... and their graphs
        self.unowned: list[tuple[Any, Any]] = []  # captured pairs no capture could be found for
        # replays of graphs holding instrumented calls (host side): ``replays``
        self._replays = CallCounter()
        self.graphs: weakref.WeakKeyDictionary[Any, CapturedGraph] = weakref.WeakKeyDictionary()
        # graphs holding several calls, whose replays are counted at a collection: kept
        # until then even if the graph is freed first (vLLM releases graphs and captures
        # again while serving: elastic EP), so that no replay goes uncounted
        self.several: list[CapturedGraph] = []
        self._capture = threading.local()  # .graphs: the graphs this thread captures, innermost last
        self._patch()

    @property
    def replays(self) -> int:
        return taken(self._replays)

    # --- eager calls --------------------------------------------------------------------

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any,
                  record: Any = None, key: Any = None) -> Any:
        """Run ``fn(*args)``: timed by an eager pair, or (the stream capturing) held by the
        graph being captured, whose replays count it in ``record``'s row for ``key``."""
        if self.cuda.is_current_stream_capturing():
            return self._captured_call(fn, args, record, key)
        token = self._start(row, self.cuda.current_device())
        try:
            out = fn(*args)
        except BaseException:  # (not counted, as on the CPU clock; its pair back in the pool)
            self._abandon(token)
            raise
        self.stop(token)
        return out

    def _abandon(self, token: _Pending) -> None:
        with self.lock:
            if token in self.open:
                self.open.remove(token)
            self.pools.setdefault(token.device, []).append(token)

    def start(self, row: Any) -> _Pending | None:
        """Record a start event for a call of ``row``; ``stop`` the token after the call.
        Under stream capture nothing is recorded and None is returned (a capture runs
        nothing: no call to count; its replays are timed where they are made)."""
        if self.cuda.is_current_stream_capturing():
            return None
        return self._start(row, self.cuda.current_device(), bracket=True)

    def _start(self, row: Any, device: int, bracket: bool = False) -> _Pending:
        """(``bracket``: a pair whose time shares no other thread's call: around other
        calls (a whole forward's, which holds theirs by design), or around a graph's
        replay, one launch.)"""
        me = threading.get_ident()
        with self.lock:
            idle = False
            if not self.capturing:  # no query while anything captures
                self._read_finished()
                idle = not self.pending  # every earlier pair has run: the device waits
            token = self._take(device)
            token.row, token.thread, token.idle, token.shared = row, me, idle, False
            token.halves = 2
            if not bracket:
                for other in self.open:  # another thread's call open on this device
                    if other.device == device and other.thread != me:
                        other.shared = token.shared = True
                self.open.append(token)
        token.start.record()
        token.t0 = self.now()
        return token

    def stop(self, token: _Pending) -> None:
        """Record the end event: the call is counted now, timed when the pair is read."""
        token.host_ns = self.now() - token.t0
        token.end.record()
        with self.lock:
            if token in self.open:
                self.open.remove(token)
            token.row.add_call()
            if len(self.pending) >= self.max_in_flight:
                self.pending.popleft().row.add_lost()
                self.dropped += 1
            self.queued += 1
            token.seq = self.queued
            self.pending.append(token)

    def _take(self, device: int) -> _Pending:
        """(Under the lock.) A pair from ``device``'s pool, or a new one."""
        pool = self.pools.get(device)
        if pool:
            return pool.pop()
        return _Pending(self.cuda.Event(enable_timing=True),
                        self.cuda.Event(enable_timing=True), None, device)

    def replay_chosen(self, entry: CapturedGraph, row: Any, n: int, replay: Any, graph: Any,
                      args: Any, kwargs: Any) -> Any:
        """Replay ``n`` (counted) of a graph holding one call (vLLM's piecewise graphs),
        which has reached its row's ``due``: chosen and timed in a pooled pair, with one
        trip through the lock: its pair queued before the replay, *armed* (readable) once
        its end is recorded after it. Where another thread's replay took this stretch
        first (``SizeStats.choose``), it runs as one not due. (The serving loop's hottest
        timed path: written flat, see benchmarks/gpu_overhead.py.)"""
        device = entry.device
        with self.lock:
            every = entry.every
            if every == 1 or n + 1 < config.MIN_TIMED_FIRST:
                stride = 1
            else:  # uniform from every - every // 2 to every + every // 2: mean ``every``
                low = every - every // 2
                stride = low + int(self.rng.random() * (2 * (every - low) + 1))
            halves = row.choose(n, stride)
            if halves:
                pending = self.pending
                idle = False
                if not self.capturing:
                    if pending and (pending[0].seq != self.stalled[0]
                                    or self.queued - self.stalled[1] >= REREAD_AFTER):
                        self._read_finished()
                    idle = not pending
                pool = self.pools.get(device)
                token = pool.pop() if pool else self._take(device)
                token.row, token.idle, token.shared, token.armed = row, idle, False, False
                token.halves = halves
                if len(pending) >= self.max_in_flight:
                    pending.popleft().row.add_lost()
                    self.dropped += 1
                self.queued += 1
                token.seq = self.queued
                pending.append(token)
        if not halves:
            return replay(graph, *args, **kwargs)
        ended = False
        try:
            token.start.record()
            t0 = self.now()
            out = replay(graph, *args, **kwargs)
            token.host_ns = self.now() - t0
            token.end.record()
            ended = True
        finally:  # (whatever raised, a signal's too: read as lost, never blocking the queue)
            token.failed = not ended
            token.armed = True
        return out

    def _read_finished(self, limit: int | None = None) -> int:
        """(Under the lock, no capture in progress.) Credit the finished pairs, oldest first.
        A pair that cannot be read loses its sample (and leaves the pool)."""
        done = 0
        pending = self.pending
        while pending and (limit is None or done < limit):
            token = pending[0]
            if not token.armed:  # (a replay's pair, its end not recorded yet)
                break
            if token.failed:
                pending.popleft()
                token.row.add_lost()
                token.failed = False
                self.pools.setdefault(token.device, []).append(token)
                done += 1
                continue
            try:
                if not token.end.query():
                    self.stalled = (token.seq, self.queued)
                    break
                ns = int(token.start.elapsed_time(token.end) * 1e6)
            except RuntimeError as e:  # (an event CUDA cannot read: its sample is lost)
                pending.popleft()
                token.row.add_lost()
                warn_once(f"cuda-read:{type(e).__name__}", "fxflops: a CUDA-event pair "
                          "could not be read; its sample is lost (%s: %s)", type(e).__name__, e)
                done += 1
                continue
            pending.popleft()
            token.row.add_late(ns, token.idle and ns <= HOST_BOUND * token.host_ns,
                               token.shared, token.halves)
            self.pools.setdefault(token.device, []).append(token)
            done += 1
        return done

    # --- CUDA graphs --------------------------------------------------------------------

    def _captured_call(self, fn: Callable[..., Any], args: Sequence[Any], record: Any,
                       key: Any) -> Any:
        """A call made while the stream captures: nothing runs now (no call is counted);
        the pair recorded here runs at each replay of the graph (or graphs) holding it."""
        start = self.cuda.Event(enable_timing=True, external=True)
        end = self.cuda.Event(enable_timing=True, external=True)
        first = self._capture_of_call()
        start.record()
        try:
            out = fn(*args)
        except BaseException:  # (the capture may go on: its nodes must not outlive them)
            with self.lock:
                self.unowned.append((start, end))
            raise
        end.record()
        last = self._capture_of_call()
        with self.lock:
            if first is None or last is None:
                # (never dropped: the graph records into these events at every replay)
                self.unowned.append((start, end))
                warn_once("cuda-capture-unowned", "fxflops: a call was captured in a CUDA "
                          "graph fxflops could not find (not this thread's, not on its "
                          "stream or device): its replays are not counted")
            elif record is None:
                last.keep.append((start, end))
                if first is not last:
                    first.keep.append((start, end))
            elif first is last:
                held = _Held(record, key, start, end)
                last.calls.append(held)
                last.active = True
                if held.runtime:
                    last.runtime.append(len(last.calls) - 1)
                if len(last.calls) == 2:  # (counted at collections from now on)
                    self.several.append(last)
            else:  # a call split across captures: timed from its first graph to its last
                # (the first's capture has ended by now: it is made active here, not there)
                split = _Split(_Held(record, key, start, end))
                first.opens.append(split)
                last.closes.append(split)
                first.active = last.active = True
                # (a replay of either must open or close the split's pair from now on:
                # not the fast path, whatever its earlier replays took)
                first.one = last.one = None
        return out

    def _capture_of_call(self) -> CapturedGraph | None:
        """The capture a call made now belongs to (see the module's text): of the captures
        in progress, the one on the call's stream, this thread's first (innermost first);
        else this thread's innermost (a stream joined to it); else the only one on the
        call's device."""
        with self.lock:
            captures = list(self.captures)
        if not captures:
            return None
        stack = getattr(self._capture, "graphs", None) or []
        stream = self.cuda.current_stream()
        for entry in [*reversed(stack), *captures]:
            if entry.stream == stream:
                return entry
        if stack:
            return stack[-1]
        device = self.cuda.current_device()
        on_device = [entry for entry in captures if entry.device == device]
        return on_device[0] if len(on_device) == 1 else None

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
            # The serving loop's hottest code (the module's "Sampled replays"): a served
            # replay of a piecewise graph is counted, exactly under threads (two C calls,
            # no lock), and runs with nothing else unless its row's next sample is due.
            # The graph's entry is an attribute of the graph (the class's None where
            # fxflops captured nothing in it): a weak-keyed lookup would make a weak
            # reference per replay. Everything else is ``replayed_any``'s.

            def patched_replay(graph: Any) -> Any:
                # (torch's replay() takes no arguments, nor does this: taking and passing
                # on ``*args, **kwargs`` costs about 400 instructions a replay)
                entry = graph._fxflops_entry
                if entry is not None:
                    row = entry.one
                    if row is not None and not _WARMUPS:
                        next(entry.replays)
                        n = next(row.calls)
                        if n < row.due:
                            return replay(graph)
                        return _CLOCKS[graph_cls].replay_chosen(entry, row, n, replay, graph,
                                                                (), {})
                return _CLOCKS[graph_cls].replayed_any(graph, entry, replay, (), {})

            def patched_replay_with(graph: Any, *args: Any, **kwargs: Any) -> Any:
                # (the same, for a replay() that takes arguments)
                entry = graph._fxflops_entry
                if entry is not None:
                    row = entry.one
                    if row is not None and not _WARMUPS:
                        next(entry.replays)
                        n = next(row.calls)
                        if n < row.due:
                            return replay(graph, *args, **kwargs)
                        return _CLOCKS[graph_cls].replay_chosen(entry, row, n, replay, graph,
                                                                args, kwargs)
                return _CLOCKS[graph_cls].replayed_any(graph, entry, replay, args, kwargs)

            return patched_replay if _takes_nothing(replay) else patched_replay_with

        # (a graph fxflops captured nothing in reads this: an attribute, never an error)
        if "_fxflops_entry" not in vars(graph_cls):
            graph_cls._fxflops_entry = None
        patch_method(graph_cls, "capture_begin", "capture", wrap_begin)
        patch_method(graph_cls, "capture_end", "capture", wrap_end)
        patch_method(graph_cls, "replay", "capture", wrap_replay)

    def capture_begun(self, graph: Any, begin: Any, args: Any, kwargs: Any) -> Any:
        with self.lock:  # (a collection on another thread finishes its reads first)
            self.capturing += 1
        try:
            # (the stream torch captures on: this thread's current one)
            entry = CapturedGraph(self.cuda.current_device(), self.cuda.current_stream(),
                                  threading.get_ident(), config.REPLAY_SAMPLE_EVERY.get(),
                                  self._replays)
            entry.graph = weakref.ref(graph)
            with self.lock:
                self.graphs[graph] = entry
                self.captures.append(entry)
            try:
                graph._fxflops_entry = entry  # (a graph class without a __dict__: none)
            except AttributeError:
                pass
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
        with self.lock:
            if entry is not None:
                if entry in stack:
                    stack.remove(entry)
                if entry in self.captures:
                    self.captures.remove(entry)
            self.capturing = max(0, self.capturing - 1)

    def replayed_any(self, graph: Any, entry: CapturedGraph | None, replay: Any, args: Any,
                     kwargs: Any) -> Any:
        """A replay the wrapper's fast path does not take: a graph of no instrumented
        call (run as it is), one whose entry is not on the graph (a class without a
        ``__dict__``: looked up here), one replayed in a warm-up phase, or one that needs
        more than a count (``replayed``)."""
        if entry is None and not hasattr(graph, "__dict__"):
            entry = self.graphs.get(graph)
        if entry is None or not entry.active:
            return replay(graph, *args, **kwargs)
        return self.replayed(entry, replay, graph, args, kwargs)

    def replayed(self, entry: CapturedGraph, replay: Any, graph: Any, args: Any,
                 kwargs: Any) -> Any:
        """One replay: its calls counted in the current phase's rows, and timed."""
        stack = _WARMUPS
        phase = stack[-1] if stack else phases.SERVING
        next(self._replays)  # (one C call: exact when threads replay at once)
        for split in entry.opens:  # split calls starting here: their pairs open first
            row = split.row_in(phase)
            if split.held.runtime:
                charge_runtime(row)
            split.token = self._start(row, entry.device, bracket=True)
        if not entry.calls:
            out = replay(graph, *args, **kwargs)
        else:
            rows = entry.rows.get(phase) or entry.rows_in(phase)
            for i in entry.runtime:  # run-time costs (vLLM attention) of this step
                charge_runtime(rows[i])
            if len(rows) == 1:  # (vLLM's piecewise graphs: sampled, see the module's text)
                row = rows[0]
                if phase == phases.SERVING and not (entry.runtime or entry.opens
                                                    or entry.closes):
                    entry.one = row  # its next served replays take the fast path
                n = next(row.calls)  # counted as it is made
                if n < row.due:
                    out = replay(graph, *args, **kwargs)
                else:
                    out = self.replay_chosen(entry, row, n, replay, graph, args, kwargs)
            else:
                with self.lock:
                    self._read_last_replay(entry)
                    entry.pending[phase] = entry.pending.get(phase, 0) + 1
                entry.last_phase = phase
                out = replay(graph, *args, **kwargs)
        for split in entry.closes:  # ... and close after the last graph's replay
            opened, split.token = split.token, None
            if opened is not None:
                self.stop(opened)
        return out

    def _read_last_replay(self, entry: CapturedGraph) -> None:
        """(Under the lock, before a replay of a graph holding several calls.) The previous
        replay's per-call times: read when it has finished (one ``query()``) and a read is
        due (once every ``len(calls)`` replays: O(1) per replay), else counted lost."""
        phase = entry.last_phase
        if phase is None:
            return
        entry.last_phase = None
        entry.next_read -= 1
        if entry.next_read < 0 and not self.capturing and self._finished(entry):
            entry.next_read = len(entry.calls)
            self._read_held(entry, phase)
        else:
            entry.unread[phase] = entry.unread.get(phase, 0) + 1

    @staticmethod
    def _finished(entry: CapturedGraph) -> bool:
        """Whether the graph's last replay has run (its last captured pair's end): an
        unreadable event is taken as not (the replay's samples are then lost)."""
        try:
            return bool(entry.calls[-1].end.query())
        except RuntimeError:
            return False

    def _read_held(self, entry: CapturedGraph, phase: str) -> None:
        """(Under the lock, the replay finished.) Each held call's sample."""
        for held, row in zip(entry.calls, entry.rows_in(phase)):
            try:
                row.add_late(int(held.start.elapsed_time(held.end) * 1e6))
            except RuntimeError:
                row.add_lost()

    def _count_replays(self) -> None:
        """(Under the lock.) Replays of graphs holding several calls, counted in their rows;
        a graph freed since is forgotten once counted (its last replay's pairs unread:
        lost)."""
        for entry in list(self.several):
            if entry.graph() is None:
                self.several.remove(entry)
                if entry.last_phase is not None:
                    entry.unread[entry.last_phase] = entry.unread.get(entry.last_phase, 0) + 1
                    entry.last_phase = None
            for phase in list({**entry.pending, **entry.unread}):
                n, lost = entry.pending.pop(phase, 0), entry.unread.pop(phase, 0)
                if n or lost:  # (a replay's samples lost may come after its count)
                    for row in entry.rows_in(phase):
                        if n:
                            row.add_calls(n)
                        if lost:
                            row.add_lost(lost)

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
        target: int | None = None  # the last pair queued when the collection began
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
                    target = self.pending[-1].seq
                out.samples += self._read_on_devices()
                if final:
                    self._read_last_replays()
                out.in_flight = len(self.pending)
                waiting = (target is not None and bool(self.pending)
                           and self.pending[0].seq <= target)
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
        for entry in list(self.several):
            phase = entry.last_phase
            if phase is None or len(entry.calls) < 2:
                continue
            with self.cuda.device(entry.device):
                if self._finished(entry):
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


def _takes_nothing(method: Any) -> bool:
    """Whether ``method`` (a class's, unbound) takes no argument but its instance."""
    import inspect

    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # (no signature to read: take any arguments)
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                   params[0].POSITIONAL_OR_KEYWORD)


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
        return self.clock.start(row)  # (None under capture: see CudaClock.start)

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
