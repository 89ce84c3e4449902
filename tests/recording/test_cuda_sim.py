"""The CUDA simulator (tests/cuda_sim.py) keeps the rules it claims: device lag, event
timestamps, re-records, capture, replays of external events, capture modes, per-thread
devices and contexts, and its stand-in for ``torch.cuda`` once installed."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cuda_sim import CAPTURE_MODES, CudaCaptureError, CudaSim, SimEvent, SimStream
from tests.helpers import parameters


def timed(sim: CudaSim, *ms: float, stream: SimStream | None = None) -> tuple[SimEvent, SimEvent]:
    """A start and an end event around kernels of ``ms`` each."""
    start, end = sim.Event(enable_timing=True), sim.Event(enable_timing=True)
    start.record(stream)
    for m in ms:
        sim.launch(m, stream)
    end.record(stream)
    return start, end


def in_thread(name: str, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread called ``name``; its result, or its exception raised here."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as e:  # raised again on the test's thread
            out["error"] = e

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def contexts_of(sim: CudaSim, thread: str) -> set[int]:
    return {d for name, d in sim.contexts if name == thread}


# --- device time -------------------------------------------------------------------------


def test_work_runs_once_the_host_is_lag_steps_ahead():
    sim = CudaSim(lag=2)
    start, end = timed(sim, 3.0)  # host step 0
    sim.step()  # one step ahead: not yet
    assert not start.query() and not end.query() and sim.pending() == 3
    late = timed(sim, 1.0)[1]  # enqueued at step 1: due at step 3
    sim.step()
    assert start.query() and end.query() and not late.query()
    assert sim.clock(0) == 3.0
    sim.step()
    assert late.query() and sim.pending() == 0


def test_with_lag_zero_work_completes_as_it_is_enqueued():
    sim = CudaSim(lag=0)
    start, end = timed(sim, 2.0)
    assert end.query() and start.elapsed_time(end) == 2.0


def test_elapsed_time_is_the_sum_of_the_kernels_between_the_records():
    sim = CudaSim(lag=1)
    sim.launch(5.0)  # before the start: not counted
    start, end = timed(sim, 1.5, 2.5)
    sim.launch(7.0)  # after the end: not counted
    with pytest.raises(RuntimeError, match="must be completed"):  # cudaErrorNotReady
        start.elapsed_time(end)
    sim.drain()
    assert start.elapsed_time(end) == pytest.approx(4.0)
    assert sim.clock(0) == pytest.approx(16.0)


def test_event_synchronize_runs_the_device_up_to_its_record_only():
    sim = CudaSim(lag=5)
    _, end = timed(sim, 1.0)
    sim.launch(2.0)
    later = sim.Stream().record_event()
    end.synchronize()
    assert end.query() and not later.query() and sim.pending() == 2


def test_elapsed_time_refuses_events_without_timing_or_never_recorded():
    sim = CudaSim(lag=0)
    plain, timing, never = sim.Event(), sim.Event(enable_timing=True), sim.Event(enable_timing=True)
    plain.record()
    timing.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        plain.elapsed_time(timing)
    with pytest.raises(ValueError, match="must be recorded"):  # torch 2.13: ValueError
        timing.elapsed_time(never)
    assert never.query()  # torch: an event never recorded has nothing to wait for
    never.synchronize()


def test_recording_again_replaces_the_pending_record():
    sim = CudaSim(lag=1)
    start, end = timed(sim, 1.0)
    sim.step()
    assert start.elapsed_time(end) == 1.0
    sim.launch(4.0)
    end.record()  # the old timestamp is gone: the event waits for its new record
    assert not end.query()
    with pytest.raises(RuntimeError, match="must be completed"):
        start.elapsed_time(end)
    sim.step()
    assert start.elapsed_time(end) == 5.0


def test_an_old_record_running_does_not_complete_a_re_recorded_event():
    sim = CudaSim(lag=2)
    ref, ev = sim.Event(enable_timing=True), sim.Event(enable_timing=True)
    ref.record()
    ev.record()
    sim.step()
    sim.launch(3.0)
    ev.record()
    sim.step()  # the first record of ev runs now, the second not yet
    assert ref.query() and not ev.query()
    sim.step()
    assert ref.elapsed_time(ev) == 3.0


# --- streams and devices -------------------------------------------------------------------


def test_the_current_stream_is_per_thread_and_per_device():
    sim = CudaSim()
    side = sim.Stream()
    assert sim.current_stream() is sim.default_stream() and sim.default_stream().is_default
    with sim.stream(side):
        assert sim.current_stream() is side
        assert in_thread("other", sim.current_stream) is sim.default_stream()
    assert sim.current_stream() is sim.default_stream()
    on1 = sim.Stream(device=1)
    assert on1.device == torch.device("cuda", 1)
    with sim.stream(on1):  # as torch: the stream's device becomes current for the block
        assert sim.current_device() == 1 and sim.current_stream() is on1
    assert sim.current_device() == 0 and sim.current_stream(1) is sim.default_stream(1)


def test_stream_query_synchronize_and_waits():
    sim = CudaSim(lag=3)
    a, b = sim.Stream(), sim.Stream()
    sim.launch(2.0, a)
    assert not a.query() and b.query()
    b.wait_stream(a)
    done = b.record_event()
    a.synchronize()
    assert a.query() and not b.query() and not done.query()
    b.synchronize()
    assert done.query() and sim.pending() == 0


def test_a_wait_for_another_devices_event_orders_the_devices():
    sim = CudaSim(lag=1)
    on1 = sim.Stream(device=1)
    sim.launch(10.0)
    on1.wait_event(sim.current_stream().record_event())
    sim.launch(1.0, on1)
    sim.step()
    assert sim.clock(1) == 11.0  # device 1 ran its kernel after device 0's record


def test_an_event_belongs_to_the_device_of_its_first_record():
    sim = CudaSim(lag=0)
    ev = sim.Event()
    assert ev.device is None  # torch creates the CUDA event lazily
    ev.record(sim.Stream(device=1))
    assert ev.device == torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match="does not match recording stream's device 0"):
        ev.record()


def test_each_thread_has_its_own_current_device_and_uses_contexts_there():
    sim = CudaSim(lag=0)
    sim.set_device(1)
    start, end = timed(sim, 1.0)  # on device 1
    assert start.device_index == 1 and sim.current_device() == 1
    assert in_thread("fresh", sim.current_device) == 0  # never set: device 0
    in_thread("careless", end.query)
    in_thread("careless-timing", lambda: start.elapsed_time(end))

    def careful() -> bool:
        with sim.device(end.device_index):
            return end.query()

    assert in_thread("careful", careful)
    assert contexts_of(sim, "fresh") == set()  # asking for the device makes no context
    # CUDA made a context on device 0 for the threads that read device-1 events from there;
    # torch's elapsed_time then switches to the events' device
    assert contexts_of(sim, "careless") == {0}
    assert contexts_of(sim, "careless-timing") == {0, 1}
    assert contexts_of(sim, "careful") == {1}
    assert contexts_of(sim, "MainThread") == {1}
    assert sim.calls[("careless-timing", "Event.elapsed_time")] == 1
    assert sim.calls[("careful", "Event.query")] == 1


# --- CUDA graphs ----------------------------------------------------------------------------


def test_capture_puts_launches_in_the_graph_and_runs_nothing():
    sim = CudaSim(lag=0)
    graph, side = sim.CUDAGraph(), sim.Stream()
    with sim.stream(side):
        graph.capture_begin()
        assert sim.is_current_stream_capturing()
        assert not in_thread("other", sim.is_current_stream_capturing)
        sim.launch(1.0)
        sim.launch(2.0)
        graph.capture_end()
    sim.drain()
    assert sim.clock(0) == 0.0 and sim.pending() == 0 and not sim.is_current_stream_capturing()
    graph.replay()
    graph.replay()
    assert sim.clock(0) == 6.0 and sim.replays[graph] == 2


def test_capture_refuses_the_default_stream():
    sim = CudaSim()
    with pytest.raises(RuntimeError, match="non-default stream"):
        sim.CUDAGraph().capture_begin()


def test_each_replay_records_the_external_events_again():
    sim = CudaSim(lag=1)
    graph = sim.CUDAGraph()
    start, end = (sim.Event(enable_timing=True, external=True) for _ in range(2))
    ref = sim.current_stream().record_event(sim.Event(enable_timing=True))
    with sim.graph(graph):
        start.record()
        sim.launch(2.0)
        end.record()
        sim.launch(1.0)
    graph.replay()
    assert not end.query()
    sim.step()
    assert (ref.elapsed_time(start), ref.elapsed_time(end)) == (0.0, 2.0)  # replay 1
    sim.launch(4.0)
    graph.replay()
    assert not end.query()  # the replay recorded it again
    sim.step()
    assert (ref.elapsed_time(start), ref.elapsed_time(end)) == (7.0, 9.0)  # replay 2
    assert sim.replays[graph] == 2


def test_a_non_external_event_recorded_in_a_capture_is_no_timing_record():
    """Its record is no node: a replay runs the kernel, not the record; reading it after
    the capture is an error (recorded even where the caller swallows it)."""
    sim = CudaSim(lag=0)
    graph = sim.CUDAGraph()
    start, end = timed(sim)  # eager timestamps first
    with sim.graph(graph):
        start.record()
        sim.launch(2.0)
        end.record()
    graph.replay()
    assert sim.clock(0) == 2.0  # the kernel replayed; the events did not
    for read in (end.query, end.synchronize, lambda: start.elapsed_time(end)):
        with pytest.raises(CudaCaptureError, match="StreamCaptureUnsupported"):
            read()
    assert [call for _, call, _ in sim.violations] == [
        "Event.query", "Event.synchronize", "Event.elapsed_time"]
    start.record()  # recorded again eagerly: readable again
    end.record()
    assert end.query() and start.elapsed_time(end) == 0.0


def test_an_external_event_captured_but_not_replayed_is_queryable_without_a_time():
    sim = CudaSim(lag=0)
    graph = sim.CUDAGraph()
    start, end = (sim.Event(enable_timing=True, external=True) for _ in range(2))
    with sim.graph(graph):
        start.record()
        end.record()
    assert end.query() and sim.violations == []
    with pytest.raises(RuntimeError, match="no timestamp"):
        start.elapsed_time(end)


def test_replaying_a_graph_whose_event_was_freed_is_a_use_after_free():
    """A record node holds the event's handle, not the event: the graph does not keep it
    alive, and a replay after it was freed is recorded as a violation."""
    import gc

    sim = CudaSim(lag=0)
    kept, freed = sim.CUDAGraph(), sim.CUDAGraph()
    for graph in (kept, freed):
        events = [sim.Event(enable_timing=True, external=True) for _ in range(2)]
        with sim.graph(graph):
            events[0].record()
            sim.launch(1.0)
            events[1].record()
        if graph is kept:
            alive = events
    del events
    gc.collect()
    kept.replay()
    assert sim.violations == [] and alive[0].elapsed_time(alive[1]) == 1.0
    freed.replay()
    assert [(call, "use after free" in why) for _, call, why in sim.violations] == [
        ("CUDAGraph.replay", True), ("CUDAGraph.replay", True)]


def test_an_op_starts_no_earlier_than_the_host_enqueued_it():
    """A device the host does not keep busy idles: an op starts at max(device clock, host
    time at enqueue), so a pair around host gaps spans them; a device with work queued
    runs it back to back, whatever the host does meanwhile."""
    sim = CudaSim(lag=0)
    start, end = timed(sim)
    start.record()
    for _ in range(3):
        sim.host(1.0)  # the host takes 1 ms per launch; the kernels 0.1 ms each
        sim.launch(0.1)
    end.record()
    assert start.elapsed_time(end) == pytest.approx(3.1)  # host gaps included
    assert sim.host_clock_ns() == 3_000_000
    busy = CudaSim(lag=1)
    start, end = timed(busy)
    busy.launch(5.0)  # queued ahead: the device is busy while the host launches
    start.record()
    for _ in range(3):
        busy.host(1.0)
        busy.launch(2.0)
    end.record()
    busy.step()
    assert start.elapsed_time(end) == pytest.approx(6.0)  # the kernels only


def test_a_capture_takes_the_launches_of_another_thread_on_its_stream():
    """vLLM's micro-batching: the main thread holds the capture, micro-batch threads run
    the model on the capture's stream (relaxed enough not to query): their launches are
    the graph's, and a replay runs them."""
    import threading

    sim = CudaSim(lag=0)
    graph = sim.CUDAGraph()
    stream = sim.Stream()
    with sim.graph(graph, stream=stream):
        def worker():
            sim.exchange_capture_mode("relaxed")
            with sim.stream(stream):
                assert sim.is_current_stream_capturing()
                sim.launch(2.0)

        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert sim.clock(0) == 0.0 and sim.violations == []
    graph.replay()
    assert sim.clock(0) == 2.0


