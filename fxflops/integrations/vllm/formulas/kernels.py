"""Formulas of vLLM's own kernels (``_C``, ``_moe_C``, ``_C_cache_ops``) and zentorch's.

One table line per op, grouped by family (``fxflops.cost.formulas.builders``; a line names
where the op keeps its sizes: its arguments by schema name, ``"out"`` its return value).
These are the kernels of vLLM 0.32 and 0.33 that ``ops`` and ``ssm`` do not already cost:
the CPU build's (AMX MoE, mHC, routing, DeepSeek-V4 rope fusions), the GPU build's norm/activation/rope fusions that vLLM's compile passes put in graphs,
and the zentorch ops vLLM calls on AMD Zen CPUs. Kernels that only ever run *inside*
another graph op are in :data:`INSIDE` (that op's formula counts their work);
:data:`UNCOSTABLE` lists what no formula here covers, and why.

Conventions (docs/conventions.md): a multiply-add is 2 FLOPs; a GEMM is ``2·M·K·N``
matmul FLOPs, ``M`` the activation's rows and ``K`` its width (never a packed weight's),
``N`` from the output (or an int argument); bias adds are not counted, as torch counts
``addmm``. Activations 1 per output element, activation-and-multiply 2; RMS norm 4 (3
without a weight), fused add + RMS norm 5, a ``(1 + w)`` weight one more (Gemma 5,
Nemotron's layer norm 8), layer norm 7, fused add + layer norm 8; rotary embedding 3 per
rotated element; softmax 5 per element. Quantising an output moves bytes and costs no
FLOPs. Fused ops sum their parts; an op that does both kinds of work returns a ``Split``.
"""

from __future__ import annotations

from typing import Any

import torch

from fxflops.cost.formulas.builders import (
    OUT_N,
    SOFTMAX,
    Builder,
    Named,
    Size,
    arg,
    const,
    dim,
    fused_moe,
    gemm,
    per_element,
    register,
    rows,
    tensor,
)
from fxflops.cost.registry import Split, register_inside, register_uncostable
from fxflops.integrations.vllm.formulas.mhc import hc_head, hc_post, mhc_pre
from fxflops.integrations.vllm.formulas.ops import ATTENTION_OP, MLA_OP, MOE_OP
from fxflops.integrations.vllm.formulas.ssm import (
    conv1d_per_token,
    delta_rule_per_token,
    qk_l2norm_per_token,
)


def first_tensor(a: Named) -> Any:
    """The op's first tensor argument. For kernels no vLLM wheel ships a schema for (XPU
    and Arm builds): read by position, so a schema spelling other names still counts."""
    return next(v for k, v in a.items() if k != "out" and isinstance(v, torch.Tensor))


def per_first(per: int) -> Builder:
    """``per`` FLOPs per element of the first tensor argument (out-variant activations and
    norms write an output the size of their input)."""
    return lambda a: per * first_tensor(a).numel()


def per_nth(per: int, index: int) -> Builder:
    """``per`` FLOPs per element of the op's ``index``-th argument (by position, for
    kernels without a shipped schema whose first argument is their output)."""
    return lambda a: per * list(a.values())[index].numel()


def plus_if(per: int, of: str, optional: str) -> Builder:
    """``per`` FLOPs per element of ``of``, one more when ``optional`` is given (a fused
    residual add)."""
    return lambda a: (per + int(a.get(optional) is not None)) * tensor(a, of).numel()


# --- GEMMs ------------------------------------------------------------------------------


def zentorch_linear(a: Named) -> Split:
    """zentorch's linear: ``2·M·K·N`` (``weight`` may be prepacked into an opaque layout,
    so ``N`` from the output) and its fused unary post-op (``relu``, ``gelu_*``,
    ``silu``, ``sigmoid``: one FLOP per output element; vLLM passes none)."""
    post = 0 if a.get("post_op", "none") == "none" else tensor(a, "out").numel()
    return Split(gemm("input", OUT_N)(a), post)


_GEMMS: dict[str, tuple[Builder, str]] = {
    # 2·M·K·N, K from the activation, N from the output: W4A8's int4 weight is reordered
    # and packed, the low-latency DeepSeek GEMM writes ``output`` [M, N]; zentorch's
    # int8 (dynamic-quant) and weight-only int4 linears return [..., N].
    "_C::cutlass_w4a8_mm": (gemm("A", OUT_N), "matmul"),
    "_C::dsv3_fused_a_gemm": (gemm("mat_a", dim("output", -1)), "matmul"),
    "zentorch::zentorch_linear_unary": (zentorch_linear, "matmul"),
    "zentorch::zentorch_dynamic_qlinear": (gemm("input", OUT_N), "matmul"),
    "zentorch::zentorch_woq_linear": (gemm("input", OUT_N), "matmul"),
}


