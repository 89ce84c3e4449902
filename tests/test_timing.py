"""The CUDA-event timer's logic, on fake events (this machine has no GPU; the real thing
is checked by scripts/gpu_check.py on a GPU and by the GPU-only test below)."""

from __future__ import annotations

import pytest
import torch

from fxflops.stats import SizeStats
from fxflops.timing import CaptureRegistry, CudaEventTimer


class FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing=True, external=False):
        self.t = None
        self.done = False
        self.external = external

    def record(self, stream=None):
        FakeEvent.clock += 1.0
        self.t = FakeEvent.clock
        self.done = False

    def query(self):
        return self.done

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


def test_no_sync_harvest_in_order_and_bounded():
    cuda = FakeCuda()
    timer = CudaEventTimer(max_in_flight=4, cuda=cuda)
    row = SizeStats((1,), 1)
    for _ in range(3):
        timer.time_call(lambda: None, (), row)
    assert row.count == 0 and len(timer.pending) == 3  # nothing read before it finished
    timer.pending[0][1].done = True
    timer.pending[1][1].done = True
    harvested = [p[:2] for p in list(timer.pending)[:2]]
    assert timer.harvest() == 2 and row.count == 2
    assert len(timer.pool) == 2
    assert row.window[0] == 1_000_000  # 1 ms between start and end records
    dropped = []
    for _ in range(10):  # nothing finishes: the oldest samples are dropped, never waited for
        if len(timer.pending) == timer.max_in_flight:
            dropped.append(timer.pending[0])
        timer.time_call(lambda: None, (), row)
    assert len(timer.pending) == 4 and timer.dropped == 7
    # the two harvested pairs were reused (popped from the pool) before new ones were made
    assert timer.pool == []
    reused = {id(e) for pair in harvested for e in pair}
    assert reused <= {id(e) for start, end, _ in timer.pending for e in (start, end)} | {
        id(e) for start, end, _ in dropped for e in (start, end)}


def test_pairs_recorded_in_capture_are_read_before_each_replay():
    cuda = FakeCuda()
    registry = CaptureRegistry(cuda)
    graph = FakeGraph()
    row = SizeStats((8,), 8)
    graph.capture_begin()
    cuda.capturing = True
    import fxflops.timing as timing

    timing._REGISTRIES[FakeGraph] = registry  # the timer below must use this registry
    timer = CudaEventTimer(cuda=cuda)
    timer.time_call(lambda: "captured", (), row)
    cuda.capturing = False
    ((start, end, _),) = registry.by_graph[graph]
    assert start.external and end.external
    for _ in range(3):
        graph.replay()  # the patched replay reads the previous replay's pair first
        start.record()
        end.record()
        end.done = True
    assert row.count == 2  # two replays read; the third is read at the next replay/flush
    registry.flush()
    assert row.count == 3
    del timing._REGISTRIES[FakeGraph]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_events_time_a_matmul():
    timer = CudaEventTimer()
    row = SizeStats((1,), 1)
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(5):
        timer.time_call(torch.mm, (a, a), row)
    torch.cuda.synchronize()
    timer.harvest()
    assert row.count == 5 and len(row.samples()) == 5 and min(row.samples()) > 0
