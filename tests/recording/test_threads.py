"""Calls from several threads at one size: every one counted, on every path.

A threaded server, or a data loader that calls a model, calls one compiled graph from
several threads at once; the inner call releases the GIL while it runs, so that a count
read before the call and stored after it loses the calls of the other threads (a
free-threaded Python has no GIL at all). Here N threads x M calls, at one size and at mixed
sizes, through ``torch.compile`` with both inner backends, gradients on and off, on the CPU
clock; on the CUDA-event clock (the simulator); and the whole-forward rows of vLLM's runner
hooks: the calls counted equal the calls made, and the FLOPs totals equal the cost per call
times the calls.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fxflops
from fxflops.recording import cuda_events
from fxflops.recording.size_stats import RuntimeCounts, SizeStats
from tests.cuda_sim import CudaSim
from tests.helpers import compile_on_sim, on_device

THREADS, CALLS = 4, 300
SIZES = {"one size": (8,), "mixed sizes": (3, 8, 13)}


def hammer(call: Callable[[int], Any], sizes: tuple[int, ...]) -> collections.Counter:
    """``THREADS`` threads, each making ``CALLS`` calls ``call(size)``, the sizes in turn
    (thread ``i`` starting at its ``i``-th); all start together. Returns the calls made
    per size."""
    start = threading.Barrier(THREADS)
    made: list[collections.Counter] = [collections.Counter() for _ in range(THREADS)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            start.wait()
            for j in range(CALLS):
                size = sizes[(i + j) % len(sizes)]
                call(size)
                made[i][size] += 1
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return sum(made, collections.Counter())


def counted(graph: Any) -> dict[Any, SizeStats]:
    return {row.size: row for row in graph.rows.values()}


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_graph_calls_from_threads_all_count(inner, grad, sizes):
    """Through torch.compile, one dynamic graph: the rows' counts are the calls made, each
    size's, the size's first calls (each timed) and the sampled ones among them; the FLOPs
    totals are the cost at the size times the calls."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 64))
    compiled = torch.compile(model, backend=fxflops.backend(inner=inner), dynamic=True)
    inputs = {s: torch.randn(s, 64) for s in SIZES[sizes]}
    context = torch.enable_grad if grad else torch.no_grad

    def call(size: int) -> None:
        with context():  # (thread-local: each thread sets its own)
            compiled(inputs[size])

    for size in inputs:  # compiled once, before the threads
        call(size)
    made = hammer(call, SIZES[sizes]) + collections.Counter(list(inputs))
    graphs = [g for g in fxflops.recorder().graphs if g.meta.get("phase") != "backward"]
    (graph,) = graphs
    rows = counted(graph)
    assert {s: r.count for s, r in rows.items()} == dict(made)
    for size, row in rows.items():
        flops, matmul, _, calls = row.totals()
        assert calls == made[size]
        assert flops == row.cost.flops * made[size] > 0
        assert matmul == 2 * size * (64 * 128 + 128 * 64) * made[size]
        assert 0 < row.samples_taken <= row.count


def test_a_free_threaded_pythons_counter_counts_every_call_too(monkeypatch):
    """On a free-threaded Python rows number their calls with ``LockedCount`` (no GIL makes
    a range iterator's C call atomic there): which counter this Python chose, and that the
    locked one, put in its place here, counts every call of threads at one size, as the
    range iterator does, each read through its length hint (``taken``), and each numbering
    the calls 0, 1, 2, ... (the numbers sampling compares)."""
    import sys

    from fxflops.recording import size_stats

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    assert size_stats.CallCounter is (size_stats.range_counter if gil
                                      else size_stats.LockedCount)
    for counter in (size_stats.range_counter(), size_stats.LockedCount()):
        assert size_stats.taken(counter) == 0
        assert [next(counter) for _ in range(3)] == [0, 1, 2]
        assert size_stats.taken(counter) == 3
        made = hammer(lambda size, c=counter: next(c), (8,))
        assert size_stats.taken(counter) == made[8] + 3 == THREADS * CALLS + 3
    monkeypatch.setattr(size_stats, "CallCounter", size_stats.LockedCount)
    compiled = torch.compile(torch.nn.Linear(16, 16), backend=fxflops.backend(inner="eager"),
                             dynamic=True)
    x = torch.randn(8, 16)
    compiled(x)
    made = hammer(lambda size: compiled(x), (8,))
    ((_, row),) = counted(fxflops.recorder().graphs[0]).items()
    assert isinstance(row.calls, size_stats.LockedCount)
    assert row.count == made[8] + 1 == THREADS * CALLS + 1
    assert row.totals()[1] == 2 * 8 * 16 * 16 * row.count  # matmul FLOPs, by hand


