"""Time the instrumentation adds per call, and memory after many calls; one run, ratios.

    python benchmarks/overhead.py [--calls 1000000] [--sizes 50] [--pairs 41]

Figures against their goals, each the median over ``--pairs`` paired, interleaved rounds in
this one process (bare then instrumented, so that both see the same machine state):
  1. what users pay, through ``torch.compile`` as they call it: a small function with one
     dynamic size, compiled with ``backend="fxflops"`` against ``backend="inductor"``, and
     with ``fxflops.backend(inner="eager")`` against ``backend="eager"`` (goal: at most
     1 us added per call, each);
  2. fxflops' bookkeeping alone: the instrumented wrapper around a callable that does
     nothing, minus that callable called bare (goal: at most 1 us).
Then memory after 1,000 and ``--calls`` calls over ``--sizes`` sizes (goal: flat).
Only public API is used: the same script measures an older tree (``PYTHONPATH=old``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import torch

import fxflops


def per_call_ns(fn, args, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / n


def paired(bare, ours, args, n: int, pairs: int) -> tuple[float, float, float]:
    """(bare ns, instrumented ns, median of the per-pair differences)."""
    per_call_ns(bare, args, n), per_call_ns(ours, args, n)  # warm both
    b, o, d = [], [], []
    for _ in range(pairs):
        tb = per_call_ns(bare, args, n)
        to = per_call_ns(ours, args, n)
        b.append(tb)
        o.append(to)
        d.append(to - tb)
    return statistics.median(b), statistics.median(o), statistics.median(d)


def compile_pair(fn, example, inner: str):
    captured = {}

    def capture(gm, example_inputs):
        captured["ours"] = fxflops.backend(inner=inner)(gm, example_inputs)
        captured["kinds"] = [type(e).__name__ for e in example_inputs]
        return captured["ours"]

    torch._dynamo.mark_dynamic(example, 0)
    torch.compile(fn, backend=capture)(example)
    ours = captured["ours"]

    def graph_args(t):  # the graph takes its size symbols, then the tensor
        return [t if kind == "Tensor" else t.shape[0] for kind in captured["kinds"]]

    return ours.inner, ours, graph_args


def through_torch_compile(pairs: int) -> None:
    """The same function twice (two code objects: Dynamo caches per code), one compiled
    bare and one with fxflops around the same inner backend; called as users call it."""
    bare_fn = lambda t: t * 2 + 1  # noqa: E731 (two code objects of the same function)
    ours_fn = lambda t: t * 2 + 1  # noqa: E731
    for inner, bare_backend, ours_backend in (
            ("inductor", "inductor", "fxflops"),
            ("eager", "eager", fxflops.backend(inner="eager"))):
        x = torch.randn(8, 4)
        torch._dynamo.mark_dynamic(x, 0)
        bare = torch.compile(bare_fn, backend=bare_backend)
        ours = torch.compile(ours_fn, backend=ours_backend)
        with torch.no_grad():
            bare(x), ours(x)
            b, o, d = paired(bare, ours, (x,), 5_000, pairs)
        print(f"through torch.compile, {inner} inner: bare {b / 1e3:.2f} us, with fxflops "
              f"{o / 1e3:.2f} us, +{d / 1e3:.2f} us (ratio {o / b:.3f})  goal: <= 1 us  "
              f"{'OK' if d <= 1000 else 'MISSED'}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--sizes", type=int, default=50)
    p.add_argument("--pairs", type=int, default=41)
    args = p.parse_args()

    # 1. what users pay
    through_torch_compile(args.pairs)

    x = torch.randn(8, 4)
    bare, ours, graph_args = compile_pair(lambda t: t * 2 + 1, x, "inductor")
    a = graph_args(x)
    bare(*a), ours(*a)

    # 2. the bookkeeping alone: the same record around a callable that does nothing
    from fxflops.instrument.wrap import InstrumentedGraph

    def noop(*a):
        return None

    wrapped = InstrumentedGraph(noop, ours.record, ours.plan)
    nb, no, nd = paired(noop, wrapped, a, 20_000, args.pairs)
    print(f"bookkeeping alone (no-op inner): {nd / 1e3:.2f} us per call "
          f"(bare {nb / 1e3:.2f} us, wrapped {no / 1e3:.2f} us)  goal: <= 1 us  "
          f"{'OK' if nd <= 1000 else 'MISSED'}")

    inputs = [graph_args(torch.randn(s, 4)) for s in range(2, 2 + args.sizes)]
    tracemalloc.start()
    for i in range(1_000):
        wrapped(*inputs[i % args.sizes])
    after_1k = tracemalloc.get_traced_memory()[0]
    for i in range(args.calls - 1_000):
        wrapped(*inputs[i % args.sizes])
    after_all = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"memory after 1,000 calls:   {after_1k / 1024:.1f} KiB")
    print(f"memory after {args.calls:,} calls: {after_all / 1024:.1f} KiB over {args.sizes} "
          f"sizes (ratio {after_all / after_1k:.2f}; bounded by the {args.sizes} x window "
          "ring buffers)")


if __name__ == "__main__":
    main()
