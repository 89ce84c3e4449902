"""Time the instrumentation adds per call, in every call style; memory after many calls.

    python benchmarks/overhead.py [--calls 1000000] [--sizes 50] [--iters 4608] [--rounds 5]
                                  [--model block|decoder]

1. **What users pay**, through ``torch.compile`` as they call it, in every call style:
   Inductor and eager inside; grad mode off and on (a module whose weights need grad:
   with grad on, Dynamo's graph needs a backward, and fxflops times AOTAutograd's forward
   graph); one size, and three sizes in turn. Five compiles of one layer per style (six
   variants: the first bare callable is timed twice), called in a shuffled order so that
   each sees the same machine state, and compiled afresh each round (``call_style`` says
   why):

   - ``bare``: ``torch.compile(m, backend=inner)``;
   - ``bare again``: the bare callable again, timed in blocks of its own (the A/A
     control: what this machine's noise and the order of the blocks make of one callable
     timed twice). Not a second compile of ``m``: Dynamo keeps one cache entry for equal
     backends, and a compile whose backend object is not the entry's own pays the
     backends' Python ``__eq__`` (``torch._TorchCompileWrapper``'s) twice on every call,
     about 1 us (docs/benchmarks.md);
   - ``bare 2``: a second bare compile, of ``m``'s twin (``Twin``: the same layer, a
     forward of its own code, so that Dynamo's entries for it are its own): what two
     compiles of one model differ by (context only: the figures are against ``bare``,
     the compile of the same code object as fxflops' own; the twin has read slower than
     it in every style, so a mean of the two would flatter fxflops);
   - ``floor``: a backend that does nothing but what fxflops' wrapper shape costs: it
     compiles the inner as fxflops does and returns a function that calls it (Dynamo's
     disable wrapper, one Python frame);
   - ``fxflops``: ``fxflops.backend(inner=...)``, as it runs past a size's first calls,
     each of which it times (a call counted, one in ``FXFLOPS_SAMPLE_EVERY``, 256, timed:
     the goal's column);
   - ``timed``: the same with ``FXFLOPS_SAMPLE_EVERY=1``, every call timed (what a size's
     first calls pay).

   ``--model decoder`` runs the same on the demo's decoder layer (attention and MLP, a
   few hundred microseconds a call): what a served graph is, and what a gain of a tenth
   of a microsecond has to show itself against (the A/A column).

   Calls go in blocks of ``BLOCK`` calls of one variant, each block timed as a whole: its
   mean per call, which holds the sampled calls' share of the cost as a user pays it; a
   round's figure is the median over its blocks per variant (a block an interrupt hit
   weighs no more than any other); the figures are the medians over ``--rounds`` rounds
   of the per-round differences. Goal: fxflops against bare at most 1 us; fxflops against
   the floor is fxflops' own bookkeeping.
2. fxflops' bookkeeping alone: its instrumented graph around a callable that does nothing,
   minus that callable called from a function of the same shape (goal: at most 1 us), in
   the steady state and with every call timed.
3. Memory after 1,000 and ``--calls`` calls over ``--sizes`` sizes (goal: flat).

Figures drift between machines and runs; what this machine (a shared 2-core VM) gave is
in docs/benchmarks.md, with instruction counts (callgrind) that do not drift.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import torch

import fxflops
from fxflops import config

GOAL_NS = 1000
# fxflops' stride (``FXFLOPS_SAMPLE_EVERY``, as set when this runs), and the calls of a
# size it times one by one before sampling
EVERY = config.SAMPLE_EVERY.get()
FIRST_TIMED = config.timed_first(EVERY)
# calls per size before measuring: past the calls every one of which fxflops times
WARM_CALLS = FIRST_TIMED + 36
VARIANTS = ("bare", "bare again", "bare 2", "floor", "fxflops", "timed")
# calls of one variant in a row, timed together: a call runs after calls of its own (as a
# served graph is called), not after another variant's, whose code and data it would find
# in the caches in its place. A multiple of the stride times each style's sizes (1 or
# 3): every block holds the same number of sampled calls, one per size in ``EVERY`` of its
# calls, and the calls after each that it slows. (The median of calls timed one by one
# leaves a sampled call's cost out, or counts it by the spread of the others: not what a
# user pays.)
BLOCK = 3 * EVERY


@contextlib.contextmanager
def sample_every(value: str | None) -> Iterator[None]:
    """``FXFLOPS_SAMPLE_EVERY`` set to ``value`` (None: left as it is) for the graphs made
    inside (it is read when a graph is made), then restored."""
    before = os.environ.get("FXFLOPS_SAMPLE_EVERY")
    if value is not None:
        os.environ["FXFLOPS_SAMPLE_EVERY"] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("FXFLOPS_SAMPLE_EVERY", None)
        else:
            os.environ["FXFLOPS_SAMPLE_EVERY"] = before


class Block(torch.nn.Module):
    """A small layer: a matmul and two element-wise ops (tens of microseconds a call)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 + 1