@pytest.fixture
def sim():
    simulator = CudaSim(lag=2, devices=1)
    yield simulator
    cuda_events._CLOCKS.pop(simulator.CUDAGraph, None)


@pytest.mark.parametrize("sizes", list(SIZES))
def test_cuda_event_calls_from_threads_all_count(sim, monkeypatch, sizes):
    """A graph timed by CUDA events (the simulator): every call counted when made, and
    each timed when its events are read, none lost."""
    compile_on_sim(monkeypatch, sim)
    compiled = torch.compile(lambda x: torch.relu(x @ x.T),
                             backend=fxflops.backend(inner=on_device(sim, 0.01)))
    inputs = {s: torch.randn(s, 16) for s in SIZES[sizes]}
    for x in inputs.values():
        torch._dynamo.mark_dynamic(x, 0)  # one graph, a row per number of rows
        compiled(x)
    made = hammer(lambda size: compiled(inputs[size]), SIZES[sizes])
    made += collections.Counter(list(inputs))
    sim.drain()
    cuda_events.collect_all(wait_s=5.0)
    (graph,) = fxflops.recorder().graphs
    rows = counted(graph)
    assert {s: r.count for s, r in rows.items()} == dict(made)
    for size, row in rows.items():
        assert row.samples_taken + row.lost == row.count and row.awaiting == 0
        assert row.totals()[0] == row.cost.flops * made[size]


@pytest.mark.parametrize("clock", ["cpu", "cuda"])
def test_whole_forward_rows_from_threads_all_count(sim, clock):
    """vLLM's whole-forward rows (``<forward>``), timed by the model runner's clock (the
    CPU's, or CUDA events on a GPU), from several threads at one size (micro-batch
    threads): each forward counted, its run-time FLOPs charged once per forward."""
    from fxflops.integrations.vllm import forward
    from fxflops.recording.runtime_costs import charge_runtime, coster

    class Runner:
        device = torch.device(clock)

    runner = Runner()
    if clock == "cuda":
        runner._fxflops_timer = cuda_events.CudaEventClock(sim)
    attention = coster("attention")
    attention.counts = lambda window: (10, 4)  # pairs and context tokens a forward reads
    attention.window_of = lambda layer: None
    attention.bytes_of = lambda layer: None

    def step(size: int) -> None:
        row = fxflops.recorder().forward_row(size)
        if row.runtime is None:
            row.runtime = RuntimeCounts([("attention", "layer", 3, 5)])
        charge_runtime(row)
        token = forward.clock_of(runner).start(row)
        if clock == "cuda":
            sim.launch(0.01)
        forward.clock_of(runner).stop(token)

    made = hammer(step, (8,))
    sim.drain()
    cuda_events.collect_all(wait_s=5.0)
    (row,) = fxflops.recorder().forwards_snapshot()
    assert row.count == made[8] == THREADS * CALLS
    assert row.runtime.calls == made[8]
    assert (row.runtime.flops, row.runtime.bytes) == (3 * 10 * made[8], 5 * 4 * made[8])
    assert row.samples_taken + row.lost == row.count
