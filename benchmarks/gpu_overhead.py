"""The GPU path's host cost: what fxflops' own Python adds per call and per CUDA-graph
replay, with stand-in CUDA calls that cost (almost) nothing, so that only fxflops is
measured; against the CPU path's cost. One run, paired rounds, ratios.

    python benchmarks/gpu_overhead.py [--pairs 21]

1. Per call through ``torch.compile`` as users call it: a small function compiled with
   ``fxflops.backend(inner="eager")``, planned for a GPU (CUDA events from the stand-in
   runtime: an event pair from the pool, two records, the count, the pair queued; the
   reads of finished pairs as later calls start), against ``backend="eager"``; and the same
   on the CPU clock. The difference is fxflops' GPU bookkeeping per call.
2. Per replay of a captured CUDA graph: a graph holding one instrumented call (vLLM's
   piecewise graphs: an eager pair around the replay) and graphs holding 10 and 100 (a
   FULL graph: counted per phase, O(1) in the calls it holds), against the bare replay.
3. Per decode step of vLLM's piecewise mode: 60 pieces, each its own graph holding one
   instrumented call, replayed in turn (what a served step's host pays; goal: at most
   1 us per piece), against 60 graphs of a class fxflops never patched, rounds
   interleaved: at ``FXFLOPS_REPLAY_SAMPLE_EVERY``'s value (32 unless set: every replay
   counted, a sample timed) and at 1 (every replay timed). Then the CUDA calls fxflops
   adds per replay over 640 steps of 60 fresh pieces at N = 32, their first replays
   included (each costs the host a few microseconds of CUDA's own on a device:
   gpu_check's ``replay_host`` measures it).

``--instructions``: the third figure in instructions instead of time (this script under
``valgrind --tool=callgrind``, a dump before each ``os.getloadavg()`` separating the
loops): instructions per replay of a one-call graph, bare, instrumented at the sampling's
value and at 1, each loop run twice and the lower kept. Wall time of a few microseconds
drifts with the machine; the instructions do not.

No device is involved: on a GPU, the CUDA calls themselves (a few us each for a record or
query) come on top; scripts/gpu_check.py measures those on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch

import fxflops
from fxflops import config
from fxflops.instrument import registration, wrap
from fxflops.recording import cuda_events
from fxflops.recording.size_stats import SizeStats


class Event:
    """A CUDA event at no cost: recorded, done, 1 ms apart."""

    __slots__ = ()

    def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 1.0


class Graph:
    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass


class Bare:
    """A graph of a class fxflops never patched: what a replay costs without fxflops."""

    def replay(self) -> None:
        pass


@contextlib.contextmanager
def sampling(every: int | None) -> Iterator[None]:
    """Graphs captured inside sample one replay in ``every`` (None: the variable as set)."""
    name = config.REPLAY_SAMPLE_EVERY.name
    old = os.environ.get(name)
    if every is not None:
        os.environ[name] = str(every)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class StandInCuda:
    """The ``torch.cuda`` calls fxflops makes, each a no-op."""

    Event = Event
    CUDAGraph = Graph

    def __init__(self) -> None:
        self.capturing = False

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def current_device(self) -> int:
        return 0

    def current_stream(self) -> Any:
        return None

    def device(self, index: int) -> Any:
        import contextlib

        return contextlib.nullcontext()


class Record:
    """The part of a graph record a captured call needs: its one row."""

    runtime_kinds = ()

    def __init__(self) -> None:
        self.row = SizeStats((8,), 8)

    def row_in(self, phase: str, key: Any) -> SizeStats:
        return self.row


def captured(cuda: Any, clock: Any, held: int = 1) -> Any:
    """A graph of ``cuda``'s class holding ``held`` instrumented calls."""
    graph = cuda.CUDAGraph()
    cuda.capturing = True
    graph.capture_begin()
    for _ in range(held):
        clock.time_call(lambda: None, (), None, Record(), 8)
    graph.capture_end()
    cuda.capturing = False
    return graph