# --- activations -------------------------------------------------------------------------

_ACTIVATIONS: dict[str, tuple[Builder, str]] = {
    # Counted from ``input``: these out-variant kernels name their output ``out``, which
    # registry.bind_arguments hands formulas as the op's return value (None here).
    # An activation alone: 1 per output element, the output the input's size (Arm's
    # lookup-table GELU, GELU-tanh, ReLU², Muse Spark's scaled tanh soft-cap).
    "_C::activation_lut_bf16": (per_first(1), "vector"),
    "_C::gelu_tanh": (per_element(1, "input"), "vector"),
    "_C::relu_squared": (per_element(1, "input"), "vector"),
    "_C::relu2_no_mul": (per_first(1), "vector"),
    "_C::muse_spark_mul_tanh_soft_cap": (per_element(1, "input"), "vector"),
    # Activation and multiply: 2 per output element, the output half the [gate | up]
    # input's width: 1 per input element. Also when fused with the output's quantisation
    # (bytes), whatever the output's packing (fp4: two a byte). DeepGEMM's masked MoE
    # buffer [E, T_max, 2I]: its padded rows (the real counts are device data), an upper
    # bound.
    "_C::fatrelu_and_mul": (per_element(1, "input"), "vector"),
    "_C::mul_and_silu": (per_element(1, "input"), "vector"),
    "_C::silu_and_mul_with_clamp": (per_element(1, "input"), "vector"),
    "_C::situ_and_mul": (per_element(1, "input"), "vector"),
    "_C::swigluoai_and_mul": (per_element(1, "input"), "vector"),
    "_C::swiglustep_and_mul": (per_nth(1, 1), "vector"),
    "_C::silu_and_mul_quant": (per_element(1, "input"), "vector"),
    "_C::silu_and_mul_nvfp4_quant": (per_element(1, "input"), "vector"),
    "_C::silu_and_mul_per_block_quant": (per_element(1, "input"), "vector"),
    "_C::situ_and_mul_quant": (per_element(1, "input"), "vector"),
    "_C::persistent_masked_m_silu_mul_quant": (per_element(1, "input"), "vector"),
}


# --- norms -------------------------------------------------------------------------------


def hadamard_transform(a: Named) -> Any:
    """A fast Walsh-Hadamard transform over the last dimension ``n`` (QuaRot/SpinQuant
    rotations): one add or subtract per element per butterfly stage, ``log2(n)`` stages."""
    x = tensor(a, "x")
    return x.numel() * (int(x.shape[-1]).bit_length() - 1)


def beam_allreduce_norm(a: Named) -> Any:
    """Beam's fused all-reduce (communication: free) + post-norm (RMS, 4) + scaled residual
    add (1, and 2 scales when ``scaled``) + the next layer's pre-norm (4), each norm when
    flagged; with ``experts`` the MoE's finalize first: the top-k expert rows
    [T·k, H] weighted and summed into the token (2 a row element)."""
    per = 1 + 4 * bool(a["post_norm"]) + 4 * bool(a["next_norm"]) + 2 * bool(a["scaled"])
    finalize = 2 * tensor(a, "experts").numel() if a.get("experts") is not None else 0
    return per * tensor(a, "input").numel() + finalize


def attn_res(a: Named) -> Split:
    """Kimi-K3's attention residual: each token attends over its ``num_blocks`` block
    outputs and the running prefix (``S = num_blocks + 1`` sources, none when there are no
    blocks). Per source: its RMS (square, sum: ``2·H``, vector) and, as attention's two
    products, the logit ``<source, w>`` and the weighted sum (``2·H`` each, matmul); the
    softmax's normalisation (``H``), the ``delta`` added to the prefix (``H``) and the
    output's RMS norm (``4·H``) when given."""
    prefix = tensor(a, "prefix")
    hidden = prefix.shape[-1]
    n_tokens = prefix.numel() // hidden
    sources = a["num_blocks"] + 1 if a["num_blocks"] > 0 else 0
    vector = (2 * sources + int(sources > 0) + int(a.get("delta") is not None)
              + 4 * int(a.get("output_norm_weight") is not None)) * hidden
    return Split(4 * sources * hidden * n_tokens, vector * n_tokens)


