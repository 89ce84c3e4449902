"""A CUDA simulator for tests on machines without a GPU: a fake subset of ``torch.cuda`` that
keeps CUDA's documented rules, so that code timing work with CUDA events (CUDA-graph replays
included) can be checked for what it may and may not do, and when its events are done.

The model, in short (each point is a rule of CUDA or of torch's wrapper around it):

* Device time. Each device has a queue of enqueued work and a clock in ms. A test marks host
  steps with ``sim.step()``; work enqueued during host step k runs once the host reaches step
  k + ``lag``; with ``lag=0`` work runs as soon as it is enqueued. ``sim.drain()`` runs
  everything (the test's omniscient control, not a CUDA call). A device runs the work of its
  streams one op at a time in enqueue order: one of the schedules CUDA allows.
* Host time. The host has a clock too (ms, from 0), which the test moves with
  ``sim.host(ms)``: the time the host spends launching and between launches. An op cannot
  start before the host enqueued it: it starts at max(device clock, host time at enqueue),
  so a device the host does not keep busy idles, and a pair of events around host gaps
  spans them. A kernel then moves its device's clock by its duration; a record's timestamp
  is the time it runs. ``sim.host_clock_ns()`` reads the host clock, as code under test
  reads ``time.perf_counter_ns`` (fxflops' CUDA clock takes it from the module it is given).
* Events are torch's: created lazily at their first record, on the recording stream's device
  (so creating one is no CUDA call); ``query()`` of a never-recorded event is True.
* Capture: work on a capturing stream is appended to the graph, never run. A stream that
  waits for an event recorded in a capture joins that capture (CUDA's fork/join). An event
  recorded in a capture is "captured": while the capture goes on, reading it is illegal;
  afterwards it has no timestamp. Only an ``external=True`` event becomes a record node
  that each ``replay()`` records again (until then ``query()`` is True and ``elapsed_time``
  raises); querying, synchronising or timing a non-external event last recorded in a
  capture is an error even after the capture ended (``cudaErrorStreamCaptureUnsupported``:
  there is nothing to query). A graph's record nodes do not keep their events alive (a
  ``cudaEvent_t`` in a node is a handle): replaying a graph whose event was freed is a
  use after free.
* Illegal calls raise :class:`CudaCaptureError`, invalidate every capture that made them
  illegal (its ``capture_end`` raises, work enqueued on its streams raises) and are appended
  to ``sim.violations``, so a test sees them even when the code under test swallows them.
  A use after free (a replay recording a freed event) is appended there too; the replay goes
  on (CUDA would not say so: its behaviour is undefined).
* Threads. Each thread has its own current device, streams and capture mode; a capture
  begun on one thread takes the work of every thread that launches on its stream (vLLM's
  micro-batch threads run the model while the main thread holds the capture).
* Contexts: a call that runs in a CUDA context adds ``(thread name, device)`` to
  ``sim.contexts``. The device is the one torch's C++ selects: the object's own device where
  torch puts a device guard around the call (record, wait, stream query/sync, launches,
  capture, replay, ``elapsed_time``'s final step), the caller's current device where it does
  not (``Event.query``, ``Event.synchronize``, the first step of ``elapsed_time``). A thread
  that never set a device is on device 0, so such calls create a context there.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

CAPTURE_MODES = ("global", "thread_local", "relaxed")
DEVICE_NAME = "NVIDIA H200 (simulated)"
# what install() patches in torch.cuda
TORCH_NAMES = ("Event", "Stream", "CUDAGraph", "graph", "current_stream", "default_stream",
               "stream", "set_stream", "is_current_stream_capturing", "synchronize",
               "current_device", "set_device", "device", "device_count", "is_available",
               "get_device_name")


class CudaCaptureError(RuntimeError):
    """A call that CUDA refuses because of an ongoing stream capture."""


class EventStateError(RuntimeError, ValueError):
    """``elapsed_time`` of an event without timing or never recorded: torch 2.13 raises a
    ValueError (TORCH_CHECK_VALUE), older torch a RuntimeError: code may catch either."""


@dataclass(eq=False, slots=True)
class _Op:
    """One piece of device work: a kernel, an event record or a wait for a record."""

    kind: str  # "kernel" | "record" | "wait"
    device: int
    step: int  # host step at enqueue
    host: float = 0.0  # host time at enqueue (ms): the op cannot start before it
    ms: float = 0.0
    target: _Op | None = None  # the record a wait waits for
    done: bool = False
    t: float = 0.0  # a record's timestamp: its device's clock when it ran


@dataclass(eq=False)
class _Capture:
    # (the graph by weak reference: an event last recorded in the capture keeps this, and
    # a real event keeps no graph alive)
    graph: weakref.ReferenceType[SimGraph]
    device: int
    thread: int
    thread_name: str
    mode: str
    streams: set[SimStream] = field(default_factory=set)  # the origin and the joined ones
    nodes: list[tuple[str, Any]] = field(default_factory=list)  # ("kernel", ms) | ("record", ev)
    ongoing: bool = True
    invalid: str | None = None  # why it was invalidated


@dataclass(eq=False, slots=True)
class _Captured:
    """An event's last record, made inside a capture: no work, no timestamp."""

    capture: _Capture