def per_call_ns(fn: Any, args: tuple[Any, ...], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / n


def paired(bare: Any, ours: Any, args: tuple[Any, ...], n: int, pairs: int
           ) -> tuple[float, float, float]:
    per_call_ns(bare, args, n), per_call_ns(ours, args, n)
    b, o, d = [], [], []
    for _ in range(pairs):
        tb, to = per_call_ns(bare, args, n), per_call_ns(ours, args, n)
        b.append(tb)
        o.append(to)
        d.append(to - tb)
    return statistics.median(b), statistics.median(o), statistics.median(d)


def per_call(cuda: StandInCuda, pairs: int) -> None:
    bare_fn = lambda t: t * 2 + 1  # noqa: E731 (separate code objects: Dynamo caches per code)
    cpu_fn = lambda t: t * 2 + 1  # noqa: E731
    gpu_fn = lambda t: t * 2 + 1  # noqa: E731
    x = torch.randn(8, 4)
    torch._dynamo.mark_dynamic(x, 0)
    bare = torch.compile(bare_fn, backend="eager")
    on_cpu = torch.compile(cpu_fn, backend=fxflops.backend(inner="eager"))
    real_plan, real_timer = wrap.plan, wrap.clock_for

    def planned_on_gpu(*args: Any, **kwargs: Any) -> Any:
        graph_plan = real_plan(*args, **kwargs)
        graph_plan.device = "cuda"
        return graph_plan

    wrap.plan = planned_on_gpu
    wrap.clock_for = lambda device: cuda_events.CudaEventClock(cuda)
    registration.device_name = lambda device: "stand-in GPU"
    try:
        on_gpu = torch.compile(gpu_fn, backend=fxflops.backend(inner="eager"))
        with torch.no_grad():
            bare(x), on_cpu(x), on_gpu(x)
            _, cpu_ns, cpu_d = paired(bare, on_cpu, (x,), 5_000, pairs)
            b, gpu_ns, gpu_d = paired(bare, on_gpu, (x,), 5_000, pairs)
    finally:
        wrap.plan, wrap.clock_for = real_plan, real_timer
    print(f"per call through torch.compile (eager inner, grad off): bare {b / 1e3:.2f} us; "
          f"CPU clock +{cpu_d / 1e3:.2f} us; GPU path (CUDA events, stand-in calls) "
          f"+{gpu_d / 1e3:.2f} us, {gpu_d / max(cpu_d, 1):.1f}x the CPU path's")


def per_replay(cuda: StandInCuda, pairs: int) -> None:
    clock = cuda_events.clock(cuda)

    def bare_replay() -> None:  # what an unpatched replay costs the host here: a call
        pass

    results = []
    for held in (1, 10, 100):
        graph = captured(cuda, clock, held)
        _, _, d = paired(bare_replay, graph.replay, (), 20_000, pairs)
        clock.collect()  # (counts the replays: what a flush does, off the hot path)
        results.append((held, d))
    print("per replay (host cost added): " + ", ".join(
        f"{held} call(s) held +{d / 1e3:.2f} us" for held, d in results))


class Counting(StandInCuda):
    """The stand-in runtime, counting the CUDA calls made through it."""

    calls = 0

    class Event(Event):
        __slots__ = ()

        def record(self, stream: Any = None) -> None:
            Counting.calls += 1

        def query(self) -> bool:
            Counting.calls += 1
            return True

        def elapsed_time(self, end: Any) -> float:
            Counting.calls += 1
            return 1.0

    class CUDAGraph:  # (a class of its own, no subclass: fxflops patches each one)
        def capture_begin(self, *args: Any, **kwargs: Any) -> None:
            pass

        def capture_end(self) -> None:
            pass

        def replay(self) -> None:
            pass


def per_step(pairs: int, pieces: int = 60, steps: int = 640) -> None:
    cuda = Counting()
    clock = cuda_events.clock(cuda)
    every = config.REPLAY_SAMPLE_EVERY.get()
    with sampling(None):
        sampled = [captured(cuda, clock) for _ in range(pieces)]
    with sampling(1):
        each = [captured(cuda, clock) for _ in range(pieces)]
    bare = [Bare() for _ in range(pieces)]

    def step(gs: list[Any]) -> None:
        for g in gs:
            g.replay()

    for gs in (bare, sampled, each):  # (warm: past every row's first replays)
        for _ in range(config.MIN_TIMED_FIRST + 1):
            step(gs)
    b, d, d1 = [], [], []
    for _ in range(pairs):
        tb = per_call_ns(step, (bare,), 2_000)
        ts = per_call_ns(step, (sampled,), 2_000)
        t1 = per_call_ns(step, (each,), 200)
        b.append(tb)
        d.append(ts - tb)
        d1.append(t1 - tb)
    clock.collect()
    added, added1 = statistics.median(d), statistics.median(d1)
    print(f"per decode step of {pieces} pieces: bare {statistics.median(b) / 1e3:.1f} us, "
          f"fxflops +{added / 1e3:.1f} us = +{added / pieces / 1e3:.2f} us per piece at "
          f"FXFLOPS_REPLAY_SAMPLE_EVERY={every} (goal: at most 1 us per piece); every replay "
          f"timed (=1): +{added1 / 1e3:.1f} us = +{added1 / pieces / 1e3:.2f} us per piece")
    # the CUDA calls, over a run's first steps too (each row's first replays all timed)
    calls = []
    for n in (32, 1):
        with sampling(n):
            fresh = [captured(cuda, clock) for _ in range(pieces)]
        Counting.calls = 0
        for _ in range(steps):
            step(fresh)
        clock.collect()
        calls.append(Counting.calls / (pieces * steps))
    print(f"CUDA calls added per replay at FXFLOPS_REPLAY_SAMPLE_EVERY=32, {pieces} pieces "
          f"over {steps} steps (their first replays included): {calls[0]:.3f} (every replay "
          f"timed, =1: {calls[1]:.3f})")


def measure_replays(replays: int) -> None:
    """(Under callgrind.) Loops of ``replays`` replays, bare and instrumented, in turn,
    each preceded by ``os.getloadavg()`` (the dump that separates them)."""
    import gc
    import os

    cuda = Counting()
    clock = cuda_events.clock(cuda)

    with sampling(None):
        ours = captured(cuda, clock)
    with sampling(1):
        each = captured(cuda, clock)
    bare = Bare()
    for g in (bare, ours, each):
        for _ in range(50):
            g.replay()
    gc.freeze()
    for _ in range(2):
        for g in (bare, ours, each):
            os.getloadavg()
            for _ in range(replays):
                g.replay()
    os.getloadavg()


def instructions(replays: int) -> int:
    import glob
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("gpu_overhead: valgrind is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        subprocess.run([valgrind, "--tool=callgrind", "--dump-before=os_getloadavg",
                        "--dump-instr=no", f"--callgrind-out-file={out}",
                        os.path.realpath(sys.executable), os.path.abspath(__file__),
                        "--measure-replays", str(replays)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=1800, env={**os.environ, "PYTHONHASHSEED": "0"})
        parts = sorted(glob.glob(out + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        counts = []
        for f in parts:
            for line in open(f):
                if line.startswith("summary:") or line.startswith("totals:"):
                    counts.append(int(line.split()[1]))
                    break
    loops = counts[1:7]  # (the first part: the import and the set-up)
    bare, ours, each = (min(loops[i], loops[i + 3]) / replays for i in range(3))
    every = config.REPLAY_SAMPLE_EVERY.get()
    print(f"instructions per replay of a one-call graph (callgrind, {replays:,} each): "
          f"bare {bare:,.0f}; fxflops at FXFLOPS_REPLAY_SAMPLE_EVERY={every} {ours:,.0f}, "
          f"added {ours - bare:,.0f} (goal: at most 4,000); every replay timed (=1) "
          f"{each:,.0f}, added {each - bare:,.0f}")
    return 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=21)
    p.add_argument("--instructions", action="store_true",
                   help="instructions per replay (callgrind) instead of time")
    p.add_argument("--measure-replays", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure_replays:
        measure_replays(args.measure_replays)
        return
    if args.instructions:
        raise SystemExit(instructions(2000))
    cuda = StandInCuda()
    per_call(cuda, args.pairs)
    per_replay(cuda, args.pairs)
    per_step(args.pairs)


if __name__ == "__main__":
    main()
