"""Train a small transformer for a few steps on CPU with ``backend="fxflops"``.

    python examples/train_tiny.py OUT [--steps 8] [--batch 8] [--seq 64] [--inner inductor]
    fxflops report OUT

The model, its loss and the optimizer's step are compiled; fxflops counts and times the
forward and backward graphs AOTAutograd makes of the model, and the optimizer's graph, and
rolls them up per step (docs/training.md explains the report).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

import fxflops


class TinyLM(nn.Module):
    """A decoder-only transformer: embeddings, causal self-attention blocks, a LM head."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2,
                 max_len: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        h = self.embed(ids) + self.pos(torch.arange(seq, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=ids.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="folder for the fxflops report")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--inner", default="inductor",
                   help="inductor or aot_eager (eager counts the forward only)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    backend = fxflops.backend(inner=args.inner)

    @torch.compile(backend=backend)
    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        logits = model(ids[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    @torch.compile(backend=backend)
    def opt_step() -> None:
        opt.step()

    for step in range(args.steps):
        ids = torch.randint(0, 256, (args.batch, args.seq + 1))
        loss = loss_of(ids)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}")

    path = fxflops.recorder().save(os.path.join(args.out, "train.json"))
    print(f"report: {path}")


if __name__ == "__main__":
    main()