class SimEvent:
    _sim: CudaSim

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.enable_timing, self.blocking = enable_timing, blocking
        self.interprocess, self.external = interprocess, external
        self.device_index: int | None = None  # set at the first record, as torch does
        self._rec: _Op | _Captured | None = None

    @property
    def device(self) -> torch.device | None:
        return None if self.device_index is None else torch.device("cuda", self.device_index)

    def record(self, stream: SimStream | None = None) -> None:
        self._sim._event_call("Event.record", self, stream)

    def wait(self, stream: SimStream | None = None) -> None:
        self._sim._event_call("Event.wait", self, stream)

    def query(self) -> bool:
        return self._sim._event_read("Event.query", self)

    def synchronize(self) -> None:
        self._sim._event_read("Event.synchronize", self)

    def elapsed_time(self, end_event: SimEvent) -> float:
        return self._sim._elapsed(self, end_event)


class SimStream:
    _sim: CudaSim

    def __init__(self, device: Any = None, priority: int = 0) -> None:
        sim = self._sim
        with sim._lock:
            sim._count("Stream")
            self._setup(sim._index(device), priority)
            sim._use_context(self.device_index)

    def _setup(self, device: int, priority: int, default: bool = False) -> None:
        self.device_index, self.priority, self.is_default = device, priority, default
        self._last: _Op | None = None  # the last work enqueued
        self._capture: _Capture | None = None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def query(self) -> bool:
        return self._sim._stream_read("Stream.query", self)

    def synchronize(self) -> None:
        self._sim._stream_read("Stream.synchronize", self)

    def wait_event(self, event: SimEvent) -> None:
        event.wait(self)  # as torch does

    def wait_stream(self, stream: SimStream) -> None:
        self.wait_event(stream.record_event())  # as torch does

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = self._sim.Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        kind = "default " if self.is_default else ""
        return f"<simulated {kind}stream {id(self):#x} on cuda:{self.device_index}>"


class SimGraph:
    _sim: CudaSim

    def __init__(self, keep_graph: bool = False) -> None:
        self._capture: _Capture | None = None
        self._nodes: list[tuple[str, Any]] | None = None  # set by a successful capture_end
        self._device = 0
        self._pool: tuple[int, int] | None = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self._sim._capture_begin(self, pool, capture_error_mode)

    def capture_end(self) -> None:
        self._sim._capture_end(self)

    def replay(self) -> None:
        self._sim._replay(self)

    def reset(self) -> None:
        with self._sim._lock:
            self._capture, self._nodes = None, None

    def pool(self) -> tuple[int, int]:
        with self._sim._lock:
            if self._pool is None:
                self._pool = self._sim._new_pool()
            return self._pool


