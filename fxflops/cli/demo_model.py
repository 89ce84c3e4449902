"""A small Llama-style decoder in plain PyTorch (random weights, nothing downloaded).

RMSNorm, grouped-query attention with rotary embeddings and causal SDPA, a SwiGLU MLP:
the shape of the models people serve, at a size a laptop compiles in seconds.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    vocab: int = 2048
    hidden: int = 256
    layers: int = 2
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 688

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, c.heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DemoConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden)
        self.self_attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_norm(x))


class DemoDecoder(nn.Module):
    def __init__(self, cfg: DemoConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or DemoConfig()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        s = input_ids.shape[1]
        t = torch.arange(s, device=input_ids.device, dtype=torch.float32)
        inv_freq = cast(torch.Tensor, self.inv_freq)  # a buffer
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def sdpa_flops(cfg: DemoConfig, batch: int, seq: int) -> int:
    """What torch's SDPA formula counts for the model's SDPA calls (which FlopCounterMode
    counts 0 on a CPU where the installed torch's registry lacks CPU SDPA, before 2.15): by
    hand, so that the demo's reference is torch's rule on any torch (its own formula counts
    grouped-query attention from 2.13 on). Two matmuls per head of the query,
    scores ``[seq, head_dim] @ [head_dim, seq]`` and ``[seq, seq] @ [seq, head_dim]``, at 2
    FLOPs per multiply-add: the key's and value's heads broadcast to the query's, a causal
    mask counted in full."""
    per_layer = 2 * (2 * batch * cfg.heads * seq * cfg.head_dim * seq)
    return cfg.layers * per_layer
