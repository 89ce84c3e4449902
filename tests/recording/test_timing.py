"""The CUDA-event clock, on the CUDA simulator (tests/cuda_sim.py): this machine has no GPU,
so a simulated ``torch.cuda`` stands in, one that keeps CUDA's documented rules (a device
that runs behind the host, events done only when the device reaches them, captures that
forbid waits and queries, a current device per thread) and records every illegal call
even when fxflops swallows its error. The real thing is checked by scripts/gpu_check.py on
a GPU and by the GPU-only test at the end.

What is checked: a call is counted when it is made and timed when its events are read;
nothing waits for the device on the calling thread; past the in-flight cap samples are
lost, never calls; replays are counted in the phase they are replayed in, every one,
whatever the device's lag; at least 90% of replays are timed with the device two replays
behind; no query, wait or profile while any thread captures; fxflops' own thread reads
events on their device; a replay's host cost does not grow with the calls it holds.
"""

from __future__ import annotations

import collections
import re
import threading

import pytest
import torch

import fxflops
from fxflops import config, torch_compat
from fxflops.instrument import wrap
from fxflops.recording import cuda_events, phases
from fxflops.recording.size_stats import SizeStats
from fxflops.report.files import load_reports
from tests.cuda_sim import CudaSim
from tests.helpers import RowsByPhase, captured_linears, compile_on_sim, on_device


@pytest.fixture
def sim():
    """A simulated CUDA runtime with the device two host steps behind."""
    simulator = CudaSim(lag=2, devices=2)
    yield simulator
    cuda_events._CLOCKS.pop(simulator.CUDAGraph, None)


def test_a_call_is_counted_when_made_and_timed_when_read(sim):
    clock = cuda_events.clock(sim)
    row = SizeStats((1,), 1)
    for _ in range(3):
        clock.time_call(lambda: sim.launch(1.0), (), row)
    # counted at once; no sample yet (the device is two steps behind), nothing waited for
    assert (row.count, row.samples_taken, row.awaiting) == (3, 0, 3)
    assert not [c for c in sim.calls if c[1] in ("Event.synchronize", "synchronize")]
    sim.step(2)
    clock.time_call(lambda: sim.launch(1.0), (), row)  # reads what finished, oldest first
    assert (row.count, row.samples_taken) == (4, 3)
    assert list(row.samples()) == [1_000_000] * 3  # each call's kernel: 1 ms
    sim.drain()
    assert clock.collect().samples == 1 and row.samples_taken == 4 and row.awaiting == 0


def test_past_the_in_flight_cap_samples_are_lost_never_calls(sim):
    clock = cuda_events.clock(sim)
    clock.queue.max_in_flight = 4
    row = SizeStats((1,), 1)
    for _ in range(10):  # nothing finishes: the oldest pairs are given up, never waited for
        clock.time_call(lambda: sim.launch(1.0), (), row)
    assert row.count == 10 and len(clock.queue.pending) == 4
    assert row.lost == 6 and clock.queue.dropped == 6
    sim.drain()  # the device catches up; a flush reads the 4 still in flight
    clock.collect(wait_s=1.0)
    assert row.count == 10 and row.samples_taken == 4 and row.lost == 6 and row.awaiting == 0


def test_a_collection_waits_a_bounded_time_for_a_hung_device(sim):
    """The device never gets to the calls (hung): a flush polls until its deadline, never
    synchronises, and says how many samples are still in flight."""
    import time

    clock = cuda_events.clock(sim)
    row = SizeStats((1,), 1)
    clock.time_call(lambda: sim.launch(1.0), (), row)
    t0 = time.monotonic()
    got = clock.collect(wait_s=0.3)
    assert 0.25 <= time.monotonic() - t0 < 2.0
    assert got.in_flight == 1 and row.count == 1 and row.samples_taken == 0
    assert not [c for c in sim.calls if "synchronize" in c[1]]


def test_calls_in_the_report_equal_calls_made_after_a_flush(sim, monkeypatch, tmp_path):
    """Through torch.compile: a graph on the (simulated) GPU, N calls, the last ones still in
    flight when the report is written: the report says N calls; after the device caught up,
    a flush says N timed."""
    compile_on_sim(monkeypatch, sim)
    compiled = torch.compile(torch.nn.Linear(8, 8),
                             backend=fxflops.backend(inner=on_device(sim, 1.0)))
    x = torch.randn(4, 8)
    n = 300
    with torch.no_grad():
        for _ in range(n):
            compiled(x)
            sim.step()
    path = fxflops.recorder().save(tmp_path / "r.json")
    (graph,) = fxflops.load_report(path)["graphs"]
    (row,) = graph["rows"]
    # the device runs two host steps behind: the last call (made at step n - 1) is still
    # running at step n, counted and not timed
    assert row["calls"] == n and row["timed_calls"] == n - 1
    sim.drain()
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    fxflops.recorder().flush()
    (report,) = load_reports([tmp_path / "out"])
    (row,) = report["graphs"][0]["rows"]
    assert row["calls"] == n and row["timed_calls"] == n and row["lost_samples"] == 0
    assert row["median_ms"] == 1.0
    assert report["timing"]["in_flight"] == 0


