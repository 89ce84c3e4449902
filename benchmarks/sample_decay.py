"""What a sampled call costs its neighbours: per-call time by position after a sample.

    python benchmarks/sample_decay.py [--every 16] [--inner eager] [--grad] [--periods 1200]

One layer compiled through ``torch.compile`` with ``fxflops.backend``, called in a loop
past a size's first calls, each call timed from outside (the loop's own clock reads, the
same for every call). Calls are grouped by their position in fxflops' sampling period
(0: the sampled call, which reads the clock around the graph and notes the sample; 1: the
call after it; ...), and the median of each position is printed against the fastest
position's, with the sum over one period: what sampling costs per period, over and above
an untimed call. ``--every`` sets ``FXFLOPS_SAMPLE_EVERY`` for the run.

On a 2-core Xeon VM (docs/benchmarks.md) the sampled call reads about 1.5 us over the
fastest, and the next few calls are slower too (about 1.4, 0.6, 0.3 us, then fading over
some ten calls): the sampled call took another path than its neighbours, and the CPU's
branch predictors relearn the model's own. About 5 us a period in all: 0.3 us a call at
one in 16, 0.02 us at one in 256 (the default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=int, default=16, help="FXFLOPS_SAMPLE_EVERY for the run")
    p.add_argument("--inner", default="eager", choices=("eager", "inductor"))
    p.add_argument("--grad", action="store_true", help="weights that need grad, grad on")
    p.add_argument("--periods", type=int, default=1200, help="sampling periods timed")
    args = p.parse_args()
    if args.every < 2:
        p.error("--every: at least 2 (with 1 every call is sampled: no neighbours)")
    os.environ["FXFLOPS_SAMPLE_EVERY"] = str(args.every)  # read when the graph is made

    import torch
    from overhead import Block

    import fxflops
    from fxflops import config

    block = Block().requires_grad_(args.grad)
    x = torch.randn(8, 16)
    compiled = torch.compile(block, backend=fxflops.backend(inner=args.inner), dynamic=True)
    with torch.set_grad_enabled(args.grad):
        # past the calls a size times one by one
        for _ in range(config.timed_first(args.every) + 2 * args.every):
            compiled(x)
        (graph,) = [g for g in fxflops.recorder().graphs if g.meta.get("phase") != "backward"]
        (row,) = graph.rows.values()
        now = time.perf_counter_ns
        by_position: list[list[int]] = [[] for _ in range(args.every)]
        for _ in range(args.periods * args.every):
            position = row.count % args.every  # 0: this call is sampled
            t0 = now()
            compiled(x)
            by_position[position].append(now() - t0)
    medians = [statistics.median(times) for times in by_position]
    fastest = min(medians)
    excess = [(m - fastest) / 1e3 for m in medians]
    print(f"torch {torch.__version__}, inner {args.inner}, grad {'on' if args.grad else 'off'}, "
          f"one call in {args.every} sampled; median call {fastest / 1e3:.2f} us")
    print("excess over the fastest position, by position after a sample (us):")
    print("  " + " ".join(f"{e:.2f}" for e in excess))
    print(f"per period: {sum(excess):.2f} us, per call: {sum(excess) / args.every:.3f} us")


if __name__ == "__main__":
    main()