def test_a_stream_waiting_for_a_captured_event_joins_the_capture():
    sim = CudaSim(lag=0)
    graph, helper = sim.CUDAGraph(), sim.Stream()
    with sim.graph(graph):
        helper.wait_event(sim.current_stream().record_event())  # fork
        sim.launch(3.0, helper)
        with sim.stream(helper):
            assert sim.is_current_stream_capturing()
        sim.current_stream().wait_stream(helper)  # join
    assert sim.clock(0) == 0.0 and helper.query()
    graph.replay()
    assert sim.clock(0) == 3.0


def test_torch_cuda_graph_runs_on_the_simulator_once_installed():
    sim = CudaSim(lag=1)
    real_event = torch.cuda.Event
    with pytest.MonkeyPatch.context() as mp:
        sim.install(mp)
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2
        assert torch.cuda.get_device_name() == "NVIDIA H200 (simulated)"
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        graph = torch.cuda.CUDAGraph()
        sim.launch(1.0)
        with torch.cuda.graph(graph):
            assert torch.cuda.is_current_stream_capturing()
            assert torch.cuda.current_stream() is not torch.cuda.default_stream()
            start.record()
            sim.launch(2.0)
            end.record()
        assert sim.calls[("MainThread", "synchronize")] == 1 and sim.clock(0) == 1.0
        assert not torch.cuda.is_current_stream_capturing()
        graph.replay()
        sim.step()
        assert start.elapsed_time(end) == 2.0 and isinstance(graph, sim.CUDAGraph)
    assert torch.cuda.Event is real_event  # undone with the monkeypatch