def captured_pieces(sim, clock, records: list[RowsByPhase], size: int, ms: float = 0.5):
    """A CUDA graph captured (in vLLM's "capture" warm-up phase) around one call of each
    record's graph at ``size`` tokens (several: a FULL graph's pieces)."""
    g = sim.CUDAGraph()
    with phases.warmup("capture"), sim.graph(g):
        for record in records:
            clock.time_call(lambda: sim.launch(ms), (), None, record, size)
    return g


@pytest.mark.parametrize("every", [1, 32])
@pytest.mark.parametrize("pieces", [1, 8])
def test_replays_count_where_they_are_served_and_are_timed(sim, monkeypatch, pieces, every):
    """A graph captured in the capture phase, replayed 200 times while serving with the
    device two replays behind, 5 more times in a warm-up: the serving rows count the 200
    replays and the warm-up rows the 5, none in the capture phase; with one call per graph
    (vLLM's piecewise graphs) at least 90% of the replays chosen are timed (every replay
    with FXFLOPS_REPLAY_SAMPLE_EVERY=1; else a sample: tests/recording/test_replay_sampling.py);
    with several (a FULL graph, whose replay is the whole forward) the per-call times are
    what could be read, and the rest is counted lost."""
    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", str(every))  # read at the capture
    clock = cuda_events.clock(sim)
    records = [RowsByPhase() for _ in range(pieces)]
    g = captured_pieces(sim, clock, records, size=8)
    assert all(r.count == 0 for record in records for r in record.rows.values())
    for _ in range(200):
        g.replay()
        sim.step()
    with phases.warmup("warmup"):
        for _ in range(5):
            g.replay()
            sim.step()
    sim.drain()
    clock.collect(wait_s=1.0, final=True)
    for record in records:
        serving = record.rows[(phases.SERVING, 8)]
        warm = record.rows[("warmup", 8)]
        assert serving.count == 200 and warm.count == 5
        assert ("capture", 8) not in record.rows or record.rows[("capture", 8)].count == 0
        if pieces == 1:
            if every == 1:
                assert serving.chosen == 200
            else:  # the first 16, then one in 16 to 48 replays
                assert 16 + 184 // 48 <= serving.chosen <= 16 + 184 // 16 + 1
            assert serving.samples_taken >= 0.9 * serving.chosen and serving.lost == 0
            assert serving.samples_taken + serving.lost == serving.chosen
            assert set(serving.samples()) == {500_000}  # the piece's 0.5 ms
        else:
            assert serving.samples_taken + serving.lost == serving.count
    assert sim.violations == []


def test_a_replays_host_cost_does_not_grow_with_the_calls_it_holds(sim):
    """CUDA calls per replay of a FULL graph (many calls) are as few as a piecewise
    graph's: no query per held call."""
    clock = cuda_events.clock(sim)

    def cuda_calls_per_replay(pieces: int) -> float:
        g = captured_pieces(sim, clock, [RowsByPhase() for _ in range(pieces)], size=pieces)
        before = sum(sim.calls.values())
        for _ in range(50):
            g.replay()
            sim.step()
        return (sum(sim.calls.values()) - before) / 50

    one, many = cuda_calls_per_replay(2), cuda_calls_per_replay(200)
    assert many <= one + 0.5, (one, many)  # amortised: one read of all 200 per 200 replays


def test_nothing_is_queried_or_waited_for_while_any_thread_captures(sim):
    """A global-mode capture on the main thread: a flush on another thread skips its round
    (no query, no wait: each would invalidate the capture), an eager call on a third thread
    reads nothing; the capture ends cleanly and its replays count."""
    clock = cuda_events.clock(sim)
    row = SizeStats((2,), 2)
    clock.time_call(lambda: sim.launch(1.0), (), row)  # a pair in flight
    record = RowsByPhase()
    g = sim.CUDAGraph()
    results = {}

    def flush():
        results["flush"] = clock.collect(wait_s=0.2)

    def eager():
        clock.time_call(lambda: sim.launch(1.0), (), row)

    with sim.graph(g):
        clock.time_call(lambda: sim.launch(0.5), (), None, record, 4)
        for target in (flush, eager):
            t = threading.Thread(target=target, name=target.__name__)
            t.start()
            t.join()
    assert results["flush"].skipped_capture
    assert sim.violations == []
    g.replay()
    sim.drain()
    clock.collect(final=True)
    assert record.rows[(phases.SERVING, 4)].count == 1 and row.samples_taken == 2


def test_fxflops_thread_reads_events_on_their_device(sim):
    """Calls on device 1; the flush thread (which never set a device) reads their events on
    device 1, and makes no CUDA context on device 0."""
    clock = cuda_events.clock(sim)
    sim.set_device(1)
    try:
        row = SizeStats((1,), 1)
        for _ in range(3):
            clock.time_call(lambda: sim.launch(1.0), (), row)
        sim.drain()
        t = threading.Thread(target=clock.collect, name="fxflops-flush")
        t.start()
        t.join()
    finally:
        sim.set_device(0)
    assert row.samples_taken == 3
    devices = {device for thread, device in sim.contexts if thread == "fxflops-flush"}
    assert devices == {1}


