"""Time the instrumentation adds per call, and memory after many calls; one run, ratios.

    python benchmarks/overhead.py [--calls 1000000] [--sizes 50]

The same tiny compiled callable (eager inner, so the call itself is cheap and the overhead
shows) is timed bare and instrumented, best of 5 rounds each; then fxflops' bookkeeping
alone, around a callable that does nothing.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import torch

import fxflops


def per_call_ns(fn, args, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--sizes", type=int, default=50)
    args = p.parse_args()
    captured = {}

    def capture(gm, example_inputs):
        captured["ours"] = fxflops.backend(inner="eager")(gm, example_inputs)
        captured["bare"] = captured["ours"].inner  # the very callable fxflops wraps
        captured["arity"] = [type(e).__name__ for e in example_inputs]
        return captured["ours"]

    x = torch.randn(8, 4)
    torch.compile(lambda t: t + 1, backend=capture, dynamic=True)(x)
    def graph_args_for(t):  # the graph takes its size symbols, then the tensor
        return [t if kind == "Tensor" else t.shape[i] for i, kind in
                enumerate(captured["arity"])]

    graph_args = graph_args_for(x)
    bare, ours = captured["bare"], captured["ours"]
    bare(*graph_args), ours(*graph_args)
    rounds, n = 5, 20_000
    b = min(per_call_ns(bare, graph_args, n) for _ in range(rounds))
    o = min(per_call_ns(ours, graph_args, n) for _ in range(rounds))
    print(f"bare compiled call:         {b / 1e3:.2f} us")
    print(f"instrumented compiled call: {o / 1e3:.2f} us  (ratio {o / b:.2f}, "
          f"+{(o - b) / 1e3:.2f} us)")
    # fxflops' own bookkeeping, isolated: the same record around a callable doing nothing
    from fxflops.backends import InstrumentedGraph

    def noop(*a):
        return None

    wrapped = InstrumentedGraph(noop, ours.record)
    nb = min(per_call_ns(noop, graph_args, 200_000) for _ in range(rounds))
    no = min(per_call_ns(wrapped, graph_args, 200_000) for _ in range(rounds))
    print(f"bookkeeping alone (no-op inner): {(no - nb) / 1e3:.2f} us per call "
          f"(goal: under 2 us)")

    inputs = [graph_args_for(torch.randn(s, 4)) for s in range(2, 2 + args.sizes)]
    tracemalloc.start()
    for i in range(1_000):
        ours(*inputs[i % args.sizes])
    after_1k = tracemalloc.get_traced_memory()[0]
    for i in range(args.calls - 1_000):
        ours(*inputs[i % args.sizes])
    after_all = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"memory after 1,000 calls:   {after_1k / 1024:.1f} KiB")
    print(f"memory after {args.calls:,} calls: {after_all / 1024:.1f} KiB over {args.sizes} sizes "
          f"(ratio {after_all / after_1k:.2f}; bounded by the {args.sizes} x window ring buffers)")


if __name__ == "__main__":
    main()
