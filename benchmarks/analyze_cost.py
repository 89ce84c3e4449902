"""How long the cost analysis takes, per 1,000 nodes and as a share of Inductor's compile.

    python benchmarks/analyze_cost.py [--layers 2 8 64]

A chain of MLP blocks (linear, gelu, layernorm, residual add: ~10 graph nodes per block);
64 blocks is ~700 nodes, 1,000 blocks ~10,000 nodes (analysis only: Inductor would take
too long on 2 cores, so the share is measured on the smaller graphs).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import fxflops


class Block(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc1, self.fc2, self.norm = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))) * 0.5)


def measure(blocks: int, inductor: bool) -> None:
    model = nn.Sequential(*[Block() for _ in range(blocks)])
    timings = {}

    def be(gm, example_inputs):
        t0 = time.perf_counter()
        fxflops.analyze(gm)
        timings["analyze"] = time.perf_counter() - t0
        timings["nodes"] = len(gm.graph.nodes)
        if inductor:
            from torch._inductor import compile_fx

            t0 = time.perf_counter()
            # a cold compile: Inductor's caches would turn a rerun into a lookup
            with torch._inductor.config.patch(force_disable_caches=True):
                out = compile_fx.compile_fx(gm, example_inputs)
            timings["inductor"] = time.perf_counter() - t0
            return out
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=be, dynamic=True)(torch.randn(4, 64))
    per_k = timings["analyze"] / timings["nodes"] * 1000
    line = (f"{blocks:5d} blocks  {timings['nodes']:6d} nodes  analyze {timings['analyze']:.3f} s "
            f"({per_k * 1e3:.1f} ms / 1,000 nodes)")
    if inductor:
        line += (f"  inductor {timings['inductor']:.1f} s  "
                 f"share {timings['analyze'] / timings['inductor']:.1%}")
    print(line)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--inductor-blocks", type=int, nargs="*", default=[4, 32])
    p.add_argument("--analyze-blocks", type=int, nargs="*", default=[1000])
    args = p.parse_args()
    for b in args.inductor_blocks:
        measure(b, inductor=True)
    for b in args.analyze_blocks:
        measure(b, inductor=False)


if __name__ == "__main__":
    main()