class CudaSim:
    """The simulated devices, and a module-like object: ``sim.Event``, ``sim.CUDAGraph``,
    ``sim.synchronize()`` ... stand for their ``torch.cuda`` namesakes."""

    def __init__(self, lag: int = 2, devices: int = 2) -> None:
        self.lag, self.devices = lag, devices
        self.host_step = 0
        self.host_ms = 0.0  # the host's clock (``host``)
        self.calls: Counter[tuple[str, str]] = Counter()  # (thread name, call)
        self.violations: list[tuple[str, str, str]] = []  # (thread name, call, detail)
        self.contexts: set[tuple[str, int]] = set()  # (thread name, device)
        self.replays: weakref.WeakKeyDictionary[SimGraph, int] = weakref.WeakKeyDictionary()
        # one lock for everything; nothing waits for another thread while holding it (the
        # device runs on the caller's thread)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._queues: list[deque[_Op]] = [deque() for _ in range(devices)]
        self._clocks = [0.0] * devices
        self._captures: list[_Capture] = []  # the ongoing ones
        self._pools = 0
        self._capture_stream: SimStream | None = None
        # classes of this simulator only: code under test patches methods on the class
        # (fxflops wraps CUDAGraph.replay), which must not outlive the test
        self.Event: type[SimEvent] = type("Event", (SimEvent,), {"_sim": self})
        self.Stream: type[SimStream] = type("Stream", (SimStream,), {"_sim": self})
        self.CUDAGraph: type[SimGraph] = type("CUDAGraph", (SimGraph,), {"_sim": self})
        self._defaults: list[SimStream] = []
        for d in range(devices):
            s = self.Stream.__new__(self.Stream)  # no CUDA call: not counted
            s._setup(d, 0, default=True)
            self._defaults.append(s)

    # --- the test's controls (not CUDA calls) ------------------------------------------

    def step(self, n: int = 1) -> None:
        """The host moves on by ``n`` steps; the device runs what is now ``lag`` steps old."""
        with self._lock:
            self.host_step += n
            self._run_due()

    def host(self, ms: float) -> None:
        """The host spends ``ms`` (launching, or between launches): work it enqueues from
        now on cannot start earlier."""
        with self._lock:
            self.host_ms += ms

    def host_clock_ns(self) -> int:
        """The host's clock, in ns (what code under test reads as its wall clock)."""
        with self._lock:
            return int(round(self.host_ms * 1e6))

    def drain(self) -> None:
        """The device finishes everything enqueued."""
        with self._lock:
            for d in range(self.devices):
                self._run(d)

    def launch(self, ms: float, stream: SimStream | None = None) -> None:
        """A kernel of ``ms`` device time on ``stream`` (the current stream by default)."""
        with self._lock:
            self._count("launch")
            s = stream if stream is not None else self._current()
            self._use_context(s.device_index)
            self._kernel(s, ms)

    def clock(self, device: int = 0) -> float:
        with self._lock:
            return self._clocks[device]

    def pending(self, device: int | None = None) -> int:
        """Ops enqueued and not run yet (on ``device``, or on all)."""
        with self._lock:
            queues = self._queues if device is None else [self._queues[device]]
            return sum(len(q) for q in queues)

    def exchange_capture_mode(self, mode: str) -> str:
        """cudaThreadExchangeStreamCaptureMode: sets this thread's own mode (CUDA's default is
        global), returns the previous one."""
        if mode not in CAPTURE_MODES:
            raise ValueError(f"unknown capture mode {mode!r}")
        t = self._thread()
        old, t.mode = t.mode, mode
        return old

    def install(self, monkeypatch: Any, leave: tuple[str, ...] = ()) -> CudaSim:
        """Patch ``torch.cuda``'s namesakes (see TORCH_NAMES), less those in ``leave``;
        monkeypatch undoes it."""
        for name in TORCH_NAMES:
            if name not in leave:
                monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    # --- torch.cuda: devices and streams -----------------------------------------------

    def is_available(self) -> bool:
        self._count("is_available")
        return True

    def device_count(self) -> int:
        self._count("device_count")
        return self.devices

    def get_device_name(self, device: Any = None) -> str:
        with self._lock:
            self._count("get_device_name")
            self._index(device)
            return DEVICE_NAME

    def current_device(self) -> int:
        self._count("current_device")
        return self._thread().device

    def set_device(self, device: Any) -> None:
        with self._lock:
            self._count("set_device")
            self._switch(self._index(device))

    @contextlib.contextmanager
    def device(self, device: Any) -> Iterator[None]:
        with self._lock:
            self._count("device")
            t = self._thread()
            prev = t.device
            if device is not None and device != -1:
                self._switch(self._index(device))
        try:
            yield
        finally:
            # torch restores with _maybe_exchange_device: no new context for the old device
            t.device = prev

    def current_stream(self, device: Any = None) -> SimStream:
        with self._lock:
            self._count("current_stream")
            return self._current(self._index(device))

    def default_stream(self, device: Any = None) -> SimStream:
        with self._lock:
            self._count("default_stream")
            return self._defaults[self._index(device)]

    def set_stream(self, stream: SimStream | None) -> None:
        with self._lock:
            self._count("set_stream")
            if stream is not None:
                self._set_stream(stream)

    @contextlib.contextmanager
    def stream(self, stream: SimStream | None) -> Iterator[None]:
        """torch.cuda.stream: this thread's current stream (and device) for the block."""
        if stream is None:
            yield
            return
        with self._lock:
            self._count("stream")
            prev_device = self._thread().device
            src, dst = self._current(prev_device), self._current(stream.device_index)
            self._set_stream(stream)
        try:
            yield
        finally:
            with self._lock:  # torch sets both streams back with set_stream (which sets device)
                self._set_stream(dst)
                self._set_stream(src)

    def synchronize(self, device: Any = None) -> None:
        with self._lock:
            self._count("synchronize")
            d = self._index(device)
            self._use_context(d)
            # a device handle encompasses its capturing streams: illegal in any mode
            self._check("synchronize", device=d)
            self._run(d)

    def is_current_stream_capturing(self) -> bool:
        # torch answers without creating a context
        with self._lock:
            self._count("is_current_stream_capturing")
            return self._current()._capture is not None

    # --- torch.cuda: graphs ---------------------------------------------------------------

    @contextlib.contextmanager
    def graph(self, cuda_graph: SimGraph, pool: Any = None, stream: SimStream | None = None,
              capture_error_mode: str = "global") -> Iterator[None]:
        """torch.cuda.graph: synchronize, switch to the capture stream (one side stream shared
        by every capture that names none, as torch keeps it), capture the block."""
        with self._lock:
            if self._capture_stream is None:
                self._capture_stream = self.Stream()
            capture_stream = stream if stream is not None else self._capture_stream
        self.synchronize()
        with self.stream(capture_stream):
            cuda_graph.capture_begin(pool, capture_error_mode=capture_error_mode)
            try:
                yield
            finally:
                cuda_graph.capture_end()

    def _capture_begin(self, graph: SimGraph, pool: Any, mode: str) -> None:
        with self._lock:
            self._count("CUDAGraph.capture_begin")
            if mode not in CAPTURE_MODES:
                raise RuntimeError(f"Unknown capture error mode {mode!r}")
            s = self._current()
            self._use_context(s.device_index)
            if s.is_default:  # CUDA cannot capture the legacy stream; torch says so first
                raise RuntimeError("CUDA graphs must be captured on a non-default stream. "
                                   "(However, after capture, it's ok to replay them on the "
                                   "default stream.)")
            if graph._capture is not None or graph._nodes is not None:
                raise RuntimeError("This CUDAGraph instance already owns a captured graph. "
                                   "To capture a new graph, create a new instance.")
            if s._capture is not None:
                raise CudaCaptureError("CUDA error: operation not permitted when stream is "
                                       "capturing (the stream is already capturing)")
            me = threading.current_thread()
            c = _Capture(weakref.ref(graph), s.device_index, me.ident or 0, me.name, mode, {s})
            s._capture = graph._capture = c
            graph._device = s.device_index
            graph._pool = pool if pool is not None else graph._pool or self._new_pool()
            self._captures.append(c)
            self.replays.setdefault(graph, 0)

    def _capture_end(self, graph: SimGraph) -> None:
        with self._lock:
            self._count("CUDAGraph.capture_end")
            c = graph._capture
            if c is None or not c.ongoing:
                raise RuntimeError("capture_end without an ongoing capture_begin")
            self._use_context(c.device)
            if c.mode != "relaxed" and c.thread != threading.get_ident():
                self._violate("CUDAGraph.capture_end", "cudaErrorStreamCaptureWrongThread: "
                              f"a {c.mode} capture must end on its own thread", [c])
            c.ongoing = False
            self._captures.remove(c)
            for s in c.streams:  # joined streams stop capturing too (unjoined: not checked)
                s._capture = None
            if c.invalid is not None:
                raise CudaCaptureError("CUDA error: operation failed due to a previous error "
                                       f"during capture (cudaErrorStreamCaptureInvalidated): "
                                       f"{c.invalid}")
            graph._nodes = c.nodes

    def _replay(self, graph: SimGraph) -> None:
        with self._lock:
            self._count("CUDAGraph.replay")
            if graph._nodes is None:
                raise RuntimeError("Called CUDAGraph::replay without a preceding successful "
                                   "capture.")
            # torch launches on the current stream of the capture's device
            s = self._current(graph._device)
            self._use_context(graph._device)
            self.replays[graph] = self.replays.get(graph, 0) + 1
            for kind, x in graph._nodes:
                if kind == "kernel":
                    self._kernel(s, x)
                    continue
                ev = x()  # an external event's record node: the event is recorded again
                if ev is None:
                    self.violations.append((threading.current_thread().name,
                                            "CUDAGraph.replay", "use after free: a record "
                                            "node's event was destroyed"))
                else:
                    self._record(ev, s)

    def _new_pool(self) -> tuple[int, int]:
        self._pools += 1
        return (id(self), self._pools)

    # --- events and streams -------------------------------------------------------------------

    def _event_call(self, call: str, ev: SimEvent, stream: SimStream | None) -> None:
        with self._lock:
            self._count(call)
            s = stream if stream is not None else self._current()
            if call == "Event.record":
                if ev.device_index is not None and ev.device_index != s.device_index:
                    raise RuntimeError(f"Event device {ev.device_index} does not match "
                                       f"recording stream's device {s.device_index}.")
                self._use_context(s.device_index)
                self._record(ev, s)
            elif ev._rec is not None:  # torch: waiting for a never-recorded event is a no-op
                self._use_context(s.device_index)
                self._wait(ev, s)

    def _event_read(self, call: str, ev: SimEvent) -> bool:
        with self._lock:
            self._count(call)
            # no device guard in torch: the runtime uses the caller's current device
            self._use_context(self._thread().device)
            self._check(call, events=(ev,))
            rec = ev._rec
            if isinstance(rec, _Captured) and not ev.external:
                self._unsupported(call)
            if not isinstance(rec, _Op):  # never recorded, or an external one not replayed
                return True
            if call == "Event.synchronize":
                self._run_until(rec)
            return rec.done

    def _elapsed(self, start: SimEvent, end: SimEvent) -> float:
        with self._lock:
            self._count("Event.elapsed_time")
            if not (start.enable_timing and end.enable_timing):
                raise EventStateError("Both events must be created with argument "
                                      "'enable_timing=True'.")
            if start._rec is None or end._rec is None:
                raise EventStateError("Both events must be recorded before calculating "
                                      "elapsed time.")
            self._use_context(self._thread().device)  # torch's query() of both, unguarded
            self._check("Event.elapsed_time", events=(start, end))
            recs = []
            for ev in (start, end):
                rec = ev._rec
                if isinstance(rec, _Captured) and not ev.external:
                    self._unsupported("Event.elapsed_time")
                if not isinstance(rec, _Op):
                    raise RuntimeError("CUDA error: invalid resource handle (the event was "
                                       "last recorded inside a CUDA-graph capture and has no "
                                       "timestamp)")
                if not rec.done:
                    raise RuntimeError("Both events must be completed before calculating "
                                       "elapsed time.")
                recs.append(rec)
            assert start.device_index is not None
            self._use_context(start.device_index)  # then torch guards to the event's device
            return recs[1].t - recs[0].t

    def _stream_read(self, call: str, s: SimStream) -> bool:
        with self._lock:
            self._count(call)
            self._use_context(s.device_index)
            self._check(call, streams=(s,))
            if s._last is not None and call == "Stream.synchronize":
                self._run_until(s._last)
            return s._last is None or s._last.done

    # --- internals (under the lock) -----------------------------------------------------------

    def _thread(self) -> Any:
        t = self._tls
        if not hasattr(t, "device"):
            t.device = 0  # a thread that never set a device is on device 0
            t.streams = {}  # device -> this thread's current stream there
            t.mode = "global"  # every thread's capture mode is global unless it exchanges it
        return t

    def _count(self, call: str) -> None:
        with self._lock:
            self.calls[(threading.current_thread().name, call)] += 1

    def _use_context(self, device: int) -> None:
        self.contexts.add((threading.current_thread().name, device))

    def _index(self, device: Any) -> int:
        if device is None:
            return self._thread().device
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda":
                raise ValueError(f"Expected a cuda device, but got: {device}")
            return self._thread().device if device.index is None else device.index
        if not 0 <= int(device) < self.devices:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return int(device)

    def _switch(self, device: int) -> None:
        """cudaSetDevice: initialises the device's primary context (CUDA 12) for the thread."""
        self._use_context(device)
        self._thread().device = device

    def _current(self, device: int | None = None) -> SimStream:
        d = self._thread().device if device is None else device
        return self._thread().streams.get(d, self._defaults[d])

    def _set_stream(self, s: SimStream) -> None:
        t = self._thread()
        if t.device != s.device_index:  # torch's _cuda_setStream sets the device too
            self._switch(s.device_index)
        t.streams[s.device_index] = s

    def _check(self, call: str, streams: tuple[SimStream, ...] = (),
               events: tuple[SimEvent, ...] = (), device: int | None = None) -> None:
        """Refuse a potentially unsafe call made while captures forbid it (CUDA's capture
        modes), or one that touches a capturing stream, device or captured event."""
        me, mode = threading.get_ident(), self._thread().mode
        why: dict[_Capture, str] = {}
        for c in self._captures:
            if c.thread == me and mode != "relaxed" and c.mode != "relaxed":
                why[c] = f"this thread has an ongoing {c.mode} capture"
            elif c.thread != me and mode == "global" and c.mode == "global":
                why[c] = f"thread {c.thread_name!r} has an ongoing global capture"
            elif device is not None and any(s.device_index == device for s in c.streams):
                why[c] = f"device {device} has a capturing stream"
        for s in streams:
            if s._capture is not None:
                why.setdefault(s._capture, "the stream is capturing")
        for ev in events:
            if isinstance(ev._rec, _Captured) and ev._rec.capture.ongoing:
                why.setdefault(ev._rec.capture, "the event was recorded in an ongoing capture")
        if why:
            self._violate(call, "; ".join(dict.fromkeys(why.values())), list(why))

    def _violate(self, call: str, detail: str, captures: list[_Capture]) -> None:
        name = threading.current_thread().name
        for c in captures:
            if c.invalid is None:
                c.invalid = f"{call} on thread {name!r}: {detail}"
        self.violations.append((name, call, detail))
        raise CudaCaptureError("CUDA error: operation not permitted when stream is capturing "
                               f"({call}: {detail})")

    def _unsupported(self, call: str) -> None:
        """A read of a non-external event last recorded in a capture (ended or not)."""
        detail = ("cudaErrorStreamCaptureUnsupported: the event was last recorded in a "
                  "capture (not external): there is nothing to read")
        self.violations.append((threading.current_thread().name, call, detail))
        raise CudaCaptureError(f"CUDA error: operation not supported ({call}: {detail})")

    def _captured(self, s: SimStream, node: tuple[str, Any] | None) -> bool:
        """If ``s`` captures, append ``node`` to its graph (an invalidated capture refuses all
        further work, as CUDA does) and say so."""
        c = s._capture
        if c is None:
            return False
        if c.invalid is not None:
            raise CudaCaptureError("CUDA error: operation failed due to a previous error "
                                   f"during capture (cudaErrorStreamCaptureInvalidated): "
                                   f"{c.invalid}")
        if node is not None:
            c.nodes.append(node)
        return True

    def _kernel(self, s: SimStream, ms: float) -> None:
        if not self._captured(s, ("kernel", ms)):
            self._enqueue(s, _Op("kernel", s.device_index, self.host_step, self.host_ms,
                                 ms=ms))

    def _record(self, ev: SimEvent, s: SimStream) -> None:
        ev.device_index = s.device_index
        if s._capture is not None:
            # a node holds the event's handle, not the event: it does not keep it alive
            self._captured(s, ("record", weakref.ref(ev)) if ev.external else None)
            ev._rec = _Captured(s._capture)
            return
        op = _Op("record", s.device_index, self.host_step, self.host_ms)
        ev._rec = op  # the old record, if still queued, runs but no longer sets this event
        self._enqueue(s, op)

    def _wait(self, ev: SimEvent, s: SimStream) -> None:
        rec = ev._rec
        if isinstance(rec, _Captured):
            c = rec.capture
            if not c.ongoing:
                return  # nothing to wait for: the capture ran nothing
            if s._capture is None:  # fork: the stream joins the capture
                s._capture = c
                c.streams.add(s)
            elif s._capture is not c:
                self._violate("Event.wait", "cudaErrorStreamCaptureMerge: the event belongs to "
                              "another capture", [c, s._capture])
            return  # a dependency inside one capture: the graph's order already keeps it
        if self._captured(s, None):
            return  # an eager event waited for inside a capture: not modelled (no node)
        if rec is not None and not rec.done:
            self._enqueue(s, _Op("wait", s.device_index, self.host_step, self.host_ms,
                                 target=rec))

    def _enqueue(self, s: SimStream, op: _Op) -> None:
        self._queues[op.device].append(op)
        s._last = op
        self._run_due()  # with lag 0 it runs now

    def _run_due(self) -> None:
        for d, q in enumerate(self._queues):
            while q and q[0].step + self.lag <= self.host_step:
                self._execute(d)

    def _run(self, d: int) -> None:
        while self._queues[d]:
            self._execute(d)

    def _run_until(self, op: _Op) -> None:
        while not op.done:
            self._execute(op.device)

    def _execute(self, d: int) -> None:
        op = self._queues[d].popleft()
        # nothing starts before the host enqueued it: an idle device waits for the host
        clock = max(self._clocks[d], op.host)
        if op.kind == "kernel":
            clock += op.ms
        elif op.kind == "record":
            op.t = clock
        elif op.target is not None:  # a wait: another device's record, enqueued earlier
            self._run_until(op.target)
            clock = max(clock, op.target.t)
        self._clocks[d] = clock
        op.done = True