class Twin(torch.nn.Module):
    """``Block``'s twin for a second bare compile: the layer it is given and ``Block``'s
    forward, written again, so that its code object, and with it Dynamo's cache of
    compiled entries, is its own (a second compile of ``Block`` itself would share the
    first's entry, or pay the backend comparison: ``bare again`` in the module's
    docstring). A class of its own, not a subclass of ``Block``."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2 + 1


class Decoder(torch.nn.Module):
    """The demo's decoder layer (RMSNorm, grouped-query attention with rotary embeddings,
    a SwiGLU MLP; hidden 256) on ``(1, tokens, 256)``, its rotary tables made per call."""

    def __init__(self) -> None:
        super().__init__()
        from fxflops.cli.demo_model import DecoderLayer, DemoConfig

        self.cfg = DemoConfig()
        self.layer = DecoderLayer(self.cfg)
        d = self.cfg.head_dim
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(torch.arange(x.shape[1], dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.layer(x, emb.cos(), emb.sin())


class DecoderTwin(torch.nn.Module):
    """``Decoder``'s twin (see ``Twin``): its layer and buffer, its forward written again."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        self.layer = decoder.layer
        self.register_buffer("inv_freq", decoder.inv_freq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(torch.arange(x.shape[1], dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.layer(x, emb.cos(), emb.sin())


# name: (the module, its twin given it, an input of ``n`` rows or tokens)
MODELS: dict[str, tuple[Any, Any, Any]] = {
    "block": (Block, lambda block: Twin(block.linear), lambda n: torch.randn(n, 16)),
    "decoder": (Decoder, DecoderTwin, lambda n: torch.randn(1, n, 256)),
}
MODEL = "block"


def floor_backend(inner: str) -> Any:
    """Dynamo's floor for a wrapping backend: the inner compiled as fxflops compiles it,
    called through one plain function, nothing counted."""
    from fxflops import torch_compat
    from fxflops.instrument.backend import _eager_forward, resolve_inner
    from fxflops.instrument.wrap import _callable_of

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if inner == "inductor":
            compiled = torch_compat.get("compile_fx")(gm, example_inputs)
        else:
            compiled = _eager_forward(resolve_inner(inner)(gm, example_inputs))
        run = _callable_of(compiled, dynamo=True)

        def call(*args: Any) -> Any:
            return run(*args)

        return call

    return compile_graph


def compiled_variants(inner: str, grad: bool, inputs: list[torch.Tensor],
                      order: list[int]) -> list[Any]:
    """The variants of one style, compiled afresh (in ``order``) and warmed past a size's
    first calls; returned in ``VARIANTS`` order (``bare again`` is ``bare``)."""
    torch._dynamo.reset()
    backends = [inner, None, inner, floor_backend(inner),
                fxflops.backend(inner=inner), fxflops.backend(inner=inner)]
    fns: list[Any] = [None] * len(backends)
    # one layer for all: each compile's graph reads the same parameters, so no variant's
    # figure depends on where its own weights landed in memory
    block = MODELS[MODEL][0]()
    twin = MODELS[MODEL][1](block)
    with torch.set_grad_enabled(grad):
        for v in order:
            if backends[v] is None:  # ``bare again``: bare's callable
                continue
            module = twin if VARIANTS[v] == "bare 2" else block
            fns[v] = fn = torch.compile(module, backend=backends[v], dynamic=True)
            # the graph is made at the first call
            with sample_every("1" if VARIANTS[v] == "timed" else None):
                for _ in range(WARM_CALLS):
                    for x in inputs:
                        fn(x)
    fns[VARIANTS.index("bare again")] = fns[VARIANTS.index("bare")]
    return fns


def call_style(inner: str, grad: bool, sizes: int, iters: int, rounds: int
               ) -> dict[str, float]:
    """The variants of one style, called in turn, ``BLOCK`` calls at a time; the medians
    of the per-round differences against bare (ns) and the bare call's median.

    Each round compiles every variant afresh, in a rotated order: where one callable's
    code and data land in memory, or which variant was compiled first, then weighs on a
    single round, not on all of them, and the median over rounds damps it."""
    torch.manual_seed(0)
    inputs = [MODELS[MODEL][2](8 + 4 * i) for i in range(sizes)]
    now = time.perf_counter_ns
    diffs: dict[str, list[float]] = {"bare again": [], "bare 2": [], "floor": [],
                                     "fxflops": [], "fxflops - floor": [], "timed": [],
                                     "fxflops p50": []}
    bare_ms: list[float] = []
    n = len(VARIANTS)
    for r in range(rounds):
        fns = compiled_variants(inner, grad, inputs, [(r + v) % n for v in range(n)])
        means: list[list[float]] = [[] for _ in fns]  # per block: its calls' mean
        calls: list[list[int]] = [[] for _ in fns]  # per call
        # each pass over the variants in an order of its own: which variant's block a
        # block follows (whose code and data it finds in the caches) is then the same for
        # all of them on average (in a fixed rotation ``bare again`` mostly followed
        # ``bare``, the same code, and read 0.1-0.35 us faster than it)
        shuffle = random.Random(r).shuffle
        with torch.set_grad_enabled(grad):
            for _ in range(max(1, iters // BLOCK)):
                passes = list(range(n))
                shuffle(passes)
                for j in passes:
                    fn, taken = fns[j], calls[j]
                    for i in range(BLOCK):
                        x = inputs[i % sizes]
                        t0 = now()
                        fn(x)
                        taken.append(now() - t0)
                    means[j].append(sum(taken[-BLOCK:]) / BLOCK)
        med = dict(zip(VARIANTS, (statistics.median(s) for s in means)))
        p50 = {n: statistics.median(calls[VARIANTS.index(n)]) for n in ("bare", "fxflops")}
        bare_ms.append(med["bare"])
        for name in ("bare again", "bare 2", "floor", "fxflops", "timed"):
            diffs[name].append(med[name] - med["bare"])
        diffs["fxflops - floor"].append(med["fxflops"] - med["floor"])
        diffs["fxflops p50"].append(p50["fxflops"] - p50["bare"])
    out = {k: statistics.median(v) for k, v in diffs.items()}
    out["bare"] = statistics.median(bare_ms)
    return out


def every_call_style(iters: int, rounds: int) -> None:
    print("through torch.compile, per call (us; medians of per-round differences against "
          "bare, of the blocks' means; goal: fxflops <= +1 us)")
    print(f"{'inner':9} {'grad':5} {'sizes':5} {'bare':>8} {'A/A':>7} {'2nd':>7} "
          f"{'floor':>7} {'fxflops':>8} {'own':>7}  goal    {'timed':>7} {'p50':>7}")
    for inner in ("inductor", "eager"):
        for grad in (False, True):
            for sizes in (1, 3):
                r = call_style(inner, grad, sizes, iters, rounds)
                ok = "OK" if r["fxflops"] <= GOAL_NS else "MISSED"
                print(f"{inner:9} {'on' if grad else 'off':5} {sizes:5} {r['bare'] / 1e3:8.2f} "
                      f"{r['bare again'] / 1e3:+7.2f} {r['bare 2'] / 1e3:+7.2f} "
                      f"{r['floor'] / 1e3:+7.2f} "
                      f"{r['fxflops'] / 1e3:+8.2f} {r['fxflops - floor'] / 1e3:+7.2f}  "
                      f"{ok:6}  {r['timed'] / 1e3:+7.2f} {r['fxflops p50'] / 1e3:+7.2f}",
                      flush=True)
    print("(A/A: the bare callable timed again, this machine's noise; 2nd: a second "
          "bare compile, of a twin of the module, what two compiles of one model differ "
          "by; floor: "
          "a backend that only calls the inner; own: fxflops against the floor; timed: "
          "fxflops with every call timed, FXFLOPS_SAMPLE_EVERY=1, as a size's first "
          f"{FIRST_TIMED} calls are; p50: fxflops' median call against bare's, "
          "which leaves the sampled calls out)")


def per_call_ns(fn: Any, args: tuple, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn(*args)
    return (time.perf_counter_ns() - t0) / n


def bookkeeping_alone(rounds: int) -> tuple[Any, Any]:
    """fxflops' instrumented graph around a no-op inner against a function of the same shape:
    with the default stride and with every call timed, each on a graph of its own (a
    graph's rows keep its sampling state)."""
    from fxflops.instrument.wrap import InstrumentedGraph

    def noop(*a: Any) -> None:
        return None

    def shape(*args: Any) -> Any:  # the same frame, nothing counted
        return noop(*args)

    x = torch.randn(8, 4)
    torch._dynamo.mark_dynamic(x, 0)
    hots, kinds = {}, []
    captured: dict[str, Any] = {}

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        captured["graph"] = fxflops.backend(inner="eager")(gm, example_inputs)
        kinds[:] = [type(e).__name__ for e in example_inputs]
        return captured["graph"]

    for every in (str(EVERY), "1"):  # the stride; every call
        torch._dynamo.reset()  # a graph of its own: the lambda's code is the same
        torch.compile(lambda t: t * 2 + 1, backend=capture)(x)
        graph = captured.pop("graph")
        with sample_every(every):
            hots[every] = InstrumentedGraph(noop, graph.record, graph.plan)

    def graph_args(t: torch.Tensor) -> tuple:  # the graph takes its size symbols, then t
        return tuple(t if kind == "Tensor" else t.shape[0] for kind in kinds)

    a = graph_args(x)
    for hot in hots.values():
        for _ in range(WARM_CALLS):
            hot(*a)
    per_call_ns(shape, a, 20_000), per_call_ns(hots[str(EVERY)], a, 20_000)
    d: dict[str, list[float]] = {every: [] for every in hots}
    for _ in range(rounds * 4):
        for every, hot in hots.items():
            tb = per_call_ns(shape, a, 20_000)
            d[every].append(per_call_ns(hot, a, 20_000) - tb)
    nd, timed = statistics.median(d[str(EVERY)]), statistics.median(d["1"])
    print(f"bookkeeping alone (no-op inner): {nd / 1e3:.2f} us per call  goal: <= 1 us  "
          f"{'OK' if nd <= GOAL_NS else 'MISSED'}  (every call timed: {timed / 1e3:.2f} us)")
    return hots[str(EVERY)], graph_args


def memory(hot: Any, graph_args: Any, calls: int, sizes: int) -> None:
    inputs = [graph_args(torch.randn(s, 4)) for s in range(2, 2 + sizes)]
    tracemalloc.start()
    for i in range(1_000):
        hot(*inputs[i % sizes])
    after_1k = tracemalloc.get_traced_memory()[0]
    for i in range(calls - 1_000):
        hot(*inputs[i % sizes])
    after_all = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"memory after 1,000 calls:   {after_1k / 1024:.1f} KiB")
    print(f"memory after {calls:,} calls: {after_all / 1024:.1f} KiB over {sizes} sizes "
          f"(ratio {after_all / after_1k:.2f}; bounded by the {sizes} x window ring buffers)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--sizes", type=int, default=50)
    p.add_argument("--iters", type=int, default=6 * BLOCK,
                   help="calls per variant per round (whole blocks of 3 x the stride)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model", choices=sorted(MODELS), default="block",
                   help="block: a 16x16 linear and two element-wise ops (tens of us a "
                        "call, where a tenth of a microsecond shows); decoder: the demo's "
                        "decoder layer (attention, MLP: what a served graph is)")
    args = p.parse_args()
    global MODEL
    MODEL = args.model
    print(f"torch {torch.__version__}, Python {platform.python_version()}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")
    print(f"model: {MODEL}")
    every_call_style(args.iters, args.rounds)
    hot, graph_args = bookkeeping_alone(args.rounds)
    memory(hot, graph_args, args.calls, args.sizes)


if __name__ == "__main__":
    main()