_NORMS: dict[str, tuple[Builder, str]] = {
    # XPU's norms (no schema in any wheel: read by position; vLLM calls them inside its
    # vllm::xpu_* wrapper ops, which ``gpu`` costs): Gemma's (1 + w) weight one
    # more than RMS norm's 4, the fused residual add one more; layer norm 7 (mean,
    # variance, normalise, affine), Nemotron's (1 + w) one more
    "_C::gemma_rms_norm": (per_first(5), "vector"),
    "_C::fused_add_gemma_rms_norm": (per_first(6), "vector"),
    "_C::layer_norm": (per_first(7), "vector"),
    "_C::fused_add_layer_norm": (per_first(8), "vector"),
    "_C::nemotron_layer_norm": (per_first(8), "vector"),
    "_C::fused_add_nemotron_layer_norm": (per_first(9), "vector"),
    # RMS norm fused with the output's fp8/int8 quantisation (bytes) by vLLM's fusion
    # pass: 4, the residual add 1 more
    "_C::rms_norm_static_fp8_quant": (per_element(4, "input"), "vector"),
    "_C::fused_add_rms_norm_static_fp8_quant": (per_element(5, "input"), "vector"),
    "_C::rms_norm_dynamic_per_token_quant": (plus_if(4, "input", "residual"), "vector"),
    "_C::rms_norm_per_block_quant": (plus_if(4, "input", "residual"), "vector"),
    # a rotation and the norm-like residual mixes of two models (see their docstrings)
    "_C::hadacore_transform": (hadamard_transform, "vector"),
    "_C::beam_allreduce_norm": (beam_allreduce_norm, "vector"),
    "_C::kimi_k3_attn_res": (attn_res, "matmul"),
}


# --- rotary embedding with q/k norms, fused (KV-cache writes and quantisation: bytes) --


def norm_rope(n_tokens: Size, heads: Size, head_dim: Size, rot: Size, norm: Size) -> Builder:
    """``heads`` heads a token of ``head_dim``: a per-head norm of ``norm`` FLOPs an element
    (0: none) and rotary embedding of the first ``rot`` dimensions (3 per rotated
    element)."""
    return lambda a: (n_tokens(a) * heads(a)
                      * (norm(a) * head_dim(a) + 3 * rot(a)))


def sum_args(*names: str) -> Size:
    return lambda a: sum(a[n] for n in names)


def minimax_m3_qknorm_rope(a: Named) -> Any:
    """MiniMax-M3: Gemma RMS norm (5) and partial rope of q's and k's heads (head size from
    the per-head norm weight) and, on sparse layers unless skipped, of the indexer's
    ``num_index_heads`` q heads and its one k head (the same rope)."""
    n_tokens, rot = rows("qkv")(a), a["rotary_dim"]
    d = tensor(a, "q_norm_weight").numel()
    flops = n_tokens * (a["num_heads"] + a["num_kv_heads"]) * (5 * d + 3 * rot)
    if a["num_index_heads"] > 0 and not a.get("skip_index_branch") \
            and a.get("index_q_norm_weight") is not None:
        d_index = tensor(a, "index_q_norm_weight").numel()
        flops = flops + n_tokens * (a["num_index_heads"] + 1) * (5 * d_index + 3 * rot)
    return flops


def deepseek_v4_q_kv_rope(q: str, q_norm: str | None = "apply_q_norm",
                          q_rope: str | None = None) -> Builder:
    """DeepSeek-V4: q's heads get a weight-free RMS norm (3 an element, when
    ``apply_q_norm``) and rope of the last ``R`` dimensions (``R`` the cos/sin cache's
    width; when ``apply_q_rope``), the one latent KV head its rope. Heads of the KV
    latent's width ``D``, so any q layout counts."""

    def formula(a: Named) -> Any:
        kv = tensor(a, "kv")
        d, rot = kv.shape[-1], tensor(a, "cos_sin_cache").shape[-1]
        n_tokens = kv.numel() // d
        q_heads = tensor(a, q).numel() // (n_tokens * d)
        per_q = (3 * d if q_norm is None or a.get(q_norm, True) else 0) + \
            (3 * rot if q_rope is None or a.get(q_rope, True) else 0)
        return n_tokens * (q_heads * per_q + 3 * rot)

    return formula


