"""A data-parallel training job for the distributed tests, run by ``torchrun`` on gloo (CPU).

    torchrun --nproc-per-node 2 tests/dist_train.py --wrap ddp --backend fxflops --out OUT

Each rank trains the same model (seeded) on its own batch (seeded by its rank) for
``--steps`` steps, with the model compiled by ``--backend`` (``fxflops`` or ``inductor``, the
same run without fxflops):

- ``ddp``: ``torch.compile(DDP(model))``; with ``--bucket-mb 1`` Dynamo's DDP optimizer
  splits the graph at the gradient buckets (one per linear layer here);
- ``fsdp``: FSDP2, each block ``fully_shard``-ed and compiled on its own (per-block compile,
  as torchtitan does): the all-gathers and reduce-scatters run outside the graphs.

Writes ``OUT/rank<r>.json``: the losses (exact, as hex floats), and the FLOPs of one eager
step of the same model on the same batch under ``torch.utils.flop_counter.FlopCounterMode``
(the independent reference). With fxflops, the report goes to ``$FXFLOPS_OUT``. With
``--hold S`` the process stays S seconds after training, flushed, so that its node's
exporter can be scraped.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch
import torch.distributed as dist

WIDTH = 512
BATCH = 16


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Net(torch.nn.Module):
    """A forward of its own (Dynamo compiles it from inside DDP; a torch.nn container's it
    does not: see fxflops.distributed)."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def eager_step_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """FlopCounterMode's FLOPs of one forward and backward of an eager copy."""
    from torch.utils.flop_counter import FlopCounterMode

    copy_ = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        copy_(x).square().mean().backward()
    return counter.get_total_flops()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--wrap", choices=("ddp", "fsdp"), required=True)
    p.add_argument("--backend", default="fxflops")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--hold", type=float, default=0.0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(BATCH, WIDTH, generator=gen)
    reference = eager_step_flops(model, x)

    if args.wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
        run = torch.compile(ddp, backend=args.backend)
        params = ddp.parameters()
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            block.compile(backend=args.backend)
            fully_shard(block)
        fully_shard(model)
        run = model
        params = model.parameters()
    optimizer = torch.optim.SGD(params, lr=0.01)

    losses = []
    for _ in range(args.steps):
        optimizer.zero_grad()
        loss = run(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()).hex())

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "losses": losses, "eager_step_flops": reference}, f)
    if args.backend == "fxflops":
        import fxflops

        fxflops.recorder().flush()
    dist.barrier()
    if args.hold:
        time.sleep(args.hold)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