def test_kernel_profiling_never_runs_while_a_graph_is_captured(sim, monkeypatch):
    """``kernels=N``: the profiler waits for the device, which a capture forbids: a call
    made while capturing is captured, not profiled; an eager serving call is profiled."""
    from fxflops.cost.kernels import KernelCost
    from fxflops.recording import kernel_profile

    profiled = []

    def profile(call, row, kernels, device):
        sim.synchronize()  # what the real profiler does on a GPU
        profiled.append(row.size)
        return call(), True

    monkeypatch.setattr(kernel_profile, "profile", profile)
    compile_on_sim(monkeypatch, sim)
    gm = torch.fx.symbolic_trace(lambda x: x * 2)
    x = torch.randn(4)
    graph_plan = wrap.plan(gm, [x])
    graph_plan.kernels = [KernelCost("cpp_fused_mul_0", 0, ("mul",), 4, 0, 32)]
    compiled = wrap.wrap_graph(lambda: on_device(sim, 1.0)(gm, [x]), "g", {}, gm=gm,
                               example_inputs=[x], graph_plan=graph_plan, kernels=wrap.KernelSetting(2))
    g = sim.CUDAGraph()
    with phases.warmup("capture"), sim.graph(g):
        compiled(x)
    assert profiled == [] and sim.violations == []
    with phases.warmup("warmup"):
        compiled(x)  # a warm-up call: not profiled either
    compiled(x)
    assert profiled == [4] and sim.violations == []


def test_a_graph_that_gives_up_is_reported_with_its_calls(monkeypatch):
    """fxflops fails on a graph mid-run: it runs on as compiled, and the report names it in
    ``uninstrumented`` with the calls it made since."""
    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    compiled(torch.randn(3))
    (graph,) = [g for g in fxflops.recorder().graphs]

    def broken(raw_key):
        raise RuntimeError("row exploded")

    monkeypatch.setattr(graph, "row", broken)
    for n in (5, 6, 7):  # new sizes: the row is made, and fails
        assert torch.equal(compiled(torch.ones(n)), torch.ones(n) + 1)
    report = fxflops.recorder().to_dict()
    (entry,) = report["uninstrumented"]
    assert entry["name"] == graph.name and "row exploded" in entry["reason"]
    assert entry["calls"] == 3


def test_through_torch_compile_the_object_keeps_its_rules(monkeypatch):
    """Through torch.compile, Dynamo calls the object the backend returned (its plain
    ``__call__``): a warm-up phase's calls go to that phase's rows; once the graph gave up,
    every call (at a known size too) is counted as uninstrumented, none timed."""
    made: list = []

    def capture(gm, example_inputs):
        made.append(fxflops.backend(inner="eager")(gm, example_inputs))
        return made[-1]

    compiled = torch.compile(lambda x: x * 2, backend=capture, dynamic=True)
    for n in (3, 4):
        compiled(torch.randn(n))
    (graph,) = made
    assert torch_compat.get("innermost_fn")(graph) is graph  # what Dynamo's wrapper calls
    for n in (3, 3, 4):
        assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 2.0))
    record = graph.record
    assert {r.size: r.count for r in record.rows.values()} == {3: 3, 4: 2}
    with phases.warmup("warmup"):
        compiled(torch.ones(3))
        assert graph._rows is record.rows  # nothing rebound by the phase
    assert {r.size: r.count for r in record.warmup["warmup"].values()} == {3: 1}
    compiled(torch.ones(3))
    assert {r.size: r.count for r in record.rows.values()} == {3: 4, 4: 2}
    assert graph._rows is record.rows  # nothing rebound by the phase

    def broken(raw_key):
        raise RuntimeError("row exploded")

    monkeypatch.setattr(record, "row", broken)
    compiled(torch.ones(5))  # a new size: the graph gives up
    for n in (3, 4):
        assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 2.0))
    assert {r.size: r.count for r in record.rows.values()} == {3: 4, 4: 2}
    (entry,) = fxflops.recorder().to_dict()["uninstrumented"]
    assert entry["calls"] == 3


