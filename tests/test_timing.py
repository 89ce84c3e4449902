"""The CUDA-event timer's logic, on fake events: this machine has no GPU, so a fake CUDA
module stands in for ``torch.cuda`` (the timer takes one). The real thing is checked by
scripts/gpu_check.py on a GPU and by the GPU-only test at the end.

What is checked: a call is counted when it is made and timed when its events are read;
nothing waits for the device on the calling thread; more than ``max_in_flight`` calls in
flight lose samples, never calls; a flush waits for what is still in flight; CUDA-graph
replays are counted per replay and timed before the next one or at a flush.
"""

from __future__ import annotations

import pytest
import torch

import fxflops
from fxflops.instrument import plan, wrap
from fxflops.recording.cuda_events import _REGISTRIES, CaptureRegistry, CudaEventTimer, harvest_all
from fxflops.recording.size_stats import SizeStats
from fxflops.report.files import load_reports


class FakeEvent:
    """A CUDA event whose work finishes only when the test says so (``done``) or when
    someone waits for it (``synchronize``)."""

    clock = 0.0

    def __init__(self, enable_timing=True, external=False):
        self.t = None
        self.done = False
        self.external = external
        self.waited = 0

    def record(self, stream=None):
        FakeEvent.clock += 1.0
        self.t = FakeEvent.clock
        self.done = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited += 1
        self.done = True

    def elapsed_time(self, end):
        return end.t - self.t  # ms


class FakeGraph:
    def capture_begin(self, *a, **k):
        pass

    def replay(self):
        pass


class FakeCuda:
    Event = FakeEvent
    CUDAGraph = FakeGraph

    def __init__(self):
        self.capturing = False

    def is_current_stream_capturing(self):
        return self.capturing


@pytest.fixture
def fake_cuda():
    cuda = FakeCuda()
    yield cuda
    _REGISTRIES.pop(FakeGraph, None)


def test_a_call_is_counted_when_made_and_timed_when_read(fake_cuda):
    timer = CudaEventTimer(max_in_flight=8, cuda=fake_cuda)
    row = SizeStats((1,), 1)
    for _ in range(3):
        timer.time_call(lambda: None, (), row)
    # counted at once; no sample yet (nothing finished), nothing waited for
    assert (row.count, row.samples_taken, row.awaiting) == (3, 0, 3)
    assert all(e.waited == 0 for s, e, _ in timer.pending)
    timer.pending[0][1].done = True
    timer.pending[1][1].done = True
    assert timer.harvest() == 2
    assert (row.count, row.samples_taken, row.awaiting) == (3, 2, 1)
    assert list(row.samples()) == [1_000_000, 1_000_000]  # 1 ms between the records
    assert len(timer.pool) == 2  # the read pairs go back to the pool...
    timer.time_call(lambda: None, (), row)
    assert len(timer.pool) == 1  # ...and are reused before a new pair is made
    assert row.count == 4


def test_past_the_in_flight_cap_samples_are_lost_never_calls(fake_cuda):
    timer = CudaEventTimer(max_in_flight=4, cuda=fake_cuda)
    row = SizeStats((1,), 1)
    for _ in range(10):  # nothing finishes: the oldest pairs are given up, never waited for
        timer.time_call(lambda: None, (), row)
    assert row.count == 10 and len(timer.pending) == 4
    assert row.lost == 6 and timer.dropped == 6
    # a flush waits for the 4 still in flight (on its own thread in real use)
    assert timer.harvest(wait=True) == 4
    assert row.count == 10 and row.samples_taken == 4 and row.lost == 6 and row.awaiting == 0


def compile_on_fake_gpu(monkeypatch, fake_cuda) -> None:
    """Graphs compiled from now on are planned for "cuda" and timed by CUDA events of the
    fake CUDA module (no GPU here)."""
    monkeypatch.setattr(wrap, "make_timer",
                        lambda device: CudaEventTimer(max_in_flight=256, cuda=fake_cuda))
    real_plan = wrap.plan

    def on_gpu(*args, **kwargs):
        graph_plan = real_plan(*args, **kwargs)
        graph_plan.device = "cuda"
        return graph_plan

    monkeypatch.setattr(wrap, "plan", on_gpu)
    monkeypatch.setattr(plan, "device_name", lambda device: "NVIDIA H200")