_ROTARY: dict[str, tuple[Builder, str]] = {
    # per-head q/k RMS norm (4, with a weight; 5 when the weight gets a bias, Gemma's
    # 1 + w; 3 weight-free) and rope of their ``rot`` first dimensions, q and k heads of
    # every token; the v heads pass through
    "_C::fused_qk_norm_rope": (norm_rope(
        rows("qkv"), sum_args("num_heads_q", "num_heads_k"), arg("head_dim"),
        dim("cos_sin_cache", -1), const(4)), "vector"),
    "_C::fused_qknorm_rope_cache": (norm_rope(
        rows("qkv"), sum_args("num_q_heads", "num_kv_heads"), arg("head_dim"),
        lambda a: 2 * a["rotary_pairs"], lambda a: 4 + int(a["norm_weight_bias"] != 0)),
        "vector"),
    "_C::fused_muse_spark_qknorm_rope_kv_insert": (norm_rope(
        rows("qkv"), sum_args("num_heads", "num_kv_heads"), arg("head_dim"),
        lambda a: a["rotary_dim"] if a.get("cos_sin_cache") is not None else 0, const(3)),
        "vector"),
    "_C::fused_minimax_m3_qknorm_rope_kv_insert": (minimax_m3_qknorm_rope, "vector"),
    # DeepSeek-V4 (q [T, H, D], kv [T, D]): q's weight-free norm and rope, kv's rope
    "_C::fused_qnorm_rope_kv_insert_cpu": (deepseek_v4_q_kv_rope("q", None), "vector"),
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert": (
        deepseek_v4_q_kv_rope("q"), "vector"),
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert": (
        deepseek_v4_q_kv_rope("q"), "vector"),
    "_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert": (
        deepseek_v4_q_kv_rope("q_in", q_rope="apply_q_rope"), "vector"),
    "_C::fused_deepseek_v4_kv_rope_insert": (
        lambda a: 3 * tensor(a, "cos_sin_cache").shape[-1] * rows("kv")(a), "vector"),
}


# --- mixture of experts -------------------------------------------------------------------
#
# Every token goes through exactly top-k experts (``topk_ids`` [T, k]), so the count is
# exact from shapes: per routed token the gate/up GEMM (H -> 2I), the down GEMM (I -> H),
# the activation and gate multiply (2·I) and the weighted sum (2·H); builders.fused_moe.
# All three kernels are gated (SiLU, SwiGLU-OAI, GELU, SwigluStep: *_and_mul).

INT4_W4A8 = 3  # vllm._custom_ops.CPUQuantMethod.INT4_W4A8


def gated_inter(w13: str) -> Size:
    """``I`` from a gated experts' first weight [E, 2I, H]."""
    return lambda a: tensor(a, w13).shape[1] // 2


def fused_experts_cpu_inter(a: Named) -> Any:
    """``I`` of the AMX MoE: ``w1`` [E, 2I, H] keeps its output dimension under VNNI packing
    (bf16/fp16, int8 with its int32 compensation column, fp8, mxfp4 two a byte along H);
    INT4_W4A8 blocks ``w1`` into AMX tiles [E, Nc, Kc, bytes], and its scales [E, Nc, G,
    block_n] give ``2I = Nc·block_n`` (the kernel's own reading)."""
    if a["moe_comp_method"] == INT4_W4A8:
        scales = tensor(a, "w1_scale")
        return scales.shape[1] * scales.shape[-1] // 2
    return gated_inter("w1")(a)


_MOE: dict[str, tuple[Builder, str]] = {
    # AMX fused experts (sgl-kernel): out [T, H] written, hidden_states [T, H]
    "_C::fused_experts_cpu": (fused_moe("hidden_states", "topk_ids", fused_experts_cpu_inter),
                              "matmul"),
    # KleidiAI's int4 MoE (Arm): the weights are opaque blobs, H and I int arguments
    "_C::dynamic_4bit_int_moe": (fused_moe("x", "topk_ids", arg("intermediate_size"),
                                           width=arg("hidden_size")), "matmul"),
    # zentorch's (Zen): w13 [E, 2I, H] (bf16, or int8 with its scales)
    "zentorch::zentorch_fused_moe": (fused_moe("input", "topk_id", gated_inter("w13")),
                                     "matmul"),
}


# --- routing: scores per router logit (the top-k selection itself is free) --------------

_SCORING = {"softmax": SOFTMAX, "sigmoid": 1, "sqrtsoftplus": 2}  # sqrt(softplus): 2