def test_each_simulator_has_its_own_classes():
    # code under test patches methods on the graph class: that must stay with one test
    assert CudaSim().CUDAGraph is not CudaSim().CUDAGraph


# --- capture modes and violations -------------------------------------------------------------

UNSAFE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "Event.query": lambda o: o["end"].query(),
    "Event.synchronize": lambda o: o["end"].synchronize(),
    "Event.elapsed_time": lambda o: o["start"].elapsed_time(o["end"]),
    "Stream.query": lambda o: o["other"].query(),
    "Stream.synchronize": lambda o: o["other"].synchronize(),
}


def begin_capture(sim: CudaSim, mode: str) -> Any:
    """A capture on a side stream of this thread, which stays current."""
    graph = sim.CUDAGraph()
    sim.set_stream(sim.Stream())
    graph.capture_begin(capture_error_mode=mode)
    return graph


@pytest.mark.parametrize("call", sorted(UNSAFE))
@pytest.mark.parametrize(("mode", "own_refused", "other_refused"),
                         [("global", True, True), ("thread_local", True, False),
                          ("relaxed", False, False)])
@pytest.mark.parametrize("caller", ["own", "other"])
def test_capture_modes_prohibit_unsafe_calls(call, mode, own_refused, other_refused, caller):
    sim = CudaSim(lag=0)
    start, end = timed(sim, 1.0)  # eager work, outside any capture
    other = sim.Stream()
    sim.launch(1.0, other)
    graph = begin_capture(sim, mode)
    objects = {"start": start, "end": end, "other": other}
    thread = "MainThread" if caller == "own" else "reader"
    refused = own_refused if caller == "own" else other_refused
    run = (lambda: UNSAFE[call](objects)) if caller == "own" else \
        (lambda: in_thread(thread, lambda: UNSAFE[call](objects)))
    if not refused:
        run()
        graph.capture_end()
        assert sim.violations == []
        return
    with pytest.raises(CudaCaptureError, match="operation not permitted when stream is capturing"):
        run()
    assert [(name, c) for name, c, _ in sim.violations] == [(thread, call)]
    with pytest.raises(CudaCaptureError, match="cudaErrorStreamCaptureInvalidated"):
        graph.capture_end()
    assert not sim.is_current_stream_capturing()  # the capture ended all the same
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()