def test_calls_in_the_report_equal_calls_made_after_a_flush(fake_cuda, monkeypatch, tmp_path):
    """Through torch.compile: a graph on a (fake) GPU, N calls, the last ones still in
    flight when the report is written: the report says N calls and N samples."""
    compile_on_fake_gpu(monkeypatch, fake_cuda)
    compiled = torch.compile(torch.nn.Linear(8, 8), backend=fxflops.backend(inner="eager"))
    x = torch.randn(4, 8)
    n = 300  # past the 256 pairs in flight: 44 samples given up, every call counted
    with torch.no_grad():
        for _ in range(n):
            compiled(x)
    path = fxflops.recorder().save(tmp_path / "r.json")
    (graph,) = fxflops.load_report(path)["graphs"]
    (row,) = graph["rows"]
    assert row["calls"] == n
    assert row["lost_samples"] == n - 256 and row["timed_calls"] == 0
    # a flush (the background thread's, or at exit) waits for what is in flight
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    fxflops.recorder().flush()
    (report,) = load_reports([tmp_path / "out"])
    (row,) = report["graphs"][0]["rows"]
    assert row["calls"] == n and row["timed_calls"] == 256 and row["lost_samples"] == n - 256
    assert row["median_ms"] == 1.0


def test_replays_of_a_captured_graph_are_in_the_report_after_a_flush(fake_cuda, monkeypatch,
                                                                     tmp_path):
    """Through torch.compile: a (fake) CUDA-graph capture of the compiled call, then N
    replays, the last one read by the report's flush: the report says N calls, N timed."""
    compile_on_fake_gpu(monkeypatch, fake_cuda)
    compiled = torch.compile(torch.nn.Linear(8, 8), backend=fxflops.backend(inner="eager"))
    x = torch.randn(4, 8)
    registry = CaptureRegistry(fake_cuda)
    graph = FakeGraph()
    with torch.no_grad():
        compiled(x)  # compiled (and run once) before the capture, as vLLM warms up
        graph.capture_begin()
        fake_cuda.capturing = True
        compiled(x)  # captured: runs at each replay
        fake_cuda.capturing = False
    ((start, end, _),) = registry.by_graph[graph]
    n = 5
    for _ in range(n):
        graph.replay()
        start.record()  # the device runs the replay's kernels between the two events
        end.record()
        end.done = True
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path / "out"))
    fxflops.recorder().flush()
    (report,) = load_reports([tmp_path / "out"])
    (row,) = report["graphs"][0]["rows"]
    assert row["calls"] == n + 1 and row["timed_calls"] == n + 1 and row["lost_samples"] == 0
    assert registry.missed == 0


def test_late_completion_is_credited_at_the_next_read(fake_cuda):
    timer = CudaEventTimer(cuda=fake_cuda)
    row = SizeStats((1,), 1)
    timer.time_call(lambda: None, (), row)
    assert harvest_all() == 0 and row.samples_taken == 0  # still running: left in flight
    timer.pending[0][1].done = True  # the device finishes later
    assert harvest_all() == 1 and row.samples_taken == 1 and row.count == 1


def test_capture_then_replays_counted_per_replay_and_timed(fake_cuda):
    registry = CaptureRegistry(fake_cuda)
    graph = FakeGraph()
    row = SizeStats((8,), 8)
    graph.capture_begin()
    fake_cuda.capturing = True
    timer = CudaEventTimer(cuda=fake_cuda)
    assert timer.time_call(lambda: "captured", (), row) == "captured"
    fake_cuda.capturing = False
    assert row.count == 0  # the capture ran nothing
    ((start, end, _),) = registry.by_graph[graph]
    assert start.external and end.external
    for i in range(3):
        graph.replay()  # counted now; the previous replay's pair read first
        assert row.count == i + 1 and row.samples_taken == i
        start.record()
        end.record()
        end.done = True
    registry.flush()  # the last replay, read at a flush
    assert row.count == 3 and row.samples_taken == 3 and row.lost == 0
    registry.flush()  # read once only
    assert row.samples_taken == 3


def test_a_replay_still_running_when_the_next_starts_is_lost_not_miscounted(fake_cuda):
    registry = CaptureRegistry(fake_cuda)
    graph = FakeGraph()
    row = SizeStats((8,), 8)
    graph.capture_begin()
    fake_cuda.capturing = True
    CudaEventTimer(cuda=fake_cuda).time_call(lambda: None, (), row)
    fake_cuda.capturing = False
    graph.replay()
    registry.flush()  # not finished: a flush leaves it for later
    assert row.samples_taken == 0 and row.lost == 0
    graph.replay()  # the first replay's events are recorded again: its sample is lost
    assert row.count == 2 and row.lost == 1 and registry.missed == 1
    registry.flush(wait=True)  # at exit: wait for the last one
    assert row.samples_taken == 1 and row.count == row.samples_taken + row.lost


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_events_time_a_matmul():
    timer = CudaEventTimer()
    row = SizeStats((1,), 1)
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(5):
        timer.time_call(torch.mm, (a, a), row)
    assert row.count == 5
    timer.harvest(wait=True)
    assert row.samples_taken == 5 and len(row.samples()) == 5 and min(row.samples()) > 0