class SteppingClock:
    """A CPU clock whose k-th timed call lasts (k + 1) us: reads come in pairs around a
    call, the k-th pair 1 s apart from the previous one."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> int:
        k, end = divmod(self.reads, 2)
        self.reads += 1
        return k * 10**9 + end * (k + 1) * 1000


# (every, calls, grad, the calls timed first, the calls timed in all), the last two by hand:
# 16 rounded up to a multiple of ``every``, then one in ``every``
SAMPLING = [(4, 102, False, 16, 38), (4, 102, True, 16, 38), (64, 300, False, 64, 68),
            (10, 100, False, 20, 28)]


@pytest.mark.parametrize("every,calls,grad,first,timed", SAMPLING,
                         ids=["every4-grad-off", "every4-grad-on-boxed", "every64", "every10"])
def test_after_a_sizes_first_calls_one_in_every_is_timed_and_each_call_counted(
        every, calls, grad, first, timed, monkeypatch, tmp_path):
    """Through torch.compile (grad on: AOTAutograd's boxed forward graph), with
    FXFLOPS_SAMPLE_EVERY=4: every call of a size is counted; its first 16 are timed, then
    the 17th, 21st, ... (0-based 16, 20, ...); a sample stands for itself and the 3
    calls after it in the total, and the window holds the samples in the order they were
    taken. With 64, more than the 16 calls timed first: the first 64 are timed, then the
    65th, 129th, ... (a sample never stands for calls before it). With 10, not a power of
    two: the first 20 (16 rounded up to a multiple of 10), then the 21st, 31st, ..."""
    monkeypatch.setenv("FXFLOPS_SAMPLE_EVERY", str(every))  # read when a graph is made
    clock = SteppingClock()
    monkeypatch.setattr(wrap, "now", clock)
    model = torch.nn.Linear(4, 4).requires_grad_(grad)
    inner = "aot_eager" if grad else "eager"  # AOTAutograd's forward graph, or Dynamo's
    compiled = torch.compile(model, backend=fxflops.backend(inner=inner))
    x = torch.randn(3, 4)
    with torch.set_grad_enabled(grad):
        for _ in range(calls):
            assert torch.equal(compiled(x), model(x))
    (graph,) = [g for g in fxflops.recorder().graphs if g.meta.get("phase") != "backward"]
    assert graph.meta.get("phase") == ("forward" if grad else None)
    (row,) = graph.rows.values()
    # by hand: the first calls, then those at multiples of ``every`` (0-based)
    sampled = [n for n in range(first, calls) if n % every == 0]
    assert (row.count, row.samples_taken) == (calls, first + len(sampled)) == (calls, timed)
    assert list(row.samples()) == [(k + 1) * 1000 for k in range(timed)]
    first_ns = sum((k + 1) * 1000 for k in range(first))
    sampled_ns = sum((k + 1) * 1000 * every for k in range(first, timed))
    assert row.total_ns == first_ns + sampled_ns
    # the calls the samples stand for: the calls made, and at most every - 1 ahead of them
    assert calls <= first + every * len(sampled) < calls + every
    path = fxflops.recorder().save(tmp_path / "r.json")
    (saved,) = [r for g in fxflops.load_report(path)["graphs"] for r in g["rows"]
                if g["meta"].get("phase") != "backward"]
    assert (saved["calls"], saved["timed_calls"]) == (calls, timed)
    assert saved["total_ms"] == (first_ns + sampled_ns) / 1e6


def test_sample_every_one_times_every_call(monkeypatch):
    monkeypatch.setenv("FXFLOPS_SAMPLE_EVERY", "1")
    compiled = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))
    for _ in range(200):
        compiled(torch.ones(5))
    (graph,) = fxflops.recorder().graphs
    (row,) = graph.rows.values()
    assert row.count == row.samples_taken == 200


def test_the_hot_path_calls_an_objects_class_call_as_a_slot_call_would():
    """An inner object (Inductor's CompiledFxGraph) is called through its class's
    ``__call__``, bound once: what ``obj(args)`` runs, an instance attribute of that name
    ignored as Python ignores it; a function or builtin is called as it is."""
    class Compiled:
        def __call__(self, args):
            return ("class", args)

    obj = Compiled()
    obj.__call__ = lambda args: ("instance", args)  # never what obj(args) runs
    bound = wrap._bound_call(obj)
    assert bound([1]) == obj([1]) == ("class", [1])
    assert bound.__self__ is obj
    assert wrap._bound_call(len) is len
    assert wrap._bound_call(Compiled) is Compiled  # a class: calling it makes an object

    class Static:
        __call__ = staticmethod(lambda args: ("static", args))

    static = Static()
    assert wrap._bound_call(static) is static and static([2]) == ("static", [2])

    class Inherited(Compiled):
        pass

    inherited = Inherited()
    assert wrap._bound_call(inherited)([3]) == ("class", [3])


@pytest.mark.parametrize("strides", [("4", "64"), ("64", "4"), ("3", "10")])
def test_graphs_of_one_record_under_different_strides_keep_its_total_whole(
        strides, monkeypatch):
    """Two graphs of one record, made under different FXFLOPS_SAMPLE_EVERY values, called
    in turn: every call is counted once, and the total stands for the calls made (each
    sample weighted by the stride it was taken at, never by the other graph's)."""
    captured = {}

    def capture(gm, example_inputs):
        captured["graph"] = fxflops.backend(inner="eager")(gm, example_inputs)
        return captured["graph"]

    x = torch.randn(3)
    torch.compile(lambda t: t + 1, backend=capture)(x)
    graph = captured["graph"]
    clock = iter(range(0, 10**9, 1000))  # every timed call takes 1,000 ns
    monkeypatch.setattr(wrap, "now", lambda: next(clock))
    hots = []
    for every in strides:  # read when a graph is made
        monkeypatch.setenv("FXFLOPS_SAMPLE_EVERY", every)
        hots.append(wrap.InstrumentedGraph(lambda *a: None, graph.record, graph.plan))
    (row,) = graph.record.rows.values()  # its first call, compiled, on the real clock
    count, total_ns, timed = row.count, row.total_ns, row.samples_taken
    for i in range(2000):
        hots[i % 2](x)
    widest = max(int(every) for every in strides)
    assert row.count - count == 2000
    assert 2000 <= (row.total_ns - total_ns) // 1000 < 2000 + widest
    assert 2000 // widest < row.samples_taken - timed < 2000


def calls_made(fn, *args) -> collections.Counter:
    """The Python functions (by file and name) and builtins one call of ``fn`` enters."""
    import sys

    counts: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            counts[(frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name)] += 1
        elif event == "c_call":
            counts[("builtin", getattr(arg, "__qualname__", repr(arg)))] += 1

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    counts.pop(("builtin", "setprofile"), None)
    return counts


@pytest.mark.parametrize("inner,grad", [("eager", False), ("inductor", True),
                                        ("inductor", False)],
                         ids=["eager-dynamo-graph", "inductor-aot-forward-boxed",
                              "inductor-aot-forward-unboxed"])
def test_through_torch_compile_a_call_enters_what_the_floors_does(inner, grad):
    """The overhead benchmark's floor (a backend that only calls the inner, compiled as
    fxflops compiles it) against fxflops, through torch.compile as users call it, grad
    off (Dynamo's graph, eager or Inductor inside) and on (AOTAutograd's boxed forward
    graph, Inductor inside): past a size's first calls, one call enters what the floor's
    does, fxflops' ``__call__`` in place of the floor's one function, and ``next`` (the
    count); a sampled call adds ``_call_sampled``, its two clock reads and the sample's
    ``note`` under the row's lock. Counted, not timed: what benchmarks/overhead.py cannot resolve on a
    noisy host, this pins."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "overhead.py"
    spec = importlib.util.spec_from_file_location("overhead_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch.manual_seed(0)
    # the default stride, and the calls a size times one by one before it (by hand: 16
    # rounded up to a multiple of it)
    every = config.SAMPLE_EVERY.get()
    first = -(-16 // every) * every
    floor = torch.compile(bench.Block(), backend=bench.floor_backend(inner), dynamic=True)
    ours = torch.compile(bench.Block(), backend=fxflops.backend(inner=inner), dynamic=True)
    x = torch.randn(8, 16)
    # both compiled afresh, as fxflops compiles a training graph (AOTAutograd's cache off:
    # torch 2.11 wraps a fresh compile's forward in one more function than a cached one)
    no_cache = torch_compat.get("functorch_config").patch(enable_autograd_cache=False)
    with torch.set_grad_enabled(grad), no_cache:
        for fn in (floor, ours):
            for _ in range(first + 1):  # past the calls timed first; the next is not sampled
                fn(x)
        made = {name: calls_made(fn, x) for name, fn in (("floor", floor), ("ours", ours))}
        for _ in range(every - 2):  # to the next multiple of ``every``: sampled
            ours(x)
        sampled = calls_made(ours, x)
    (graph,) = [g for g in fxflops.recorder().graphs if g.meta.get("phase") != "backward"]
    assert next(iter(graph.rows.values())).count == first + every + 1

    def numbered(counts):  # FX's and fxflops' generated code is numbered
        return collections.Counter({(re.sub(r"(<eval_with_key>)\.\d+$", r"\1",
                                            re.sub(r" #\d+>$", ">", file)), name): n
                                    for (file, name), n in counts.items()})

    floor_made, ours_made = numbered(made["floor"]), numbered(made["ours"])
    assert floor_made - ours_made == collections.Counter({("overhead.py", "call"): 1})
    # the call numbered, one C call (calls from several threads each count)
    assert ours_made - floor_made == collections.Counter({("wrap.py", "__call__"): 1,
                                                          ("builtin", "next"): 1})
    assert numbered(sampled) - ours_made == collections.Counter(
        {("builtin", "perf_counter_ns"): 2, ("wrap.py", "_call_sampled"): 1,
         ("size_stats.py", "note"): 1, ("builtin", "RLock.__exit__"): 1})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_events_time_a_matmul():
    clock = cuda_events.clock()
    row = SizeStats((1,), 1)
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(5):
        clock.time_call(torch.mm, (a, a), row)
    assert row.count == 5
    clock.collect(wait_s=5.0)
    assert row.samples_taken == 5 and len(row.samples()) == 5 and min(row.samples()) > 0


# --- the GPU machinery beyond one thread and one capture: vLLM's micro-batch threads (DBO),
# --- breakable CUDA graphs, a starved device, reads under capture ------------------------


def test_a_call_captured_on_a_micro_batch_thread_is_counted_at_every_replay(sim):
    """vLLM's micro-batching (DBO): the main thread holds the capture, two micro-batch
    threads run the model on its stream. Each call is registered with that capture (no
    thread-local stack of its own), its pair kept alive with the graph, and every replay
    counts both; no use after free, no violation."""
    import gc

    clock = cuda_events.clock(sim)
    records = [RowsByPhase(), RowsByPhase()]
    g = sim.CUDAGraph()
    stream = sim.Stream()

    def micro_batch(record):
        sim.exchange_capture_mode("relaxed")  # (vLLM's threads make no unsafe call)
        with sim.stream(stream):
            clock.time_call(lambda: sim.launch(1.0), (), None, record, 4)

    with sim.graph(g, stream=stream):
        for record in records:
            t = threading.Thread(target=micro_batch, args=(record,))
            t.start()
            t.join()
    gc.collect()  # the captured pairs live as long as the graph, not the call
    for _ in range(3):
        g.replay()
        sim.step()
    sim.drain()
    clock.collect(final=True)
    rows = [r.rows[(phases.SERVING, 4)] for r in records]
    assert [row.count for row in rows] == [3, 3]
    for row in rows:
        assert row.samples_taken + row.lost == 3 and row.samples_taken >= 1
    assert sim.violations == []


def test_a_captured_call_no_capture_can_be_found_for_is_kept_alive_and_said(sim, caplog):
    """Two captures in progress on other threads' streams, a call on a third stream joined
    to one of them, from a thread with no capture of its own: neither its thread, nor its
    stream, nor its device names one capture. fxflops says so once and keeps the pair
    alive (the graph records into it at every replay)."""
    import gc

    clock = cuda_events.clock(sim)
    sim.exchange_capture_mode("relaxed")
    other = sim.Stream()
    a, b = sim.CUDAGraph(), sim.CUDAGraph()
    side = [sim.Stream(), sim.Stream()]
    ready, done = threading.Event(), threading.Event()

    def hold(graph, stream):
        sim.exchange_capture_mode("relaxed")
        with sim.stream(stream):
            graph.capture_begin(capture_error_mode="relaxed")
            ready.set()
            done.wait(5)
            graph.capture_end()

    threads = [threading.Thread(target=hold, args=(g, s)) for g, s in zip((a, b), side)]
    for t in threads:
        t.start()
        ready.wait(5)
        ready.clear()
    with sim.stream(other):
        other.wait_event(side[0].record_event(sim.Event()))  # joins ``a``'s capture
        clock.time_call(lambda: sim.launch(1.0), (), None, RowsByPhase(), 4)
    done.set()
    for t in threads:
        t.join()
    gc.collect()
    assert len(clock.tracker.unowned) == 1
    assert "could not find" in caplog.text
    a.replay()  # records the pair again: alive
    assert sim.violations == []


def test_a_call_split_across_captures_is_timed_over_its_segments(sim):
    """vLLM's breakable CUDA graphs: one call starts in a capture that ends at an eager
    op, which runs, and a new capture goes on to the call's end. At replay the segments
    replay in order (graph, eager op, graph): the call's time is all of them (8 ms, not
    the last segment's 2), every replay counted and, with the device two steps behind,
    at least 90% timed."""
    clock = cuda_events.clock(sim)
    record = RowsByPhase()
    stream = sim.Stream()
    segments: list = []

    def forward():  # 3 ms in graph 1, a 3 ms eager break, 2 ms in graph 2
        sim.launch(3.0)
        segments[-1].capture_end()
        sim.launch(3.0)
        g2 = sim.CUDAGraph()
        g2.capture_begin()
        segments.append(g2)
        sim.launch(2.0)

    with phases.warmup("capture"), sim.stream(stream):
        g1 = sim.CUDAGraph()
        g1.capture_begin()
        segments.append(g1)
        clock.time_call(forward, (), None, record, 8)
        segments[-1].capture_end()
    for _ in range(100):
        g1.replay()
        sim.launch(3.0)  # the eager segment
        segments[1].replay()
        sim.step()
    sim.drain()
    clock.collect(final=True)
    row = record.rows[(phases.SERVING, 8)]
    assert row.count == 100 and row.samples_taken >= 90
    assert set(row.samples()) == {8_000_000}
    assert sim.violations == []


def test_start_under_capture_records_nothing_and_reads_stay_legal(sim):
    """The whole-forward and drafter clocks call ``start``/``stop`` themselves: under a
    capture (a drafter pass captured while serving) nothing is recorded or counted; the
    next eager calls read their pairs without ever querying an event recorded in a
    capture."""
    clock = cuda_events.clock(sim)
    row = SizeStats((1,), 1)
    g = sim.CUDAGraph()
    with sim.graph(g):
        assert clock.start(row) is None  # (callers: a call that counts nothing)
        sim.launch(1.0)
    for _ in range(3):
        token = clock.start(row)
        sim.launch(1.0)
        clock.stop(token)
        sim.step()
    sim.drain()
    clock.collect()
    assert (row.count, row.samples_taken) == (3, 3) and sim.violations == []


def test_an_unreadable_pair_loses_its_sample_not_the_call(sim, monkeypatch):
    """A pair whose ``query()`` raises (an event CUDA cannot read) loses its sample and
    leaves the pool; the next pairs are read on."""
    clock = cuda_events.clock(sim)
    row = SizeStats((1,), 1)
    clock.time_call(lambda: sim.launch(1.0), (), row)
    bad = clock.queue.pending[0].end

    def refuse():
        raise RuntimeError("CUDA error: operation not supported")

    monkeypatch.setattr(bad, "query", refuse)
    for _ in range(2):
        clock.time_call(lambda: sim.launch(1.0), (), row)
    sim.drain()
    clock.collect()
    assert (row.count, row.samples_taken, row.lost) == (3, 2, 1)
    assert all(bad is not t.end for t in clock.queue.pools.get(0, []))


def test_a_starved_devices_rows_say_the_host_paced_them(sim):
    """A call whose launches the host spreads out (1 ms of host time per 0.1 ms kernel)
    on a device with nothing queued: its time is the host's, and the row says host-bound;
    the same call on a device with its queue full (two steps behind, 5 ms kernels) says
    device-bound."""
    from fxflops.report.figures import row_figures

    def call(host_ms, kernel_ms):
        for _ in range(4):
            sim.host(host_ms)
            sim.launch(kernel_ms)

    clock = cuda_events.clock(sim)
    sim.lag = 0
    starved = SizeStats((1,), 1)
    for _ in range(10):
        clock.time_call(lambda: call(1.0, 0.1), (), starved)
        sim.host(0.5)
    clock.collect()
    assert starved.samples_taken == 10
    assert starved.percentiles()["median_ms"] == pytest.approx(4.0, abs=0.11)
    sim.lag = 2
    busy = SizeStats((1,), 1)
    for _ in range(10):
        clock.time_call(lambda: call(0.01, 5.0), (), busy)
        sim.step()
    sim.drain()
    clock.collect()
    assert busy.samples_taken == 10 and busy.percentiles()["median_ms"] == pytest.approx(20.0)
    figures = [row_figures(r, {}) for r in (starved, busy)]
    assert [f["time_bound"] for f in figures] == ["host", "device"]
    assert [f["host_bound_calls"] for f in figures] == [10, 0]


def test_micro_batches_sharing_the_stream_say_their_time_is_shared(sim):
    """vLLM's eager micro-batches: two threads take turns on one compute stream, each
    call open while the other's kernels run (a yield inside it): both rows say their
    samples are shared; a whole forward's bracket around one thread's call is not."""
    from fxflops.report.figures import row_figures

    clock = cuda_events.clock(sim)
    rows = [SizeStats((2,), 2), SizeStats((2,), 2)]
    turn = [threading.Event(), threading.Event()]

    def micro_batch(i):
        for _ in range(3):
            turn[i].wait(5)
            turn[i].clear()
            token = clock._start(rows[i], 0)  # (a graph call's pair, as time_call's)
            sim.launch(1.0)
            turn[1 - i].set()  # yield mid-call: the other runs its kernels now
            turn[i].wait(5)
            turn[i].clear()
            sim.launch(1.0)
            clock.stop(token)
            turn[1 - i].set()

    threads = [threading.Thread(target=micro_batch, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    turn[0].set()
    for t in threads:
        t.join(10)
    alone, inner = SizeStats((2,), 2), SizeStats((2,), 2)
    outer = clock.start(alone)  # a whole forward's bracket
    clock.time_call(lambda: sim.launch(1.0), (), inner)
    clock.stop(outer)
    sim.drain()
    clock.collect()
    assert [r.count for r in rows] == [3, 3]
    assert [row_figures(r, {})["shared_calls"] for r in rows] == [3, 3]
    assert [row_figures(r, {})["shared_calls"] for r in (alone, inner)] == [0, 0]


def test_profiling_on_a_gpu_waits_before_and_after_in_the_allowed_region(monkeypatch):
    """Per-kernel profiling on a GPU: the device is waited for before the profiler starts
    (kernels still queued from earlier calls share this call's names) and after the call,
    each sync made in ``sync_allowed`` (vLLM's ``gpu_sync_allowed`` under
    ``VLLM_GPU_SYNC_CHECK``). A refused sync (outside it: vLLM raises) never reaches the
    model: the call runs and returns, unprofiled."""
    import contextlib

    from fxflops.recording import kernel_profile

    events: list = []
    allowed: list = []

    def synchronize(device=None):
        events.append(("sync", bool(allowed)))
        if not allowed:
            raise RuntimeError("GPU<->CPU sync detected - avoid it or wrap with "
                               "gpu_sync_allowed()")

    def call():
        events.append("call")
        return 7

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    row = SizeStats((1,), 1)
    assert kernel_profile.profile(call, row, [], "cuda") == (7, False)
    assert events == [("sync", False), "call"]

    @contextlib.contextmanager
    def allow():
        allowed.append(1)
        try:
            yield
        finally:
            allowed.pop()

    monkeypatch.setattr(kernel_profile, "sync_allowed", allow)
    events.clear()
    out, _ = kernel_profile.profile(call, row, [], "cuda")
    assert out == 7 and events == [("sync", True), "call", ("sync", True)]


def test_a_full_graphs_unread_replays_are_lost_not_dropped(sim):
    """A graph holding two calls, its replays counted at one collection, then freed (or
    its last replay's phase over) before its pairs were read: those replays are counted
    lost at the next collection, so timed + lost = calls still."""
    import gc

    clock = cuda_events.clock(sim)
    records = [RowsByPhase(), RowsByPhase()]
    g = captured_pieces(sim, clock, records, size=4)
    with phases.warmup("warmup"):
        for _ in range(2):
            g.replay()
    for _ in range(3):  # the warm-up's last replay is now unread, in another phase
        g.replay()
    clock.collect()
    del g
    gc.collect()
    clock.collect()
    for record in records:
        for phase, n in (("warmup", 2), (phases.SERVING, 3)):
            row = record.rows[(phase, 4)]
            assert row.count == n and row.samples_taken + row.lost == n, (phase, row.lost)
    assert clock.tracker.several == []


def test_a_call_that_raises_leaves_no_pair_open(sim):
    """An eager call that raises is not counted (as on the CPU clock), and leaves nothing
    open that would mark another thread's calls as shared."""
    clock = cuda_events.clock(sim)
    row = SizeStats((1,), 1)

    def boom():
        raise ValueError("the model's own error")

    for _ in range(3):
        with pytest.raises(ValueError):
            clock.time_call(boom, (), row)
    assert clock.open == [] and row.count == 0
    other = SizeStats((1,), 1)
    t = threading.Thread(target=clock.time_call, args=(lambda: sim.launch(1.0), (), other))
    t.start()
    t.join()
    sim.drain()
    clock.collect()
    assert (other.count, other.samples_taken, other.shared) == (1, 1, 0)


def test_a_replay_whose_end_is_never_recorded_blocks_no_later_pair(sim, monkeypatch):
    """A piecewise replay interrupted after its pair was queued (here its end's record
    raises, as a signal's exception would): the pair is read as lost, the later ones are
    read on."""
    clock = cuda_events.clock(sim)
    record = RowsByPhase()
    g = captured_pieces(sim, clock, [record], size=2)
    g.replay()
    real_take = clock.queue.take

    def take(device):  # the next pair's end refuses its record, once
        token = real_take(device)
        real = token.end.record

        def interrupted(*args):
            token.end.record = real
            raise KeyboardInterrupt

        token.end.record = interrupted
        return token

    monkeypatch.setattr(clock.queue, "take", take)
    with pytest.raises(KeyboardInterrupt):
        g.replay()
    monkeypatch.setattr(clock.queue, "take", real_take)
    for _ in range(3):
        g.replay()
    sim.drain()
    clock.collect()
    row = record.rows[(phases.SERVING, 2)]
    assert row.count == 5 and row.samples_taken + row.lost == 5 and row.lost == 1
    assert len(clock.queue.pending) == 0


def test_a_graph_compiled_inside_a_warmup_phase_records_there_then_serves():
    """A graph first compiled inside a warm-up phase (vLLM compiles in its profile run):
    its calls there are the phase's, the ones after it traffic, nothing switched; a new
    size first seen in the phase has a row in each."""
    with phases.warmup("profile"):
        compiled = torch.compile(lambda x: x * 2, backend=fxflops.backend(inner="eager"),
                                 dynamic=True)
        for n in (3, 3, 5):
            compiled(torch.randn(n))
        for _ in range(1000):  # sampled as traffic is: past its first calls, one in 256
            compiled(torch.ones(6))
    for n in (3, 4):
        compiled(torch.randn(n))
    (record,) = fxflops.recorder().graphs
    warm = {r.size: r for r in record.warmup["profile"].values()}
    assert {size: r.count for size, r in warm.items()} == {3: 2, 5: 1, 6: 1000}
    assert 0 < warm[6].timed < 1000 - 256
    assert {r.size: r.count for r in record.rows.values()} == {3: 1, 4: 1}
    assert sum(r["calls"] for r in fxflops.recorder().stats()) == 2  # traffic's only


@pytest.mark.parametrize("held", [1, 3])
def test_replays_after_a_reset_count_in_the_new_rows(sim, monkeypatch, held):
    """``fxflops.recorder().reset()`` forgets every row: a CUDA graph captured before it
    (one call: a piecewise graph, whose served replays take the fast path; three: a FULL
    graph, counted at collections) counts its replays after it in the rows made from then
    on, and none of those before."""
    graph = captured_linears(monkeypatch, sim, held)
    rec = fxflops.recorder()
    with torch.no_grad():
        for _ in range(10):
            graph.replay()
            sim.step()
        with phases.warmup("warmup"):  # the last replays before the reset: a warm-up's
            for _ in range(3):
                graph.replay()
                sim.step()
        rec.reset()
        for _ in range(7):
            graph.replay()
            sim.step()
        sim.drain()
        cuda_events.collect_all(final=True)  # the last replay's pairs too
    rows = rec.stats()
    assert len(rows) == held and all(r["calls"] == 7 for r in rows), rows
    assert all(r["timed_calls"] + r["lost_samples"] == r["chosen_calls"] > 0 for r in rows)
    # nothing of before the reset came back: no warm-up row made by a late read
    assert all(not record.warmup.get("warmup") for record in rec.graphs)
    assert sim.violations == []


def test_a_reset_during_a_replays_row_lookup_leaves_no_forgotten_row_in_use(sim, monkeypatch):
    """A reset that lands while a piecewise graph's first served replay looks its row up
    (another thread's ``fxflops.recorder().reset()``): the row that replay found is one the
    recorder forgot, and the graph does not keep it for its next replays, which count in
    the rows made after the reset."""
    graph = captured_linears(monkeypatch, sim, 1)
    rec = fxflops.recorder()
    with torch.no_grad():
        (record,) = rec.graphs
        real = type(record).row_in
        found = []

        def row_in_then_reset(self, phase, key):
            row = real(self, phase, key)
            if phase == phases.SERVING and not found:
                found.append(row)
                rec.reset()  # after the lookup, before the replay keeps what it found
            return row

        monkeypatch.setattr(type(record), "row_in", row_in_then_reset)
        for _ in range(8):
            graph.replay()
            sim.step()
        sim.drain()
    (row,) = rec.stats()
    assert found and row["calls"] == 7  # the 7 after the one that straddled the reset
    # the forgotten row holds the call before the capture and that replay, no more
    assert found[0].count == 2
    assert sim.violations == []