CONFLICTS: dict[str, Callable[[CudaSim, SimStream, SimEvent], Any]] = {
    "Stream.query": lambda sim, s, ev: s.query(),
    "Stream.synchronize": lambda sim, s, ev: s.synchronize(),
    "Event.query": lambda sim, s, ev: ev.query(),
    "Event.synchronize": lambda sim, s, ev: ev.synchronize(),
    "Event.elapsed_time": lambda sim, s, ev: ev.elapsed_time(ev),
    "synchronize": lambda sim, s, ev: sim.synchronize(),
}


@pytest.mark.parametrize("call", sorted(CONFLICTS))
def test_the_capturing_stream_its_events_and_its_device_are_off_limits_even_relaxed(call):
    sim = CudaSim(lag=0)
    graph = begin_capture(sim, "relaxed")
    ev = sim.current_stream().record_event(sim.Event(enable_timing=True))
    with pytest.raises(CudaCaptureError):
        CONFLICTS[call](sim, sim.current_stream(), ev)
    assert [c for _, c, _ in sim.violations] == [call]
    with pytest.raises(CudaCaptureError, match="Invalidated"):
        graph.capture_end()


def test_a_thread_in_relaxed_mode_ignores_other_threads_global_captures():
    sim = CudaSim(lag=0)
    _, end = timed(sim, 1.0)
    graph = begin_capture(sim, "global")

    def relaxed_read() -> bool:
        sim.exchange_capture_mode("relaxed")
        return end.query()

    assert in_thread("relaxed", relaxed_read)
    graph.capture_end()
    assert sim.violations == [] and CAPTURE_MODES == ("global", "thread_local", "relaxed")