def router_scores(of: str, func: str | None = None, bias: str | None = None) -> Builder:
    """Scores of every logit of ``of``: softmax 5, sigmoid 1, sqrt-softplus 2 (by the
    op's ``func`` argument, softmax without one), a correction bias 1 more; the per-token
    renormalisation of the k chosen is left out (k, not E, a token)."""

    def formula(a: Named) -> Any:
        per = _SCORING[str(a[func])] if func is not None else SOFTMAX
        per += int(bias is not None and a.get(bias) is not None)
        return per * tensor(a, of).numel()

    return formula


_ROUTING: dict[str, tuple[Builder, str]] = {
    "_C::biased_topk_cpu": (router_scores("gating_output", "scoring_func", "correction_bias"),
                            "vector"),
    "_C::hash_topk_cpu": (router_scores("gating_output", "scoring_func"), "vector"),
    "_moe_C::topk_softmax": (router_scores("gating_output", bias="bias"), "vector"),
}


# --- DeepSeek-V4's hyper-connections (mHC) on CPU -------------------------------------------
#
# ``hc`` residual streams x [T, hc, H]. Counted as ``gpu`` counts the GPU's mHC
# ops, so a layer costs the same on either: the mix logits ``x @ fn^T`` (matmul), the
# streams' RMS (square and sum, 2 an element) and each logit's scale, bias and gate (3);
# Sinkhorn's iterations on the hc x hc combination (a row and a column pass, each a sum
# and a divide: 4 an element); the pre-mix's weighted sum of the streams (2 an element).
# Post: each stream element a combination of hc streams (2·hc) plus the scaled layer
# output (2).


_HYPER_CONNECTIONS: dict[str, tuple[Builder, str]] = {
    "_C::hc_pre_fused_cpu": (mhc_pre("x", "sinkhorn_iters", fn="hc_fn"), "matmul"),
    "_C::hc_post_fused_cpu": (hc_post("residual"), "vector"),
    "_C::hc_head_fused_cpu": (hc_head("x", "hc_fn"), "matmul"),
}


# --- linear attention ----------------------------------------------------------------------


def kda_decode(a: Named) -> Split:
    """Kimi-K3's fused KDA decode step, per token, in the recurrent form ``ssm``
    counts Gated DeltaNet in: the depthwise conv over q, k and v (``weight`` [C, W], SiLU),
    the gate per key channel (bias, softplus, scale by ``exp(A)``, bound: 4) and ``β``
    (sigmoid), the q/k L2 norms, the delta rule with a decay per key channel (``exp`` of
    each: ``K - 1`` more a head than Gated DeltaNet's one) and, with ``norm_weight``, the
    gated output RMS norm (norm 4, gate 2). Heads and sizes from ``state`` [slots, H, K,
    V], tokens from ``x`` [T, C] (its output is named ``out``, which formulas see as the
    op's return value)."""
    state, weight = tensor(a, "state"), tensor(a, "weight")
    heads, k_dim, v_dim = state.shape[-3], state.shape[-2], state.shape[-1]
    n_tokens = rows("x")(a)
    per_token = (conv1d_per_token(weight.shape[0], weight.shape[-1], a.get("bias") is not None,
                                  True)
                 .plus(Split(0, heads * (4 * k_dim + 1)))
                 .plus(qk_l2norm_per_token(heads, k_dim))
                 .plus(delta_rule_per_token(heads, k_dim, v_dim))
                 .plus(Split(0, heads * (k_dim - 1))))
    if a.get("norm_weight") is not None:
        per_token = per_token.plus(Split(0, 6 * heads * v_dim))
    return per_token.times(n_tokens)


_LINEAR_ATTENTION: dict[str, tuple[Builder, str]] = {
    "_C::fused_kda_decode": (kda_decode, "matmul"),
}


TABLE: dict[str, tuple[Builder, str]] = {
    **_GEMMS, **_ACTIVATIONS, **_NORMS, **_ROTARY, **_MOE, **_ROUTING, **_HYPER_CONNECTIONS,
    **_LINEAR_ATTENTION,
}
register(TABLE)


# --- kernels that run only inside another graph op: that op's formula counts them -----

_DEEPSEEK_V4_CPU = "vllm::deepseek_v4_cpu_prepare_and_attn"

