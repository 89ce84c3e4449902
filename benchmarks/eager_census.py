"""What counting an uncompiled model costs (``fxflops.eager``; vLLM's mode 0 runs the same).

    python benchmarks/eager_census.py [--tokens 1 16 128] [--calls 200] [--rounds 5]

On a small decoder (transformers' Llama: 2 layers, hidden 256, as the vLLM tests' tiny
model), through ``fxflops.eager(model)`` as users call it, in one run:

1. **The one-off census per size**: a size's first call, which runs under the census (a
   dispatch per op), against the same forward uninstrumented (its median). Paid once per
   size; the ratio is what that first call costs.
2. **The per-call cost after it** (every later call: a shape key, a dict lookup, a count,
   a sample one in ``FXFLOPS_SAMPLE_EVERY``): blocks of calls through ``fxflops.eager``
   and blocks of the bare model, interleaved, per round; the median over rounds of each
   round's difference and ratio. fxflops off is the bare model.
3. **fxflops' own part** of a call: the same path around a callable that does nothing.
4. **vLLM's seam in mode NONE** (where vLLM is installed): a forward counted as the
   worker's load sets it, called in a vLLM forward context, against the bare forward in
   the same context.

Figures are this machine's (a shared 2-core VM): docs/benchmarks.md keeps them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def decoder() -> torch.nn.Module:
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def median_call(fn, x, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        fn(x)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3  # us


def block(fn, x, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter_ns() - t0) / calls / 1e3  # us per call


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import fxflops

    torch.manual_seed(0)
    model = decoder()
    counted = fxflops.eager(model, name="bench_eager")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("1. the census, once per size, against the forward uninstrumented")
    print(f"{'tokens':>7} {'forward us':>11} {'census us':>10} {'ratio':>7} {'ops':>5}")
    with torch.no_grad():
        for n in args.tokens:
            x = torch.randint(0, 1024, (1, n))
            base = median_call(model, x, max(20, args.calls // 10))
            t0 = time.perf_counter_ns()
            counted(x)  # the census
            census = (time.perf_counter_ns() - t0) / 1e3
            ops = counted.record.cost.num_nodes if counted.record is not None else 0
            print(f"{n:>7} {base:>11.1f} {census:>10.1f} {census / base:>7.1f} {ops:>5}")
        print("2. every later call: fxflops.eager against the bare model, blocks interleaved "
              "(A/A: the bare model against itself, this machine's noise)")
        print(f"{'tokens':>7} {'bare us':>9} {'eager us':>9} {'+us':>7} {'ratio':>7} "
              f"{'A/A +us':>8}")
        for n in args.tokens:
            x = torch.randint(0, 1024, (1, n))
            diffs, ratios, bares, noise = [], [], [], []
            block(counted, x, 300)  # past the size's first calls, each timed: the steady state
            for r in range(args.rounds):
                order = [(model, "bare"), (counted, "eager"), (model, "again")]
                for _ in range(r % 3):
                    order.append(order.pop(0))
                got = {name: block(fn, x, args.calls) for fn, name in order}
                diffs.append(got["eager"] - got["bare"])
                ratios.append(got["eager"] / got["bare"])
                bares.append(got["bare"])
                noise.append(got["again"] - got["bare"])
            bare = statistics.median(bares)
            print(f"{n:>7} {bare:>9.1f} {bare + statistics.median(diffs):>9.1f} "
                  f"{statistics.median(diffs):>+7.1f} {statistics.median(ratios):>7.3f} "
                  f"{statistics.median(noise):>+8.1f}")
        # fxflops' own part, apart from the model: the same path around a callable that
        # does nothing, against that callable
        def nothing(x):
            return x

        idle = fxflops.eager(nothing, name="bench_nothing")
        idle(x)
        own = [block(idle, x, 20000) - block(nothing, x, 20000) for _ in range(args.rounds)]
        print(f"3. fxflops' own cost per call (around a callable that does nothing): "
              f"{statistics.median(own):+.2f} us")
        vllm_seam(x, args.rounds)


def vllm_seam(x: torch.Tensor, rounds: int) -> None:
    """4. vLLM's seam in mode NONE (``integrations/vllm/uncompiled.py``): a model's forward
    as the worker's load sets it, called inside a vLLM forward context as vLLM calls it,
    around a forward that does nothing, against that forward in the same context: what a
    serving step pays for being counted (where vLLM is installed)."""
    try:
        from vllm.config import VllmConfig
        from vllm.forward_context import set_forward_context

        from fxflops.instrument.eager import EagerModel
        from fxflops.integrations.vllm.uncompiled import counted_forward
    except ImportError:
        print("4. vLLM's seam: not measured (no vLLM in this environment)")
        return

    def forward(input_ids: object = None, positions: object = None) -> object:
        return positions

    seam = counted_forward(EagerModel(forward, "bench_vllm_seam"), forward)
    positions = torch.arange(x.shape[-1])
    with set_forward_context(None, VllmConfig()):
        seam(input_ids=None, positions=positions)  # the size's census

        def counted(p: torch.Tensor) -> object:
            return seam(input_ids=None, positions=p)

        def bare(p: torch.Tensor) -> object:
            return forward(input_ids=None, positions=p)

        block(counted, positions, 300)
        own = [block(counted, positions, 20000) - block(bare, positions, 20000)
               for _ in range(rounds)]
    print(f"4. vLLM's seam, per forward (mode NONE, in a forward context, around a forward "
          f"that does nothing): {statistics.median(own):+.2f} us")


if __name__ == "__main__":
    main()