def test_a_swallowed_violation_is_recorded_and_fails_the_capture():
    sim = CudaSim(lag=0)
    _, end = timed(sim, 1.0)
    graph = sim.CUDAGraph()

    def flush() -> None:  # as code under test does: log and go on
        try:
            end.query()
        except RuntimeError:
            pass

    with pytest.raises(CudaCaptureError, match="cudaErrorStreamCaptureInvalidated"):
        with sim.graph(graph):
            sim.launch(1.0)
            in_thread("fxflops-flush", flush)
            with pytest.raises(CudaCaptureError, match="Invalidated"):
                sim.launch(1.0)  # CUDA refuses further work in an invalidated capture
    assert sim.violations == [("fxflops-flush", "Event.query",
                               "thread 'MainThread' has an ongoing global capture")]
    assert sim.calls[("fxflops-flush", "Event.query")] == 1


@pytest.mark.parametrize(("mode", "refused"), [("global", True), ("relaxed", False)])
def test_a_non_relaxed_capture_must_end_on_its_own_thread(mode, refused):
    sim = CudaSim(lag=0)
    graph = begin_capture(sim, mode)
    if not refused:
        in_thread("ender", graph.capture_end)
        assert sim.violations == []
        return
    with pytest.raises(CudaCaptureError, match="WrongThread"):
        in_thread("ender", graph.capture_end)
    with pytest.raises(CudaCaptureError, match="Invalidated"):
        graph.capture_end()


def test_a_flush_thread_and_a_host_thread_together():
    """Driven from two threads at once: no torn state, every record read."""
    sim = CudaSim(lag=2)
    pairs: list[tuple[SimEvent, SimEvent]] = []
    read: list[float] = []
    stop = threading.Event()

    def flush() -> None:
        while not stop.is_set() or pairs:
            if pairs and pairs[0][1].query():
                start, end = pairs.pop(0)
                read.append(start.elapsed_time(end))

    reader = threading.Thread(target=flush, name="fxflops-flush")
    reader.start()
    for _ in range(200):
        pairs.append(timed(sim, 0.5))
        sim.step()
    sim.drain()
    stop.set()
    reader.join(timeout=10)
    assert not reader.is_alive() and read == [0.5] * 200 and sim.violations == []


# --- the simulator's calls are torch.cuda's -------------------------------------------------

# torch.cuda's signatures, read in a fresh interpreter: torch as installed, not as other
# libraries of this process left it (vLLM's CPU worker replaces torch.cuda.Event for good)
_TORCH_SIDE = """
import inspect, json, sys
import torch
from tests.helpers import parameters as params
spec = json.loads(sys.argv[1])
out = {}
for name, methods in spec.items():
    real = getattr(torch.cuda, name)
    if methods is not None:  # a class the simulator stands in for: torch's __new__
        out[name + "()"] = params(real.__new__, True)
        for m in methods:
            fn = getattr(real, m, None)
            out[name + "." + m] = params(fn, True) if inspect.isfunction(fn) else None
    elif inspect.isclass(real):  # torch.cuda.graph, torch.cuda.device: context classes
        out[name] = params(real.__init__, True)
    else:
        out[name] = params(real, False)
print(json.dumps(out))
"""