INSIDE: dict[str, str] = {
    # attention backends' kernels, run by the layer's impl inside the attention op: the
    # CPU backend, ROCm's Octave backend (its rotation too), zentorch's SDPA backend, the
    # merge of a chunked prefill's two partial results
    "_C::cpu_attention_with_kv_cache": ATTENTION_OP,
    "_C::merge_attn_states": ATTENTION_OP,  # also in MLA's chunked-context prefill
    "_C::octave_decode": ATTENTION_OP,
    "_C::octave_prefill": ATTENTION_OP,
    "_C::octave_rotate": ATTENTION_OP,
    "zentorch::zentorch_sdpa_attn": ATTENTION_OP,
    # Qwen4-exp's sparse attention decodes with Octave inside its own op
    "_C::octave_decode_sparse": "vllm::qwen4_exp_qsa_with_output",
    # MLA backends' kernels: AMX (sgl decode/extend), the generic CPU decode, Blackwell's,
    # zentorch's prefill SDPA (also behind vllm::torch_sdpa_wrapper in vision encoders)
    "_C::decode_attention_cpu": MLA_OP,
    "_C::extend_attention_cpu": MLA_OP,
    "_C::mla_decode_kvcache": MLA_OP,
    "_C::sm100_cutlass_mla_decode": MLA_OP,
    "zentorch::zentorch_sdpa": MLA_OP,
    # a GPU MoE runner's grouped GEMMs, activations, routing and sum, inside moe_forward
    "_C::cutlass_fp4_group_mm": MOE_OP,
    "_C::cutlass_moe_mm": MOE_OP,
    "_C::cutlass_mxfp4_group_mm": MOE_OP,
    "_C::cutlass_w4a8_moe_mm": MOE_OP,
    "_C::masked_moe_activation": MOE_OP,
    "_C::silu_and_mul_mxfp4_experts_quant": MOE_OP,
    "_C::silu_and_mul_scaled_fp4_experts_quant": MOE_OP,
    "_moe_C::grouped_topk": MOE_OP,
    "_moe_C::moe_sum": MOE_OP,
    "_moe_C::moe_wna16_gemm": MOE_OP,
    "_moe_C::moe_wna16_marlin_gemm": MOE_OP,
    "_moe_C::topk_sigmoid": MOE_OP,
    "_moe_C::topk_softplus_sqrt": MOE_OP,
    # DeepSeek-V4 on CPU: compressor, indexer, sparse MLA and the output's inverse rope,
    # all inside the one opaque attention op (models/deepseek_v4/cpu/cpu_sparse.py)
    "_C::compress_norm_rope_store_cpu": _DEEPSEEK_V4_CPU,
    "_C::compress_norm_rope_store_indexer_cpu": _DEEPSEEK_V4_CPU,
    "_C::flash_mla_with_kvcache_cpu": _DEEPSEEK_V4_CPU,
    "_C::fp8_paged_mqa_logits_cpu": _DEEPSEEK_V4_CPU,
    "_C::fused_indexer_q_rope_quant_cpu": _DEEPSEEK_V4_CPU,
    "_C::inverse_gptj_rope_o_proj_cpu": _DEEPSEEK_V4_CPU,
    # kernels inside the vLLM op that picks or wraps them
    "_C::fp32_router_gemm": "vllm::fp32_router_gemm_dispatch",
    "_C::fused_gdn_decode_post_conv_mtp": "vllm::qwen_gdn_attention_core_fused_norm_packed",
    "_C::minimax_allreduce_rms_qk": "vllm::minimax_qk_norm_fusion",
    "_C::selective_scan_fwd": "vllm::mamba_mixer",
    "_C_cache_ops::concat_and_cache_mla_rope_fused": "vllm::fused_rope_unified_mla_kv_cache_update",
}

for _kernel, _caller in INSIDE.items():
    register_inside(_caller, _kernel)


# --- ops no formula here covers ----------------------------------------------------------

UNCOSTABLE: dict[str, str] = {
    "_C::fused_kda_chunk":
        "ROCm-only (0.33) and no schema in either wheel to bind its arguments by; its inputs "
        "are the chunked (WY) form's intermediates, and it runs eagerly in Kimi-K3's AMD KDA "
        "layer (vllm/models/kimi_k3 is not torch.compiled), never in a graph",
    "_C::fused_kda_prologue":
        "ROCm-only (0.33) and no schema in either wheel; builds the chunked form's "
        "intermediates for fused_kda_chunk in the same eager Kimi-K3 layer, never in a graph",
}
for _op, _why in UNCOSTABLE.items():
    register_uncostable(_op, _why)
