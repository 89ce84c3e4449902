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
graph with nothing else (``_patch``'s replay: one attribute read, two ``next`` and a
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

**Its parts**, one job each: the pairs in flight and their pools (``event_pairs``); the
captures in progress and the graphs captured, with what each holds (``captures``); here,
the clock that times a call or a replay with them, and the one wrapper of
``CUDAGraph.replay`` (``_patch``).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fxflops import config
from fxflops.recording import phases
from fxflops.recording.captures import CapturedGraph, CaptureTracker
from fxflops.recording.event_pairs import EventPair, EventQueue
from fxflops.recording.runtime_costs import charge_runtime
from fxflops.recording.size_stats import CallCounter, taken

# the seed of each clock's stride generator (``CudaClock.rng``): the same replays, in the
# same order, are timed in every run
REPLAY_SEED = 0x48

# the warm-up phases in progress (one list, changed in place, never rebound): a replay made
# while it is empty is served, and may take the fast path
_WARMUPS = phases.IN_PROGRESS


def _torch_cuda() -> Any:
    import torch

    return torch.cuda


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
        # the host's clock the device's times are compared with (a simulator's own)
        self.now: Callable[[], int] = getattr(cuda, "host_clock_ns", None) or time.perf_counter_ns
        self.lock = threading.Lock()
        self.queue = EventQueue(cuda, max_in_flight)
        self.tracker = CaptureTracker(self.lock)
        self.open: list[EventPair] = []  # eager calls' pairs started and not stopped yet
        # the chosen replays' strides (under the lock: see the module's text)
        self.rng = random.Random(REPLAY_SEED)
        # replays of graphs holding instrumented calls (host side): ``replays``
        self._replays = CallCounter()
        _patch(cuda.CUDAGraph, self)

    @property
    def replays(self) -> int:
        return taken(self._replays)

    # --- eager calls --------------------------------------------------------------------

    def time_call(self, fn: Callable[..., Any], args: Sequence[Any], row: Any,
                  record: Any = None, key: Any = None) -> Any:
        """Run ``fn(*args)``: timed by an eager pair, or (the stream capturing) held by the
        graph being captured, whose replays count it in ``record``'s row for ``key``
        (``record`` may be a function giving it once ``fn`` has run: a census registers
        the record it counts into)."""
        if self.cuda.is_current_stream_capturing():
            return self._captured_call(fn, args, record, key)
        pair = self._start(row, self.cuda.current_device())
        try:
            out = fn(*args)
        except BaseException:  # (not counted, as on the CPU clock; its pair back in the pool)
            with self.lock:
                if pair in self.open:
                    self.open.remove(pair)
                self.queue.give_back(pair)
            raise
        self.stop(pair)
        return out

    def start(self, row: Any) -> EventPair | None:
        """Record a start event for a call of ``row``; ``stop`` the pair after the call.
        Under stream capture nothing is recorded and None is returned (a capture runs
        nothing: no call to count; its replays are timed where they are made)."""
        if self.cuda.is_current_stream_capturing():
            return None
        return self._start(row, self.cuda.current_device(), bracket=True)

    def _start(self, row: Any, device: int, bracket: bool = False) -> EventPair:
        """(``bracket``: a pair whose time shares no other thread's call: around other
        calls (a whole forward's, which holds theirs by design), or around a graph's
        replay, one launch.)"""
        me = threading.get_ident()
        with self.lock:
            idle = False
            if not self.tracker.capturing:  # no query while anything captures
                self.queue.read_finished()
                idle = not self.queue.pending  # every earlier pair has run: the device waits
            pair = self.queue.take(device)
            pair.arm(row, idle)
            pair.thread = me
            if not bracket:
                for other in self.open:  # another thread's call open on this device
                    if other.device == device and other.thread != me:
                        other.shared = pair.shared = True
                self.open.append(pair)
        pair.start.record()
        pair.t0 = self.now()
        return pair

    def stop(self, pair: EventPair) -> None:
        """Record the end event: the call is counted now, timed when the pair is read."""
        pair.host_ns = self.now() - pair.t0
        pair.end.record()
        with self.lock:
            if pair in self.open:
                self.open.remove(pair)
            pair.row.add_call()
            self.queue.push(pair)

    # --- CUDA graphs --------------------------------------------------------------------

    def replay_chosen(self, entry: CapturedGraph, row: Any, n: int, replay: Any, graph: Any,
                      args: Any, kwargs: Any) -> Any:
        """Replay ``n`` (counted) of a graph holding one call (vLLM's piecewise graphs),
        which has reached its row's ``due``: chosen and timed in a pooled pair, with one
        trip through the lock: its pair queued before the replay, *armed* (readable) once
        its end is recorded after it. Where another thread's replay took this stretch
        first (``SizeStats.choose``), it runs as one not due."""
        queue = self.queue
        with self.lock:
            every = entry.every
            if every == 1 or n + 1 < config.MIN_TIMED_FIRST:
                stride = 1
            else:  # uniform from every - every // 2 to every + every // 2: mean ``every``
                low = every - every // 2
                stride = low + int(self.rng.random() * (2 * (every - low) + 1))
            halves = row.choose(n, stride)
            if halves:
                idle = False
                if not self.tracker.capturing:
                    if queue.worth_reading():
                        queue.read_finished()
                    idle = not queue.pending
                pair = queue.take(entry.device)
                pair.arm(row, idle, halves)
                pair.armed = False  # (readable once its end is recorded, after the replay)
                queue.push(pair)
        if not halves:
            return replay(graph, *args, **kwargs)
        ended = False
        try:
            pair.start.record()
            t0 = self.now()
            out = replay(graph, *args, **kwargs)
            pair.host_ns = self.now() - t0
            pair.end.record()
            ended = True
        finally:  # (whatever raised, a signal's too: read as lost, never blocking the queue)
            pair.failed = not ended
            pair.armed = True
        return out

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
                self.tracker.unowned.append((start, end))
            raise
        end.record()
        last = self._capture_of_call()
        if callable(record):  # (registered by ``fn`` itself: an uncompiled call's census)
            record = record()
        with self.lock:
            self.tracker.hold(first, last, record, key, (start, end))
        return out

    def _capture_of_call(self) -> CapturedGraph | None:
        with self.lock:
            captures = list(self.tracker.captures)
        return self.tracker.capture_of_call(self.cuda, captures)

    def capture_begun(self, graph: Any, begin: Any, args: Any, kwargs: Any) -> Any:
        # (the stream torch captures on: this thread's current one)
        entry = CapturedGraph(self.cuda.current_device(), self.cuda.current_stream(),
                              threading.get_ident(), config.REPLAY_SAMPLE_EVERY.get(),
                              self._replays)
        return self.tracker.capture(graph, entry, lambda: begin(graph, *args, **kwargs))

    def capture_ended(self, graph: Any, end: Any, args: Any, kwargs: Any) -> Any:
        return self.tracker.end(graph, lambda: end(graph, *args, **kwargs))

    def replayed_any(self, graph: Any, entry: CapturedGraph | None, replay: Any, args: Any,
                     kwargs: Any) -> Any:
        """A replay the wrapper's fast path does not take: a graph of no instrumented
        call (run as it is), one whose entry is not on the graph (a class without a
        ``__dict__``: looked up here), one replayed in a warm-up phase, or one that needs
        more than a count (``replayed``)."""
        if entry is None and not hasattr(graph, "__dict__"):
            entry = self.tracker.graphs.get(graph)
        if entry is None or not entry.active:
            return replay(graph, *args, **kwargs)
        return self.replayed(entry, replay, graph, args, kwargs)

    def replayed(self, entry: CapturedGraph, replay: Any, graph: Any, args: Any,
                 kwargs: Any) -> Any:
        """One replay: its calls counted in the current phase's rows, and timed."""
        phase = phases.phase()
        epoch = self.tracker.epoch
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
                    entry.replayed_whole(phase, may_read=not self.tracker.capturing)
                out = replay(graph, *args, **kwargs)
        for split in entry.closes:  # ... and close after the last graph's replay
            opened, split.token = split.token, None
            if opened is not None:
                self.stop(opened)
        if self.tracker.epoch != epoch:  # a reset came meanwhile: what this replay
            # cached may be the forgotten rows; its own rows are made again here (not by a
            # collection, which must not wait on a record's lock)
            with self.lock:
                entry.drop_cached_rows()
            if len(entry.calls) > 1:
                entry.rows_in(phase)
        return out

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
        pending = self.queue.pending
        while True:
            if not self.lock.acquire(timeout=lock_timeout):
                out.skipped_lock = True
                return out
            try:
                if self.tracker.capturing:
                    out.skipped_capture = True
                    out.in_flight = len(pending)
                    return out
                self.tracker.count_replays()
                if target is None and pending:
                    target = pending[-1].seq
                out.samples += self.queue.read_on_devices()
                if final:
                    for entry in list(self.tracker.several):
                        with self.cuda.device(entry.device):
                            entry.read_last()
                out.in_flight = len(pending)
                waiting = target is not None and bool(pending) and pending[0].seq <= target
            finally:
                self.lock.release()
            if not waiting or time.monotonic() >= deadline:
                return out
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def is_capturing(self) -> bool:
        """A capture in progress anywhere (then fxflops makes no query, wait or profile)."""
        return bool(self.tracker.capturing) or bool(self.cuda.is_current_stream_capturing())


# by CUDA-graph class: torch.cuda.CUDAGraph (tests use a simulator's)
_CLOCKS: dict[Any, CudaClock] = {}

# the keyword arguments of a replay that takes none (never written to)
_NO_KWARGS: dict[str, Any] = {}


def _takes_nothing(method: Any) -> bool:
    """Whether ``method`` (a class's, unbound) takes no argument but its instance."""
    import inspect

    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # (no signature to read: take any arguments)
        return False
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                   params[0].POSITIONAL_OR_KEYWORD)