def _agrees(sim: list[Any], real: list[Any] | None) -> str | None:
    """Why a call the simulator accepts could mean something else to torch, or None: the
    simulator's parameters must be the real ones' first (names, kinds, defaults), and the
    real one's others optional."""
    if real is None:
        return "torch has no such method"
    for i, (name, kind, default) in enumerate(sim):
        if i >= len(real):
            return f"{name}: torch has no such parameter"
        r_name, r_kind, r_default = real[i]
        if (name, kind) != (r_name, r_kind):
            return f"parameter {i}: {name} ({kind}) where torch has {r_name} ({r_kind})"
        if default != r_default:
            return f"{name}: default {default} where torch's is {r_default}"
    required = [r[0] for r in real[len(sim):]
                if r[2] is None and r[1] not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
    return f"torch also requires {required}" if required else None


def test_the_simulator_is_called_as_the_installed_torch_cuda_is():
    """Each ``torch.cuda`` name the simulator stands in for (``TORCH_NAMES``), and each method
    of its event, stream and graph classes, takes the parameters the installed torch's does:
    the same names, order, kinds and defaults, torch's later ones optional. So a call that
    fxflops makes of the simulator (``Event(enable_timing=True, external=True)``,
    ``capture_begin(pool, capture_error_mode=...)``) is one the real torch takes and reads
    alike, on each torch CI runs (the CPU build's ``torch.cuda`` keeps these Python
    signatures too)."""
    import inspect
    import json
    import sys

    from tests import procs
    from tests.cuda_sim import TORCH_NAMES, SimGraph

    sim = CudaSim()
    classes = {"Event": SimEvent, "Stream": SimStream, "CUDAGraph": SimGraph}
    ours: dict[str, list[Any]] = {}
    spec: dict[str, list[str] | None] = {}
    for name in TORCH_NAMES:
        if name in classes:
            ours[name + "()"] = parameters(classes[name].__init__, True)
            methods = [attr for attr, fn in vars(classes[name]).items()
                       if inspect.isfunction(fn) and not attr.startswith("_")]
            spec[name] = methods
            for attr in methods:
                ours[f"{name}.{attr}"] = parameters(getattr(classes[name], attr), True)
        else:  # bound on the simulator
            spec[name] = None
            ours[name] = parameters(getattr(sim, name), False)
    proc = procs.run([sys.executable, "-c", _TORCH_SIDE, json.dumps(spec)], timeout=120,
                     cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(theirs) == set(ours) and len(ours) >= len(TORCH_NAMES) + 10
    differ = {label: why for label in ours
              if (why := _agrees(ours[label], theirs[label] and [tuple(p) for p in theirs[label]]))}
    assert differ == {}, f"torch {torch.__version__}: {differ}"


def test_the_signature_check_finds_a_parameter_torch_lacks():
    """The check above can fail: a stand-in whose parameter torch does not have, or whose
    default differs, is named."""
    def event(enable_timing=False, blocking=False, interprocess=False, external=False,
              graph_safe=False):
        pass

    def capture_begin(self, pool=None, capture_error_mode="thread_local"):
        pass

    real_event = [("enable_timing", "POSITIONAL_OR_KEYWORD", "False"),
                  ("blocking", "POSITIONAL_OR_KEYWORD", "False"),
                  ("interprocess", "POSITIONAL_OR_KEYWORD", "False"),
                  ("external", "POSITIONAL_OR_KEYWORD", "False")]
    assert _agrees(parameters(event, False), real_event) == \
        "graph_safe: torch has no such parameter"
    real_begin = [("pool", "POSITIONAL_OR_KEYWORD", "None"),
                  ("capture_error_mode", "POSITIONAL_OR_KEYWORD", "'global'")]
    assert "default 'thread_local'" in _agrees(parameters(capture_begin, True), real_begin)
    assert _agrees(parameters(capture_begin, True), None) == "torch has no such method"
