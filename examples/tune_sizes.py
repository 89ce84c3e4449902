"""Which sizes are worth a specialised graph? Two runs of the same model, then `fxflops tune`.

    python examples/tune_sizes.py OUT_DIR [--inner inductor] [--sizes 1 2 4 8 16]

Run "general": one dynamic graph serves every batch size. Run "specialised": every size gets
its own static graph (what vLLM's compile_sizes does for the sizes listed). Each run writes
its report into OUT_DIR/<run>/; then: fxflops tune OUT_DIR/general OUT_DIR/specialised
"""

from __future__ import annotations

import argparse
import os

import torch

import fxflops
from fxflops.cli.demo_model import DemoConfig, DemoDecoder


def run(model, sizes, dynamic: bool, inner: str, iters: int, out: str) -> str:
    torch._dynamo.reset()
    fxflops.reset_recorder()
    with torch._dynamo.config.patch(automatic_dynamic_shapes=dynamic,
                                    recompile_limit=64, cache_size_limit=64):
        compiled = torch.compile(model, backend=fxflops.backend(inner=inner), dynamic=dynamic)
        with torch.inference_mode():
            for b in sizes:
                x = torch.randint(0, model.cfg.vocab, (b, 1))
                for _ in range(iters):
                    compiled(x)
    return fxflops.recorder().save(os.path.join(out, "report.json"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--inner", default="inductor")
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--iters", type=int, default=30)
    args = p.parse_args()
    torch.manual_seed(0)
    model = DemoDecoder(DemoConfig(layers=1)).eval()
    for name, dynamic in (("general", True), ("specialised", False)):
        path = run(model, args.sizes, dynamic, args.inner, args.iters,
                   os.path.join(args.out, name))
        print(f"{name}: {path}")
    print(f"next: fxflops tune {args.out}/general {args.out}/specialised")


if __name__ == "__main__":
    main()