def _patch(graph_cls: Any, clock: CudaClock) -> None:
    """Make ``clock`` the current clock of ``graph_cls`` (the newest clock of a class is
    its current one), and wrap the class's capture and replay methods once: the wrappers
    find the class's current clock.

    The replay wrapper is the serving loop's hottest code (the module's "Sampled
    replays"): a served replay of a piecewise graph is counted, exactly under threads (two
    C calls, no lock), and runs with nothing else unless its row's next sample is due.
    The graph's entry is an attribute of the graph (the class's None where fxflops
    captured nothing in it): a weak-keyed lookup would make a weak reference per replay.
    Everything else is ``replayed_any``'s."""
    from fxflops.patching import patch_method

    _CLOCKS[graph_cls] = clock

    def wrap_begin(begin: Any) -> Any:
        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            return _CLOCKS[graph_cls].capture_begun(graph, begin, args, kwargs)

        return capture_begin

    def wrap_end(end: Any) -> Any:
        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            return _CLOCKS[graph_cls].capture_ended(graph, end, args, kwargs)

        return capture_end

    def wrap_replay(replay: Any) -> Any:
        if not _takes_nothing(replay):
            # (a replay() that takes arguments, of a class fxflops does not know: each
            # replay takes the general path, which counts and samples it alike)
            def patched_replay_with(graph: Any, *args: Any, **kwargs: Any) -> Any:
                return _CLOCKS[graph_cls].replayed_any(graph, graph._fxflops_entry, replay,
                                                       args, kwargs)

            return patched_replay_with

        def patched_replay(graph: Any) -> Any:
            # (torch's replay() takes no arguments, nor does this: taking and passing on
            # ``*args, **kwargs`` costs about 0.13 us a replay: benchmarks/gpu_overhead.py)
            entry = graph._fxflops_entry
            if entry is not None:
                row = entry.one
                if row is not None and not _WARMUPS:
                    next(entry.replays)
                    n = next(row.calls)
                    if n < row.due:
                        return replay(graph)
                    return _CLOCKS[graph_cls].replay_chosen(entry, row, n, replay, graph, (),
                                                            _NO_KWARGS)
            return _CLOCKS[graph_cls].replayed_any(graph, entry, replay, (), _NO_KWARGS)

        return patched_replay

    # (a graph fxflops captured nothing in reads this: an attribute, never an error)
    if "_fxflops_entry" not in vars(graph_cls):
        graph_cls._fxflops_entry = None
    patch_method(graph_cls, "capture_begin", "capture", wrap_begin)
    patch_method(graph_cls, "capture_end", "capture", wrap_end)
    patch_method(graph_cls, "replay", "capture", wrap_replay)


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

    def captures_here(self) -> bool:
        return bool(self.clock.cuda.is_current_stream_capturing())


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


def forget_rows() -> None:
    """The recorder forgot its rows (``Recorder.reset``): no captured graph counts its
    replays in the forgotten rows (``CaptureTracker.forget_rows``)."""
    for c in list(_CLOCKS.values()):
        with c.lock:
            c.tracker.forget_rows()


def status() -> dict[str, int]:
    """What the report says of CUDA timing: samples still in flight (their calls counted,
    untimed), samples given up past the in-flight cap, replays, captures in progress."""
    clocks = list(_CLOCKS.values())
    return {"in_flight": sum(len(c.queue.pending) for c in clocks),
            "dropped": sum(c.queue.dropped for c in clocks),
            "replays": sum(c.replays for c in clocks),
            "captures_in_progress": sum(c.tracker.capturing for c in clocks)}


def replays() -> int:
    """Replays of graphs holding instrumented calls so far (a step that replayed: the
    difference across it)."""
    return sum(c.replays for c in list(_CLOCKS.values()))
