"""Tiny random-weight models for the tests: real architectures, nothing downloaded."""

from __future__ import annotations

import torch
from torch import nn


def llama():
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


def gpt2():
    import transformers

    cfg = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    return transformers.GPT2LMHeadModel(cfg).eval()


def opt():
    import transformers

    cfg = transformers.OPTConfig(vocab_size=128, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=256,
                                 word_embed_proj_dim=64)
    return transformers.OPTForCausalLM(cfg).eval()


def mixtral():
    import transformers

    cfg = transformers.MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=256)
    return transformers.MixtralForCausalLM(cfg).eval()


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def cnn():
    return SmallCNN().eval()


TRANSFORMERS = {"llama": llama, "gpt2": gpt2, "opt": opt, "mixtral": mixtral}
