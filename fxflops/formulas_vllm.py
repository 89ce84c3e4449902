"""Formulas for vLLM's custom ops (``_C::*``, ``vllm::*``), registered by name.

Their conventions follow the aten ones: a multiply-add is 2 FLOPs, an elementwise op costs
one FLOP per element. Out-variant ops return nothing; their shapes come from the ``out``
argument.
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch

from fxflops.cost import RuntimeCost
from fxflops.registry import (
    register_bytes,
    register_formula,
    register_io_bytes,
    register_zero_flop,
)


def _numel(shape: Any) -> Any:
    return prod(shape)


def _mm_dims(c_shape: Any, a_shape: Any) -> tuple[Any, Any, Any]:
    """(M, K, N) of a linear whose weight is hidden in a handle: K from ``a``, N from ``c``."""
    k = a_shape[-1]
    n = c_shape[-1]
    m = _numel(a_shape) // k
    return m, k, n


# --- quantised linears --------------------------------------------------------------------
#
# 2·M·K·N, with K from the activation (which is never packed) and N from the output: packed
# weights (int4 in int32, fp8 tiles) never enter the count. Bytes are the tensors' real
# sizes, packed weights included (the default). MFU's peak is the activation's dtype: fp8
# and int8 matmuls have their own; weight-only int4 GEMMs compute in the activation's.

_QUANT_GEMMS_RETURNING = [
    "_C::gptq_marlin_gemm", "_C::marlin_gemm", "_C::awq_marlin_gemm", "_C::gptq_marlin_24_gemm",
    "_C::fp8_marlin_gemm", "_C::machete_mm", "_C::awq_gemm", "_C::gptq_gemm",
    "_C::marlin_qqq_gemm", "_C::allspark_w8a16_gemm", "_C::ggml_mul_mat_a8",
    "vllm::apply_w8a8_block_fp8_linear", "vllm::w8a8_block_fp8_matmul",
]
_QUANT_GEMMS_OUT = ["_C::cutlass_scaled_mm", "_C::cutlass_scaled_mm_azp",
                    "_C::cutlass_scaled_fp4_mm", "_C::cutlass_scaled_mm_blockwise"]


@register_formula(_QUANT_GEMMS_RETURNING, kind="matmul")
def quantized_gemm_flop(a_shape, *args, out_shape=None, **kwargs) -> Any:
    m, k, n = _mm_dims(out_shape, a_shape)
    return 2 * m * k * n


# out-variant linears: the output is the first argument, the activation the second
@register_formula(["_C::onednn_mm", "_C::onednn_scaled_mm", *_QUANT_GEMMS_OUT], kind="matmul")
def out_variant_mm_flop(c_shape, a_shape, *args, out_shape=None, **kwargs) -> Any:
    m, k, n = _mm_dims(c_shape, a_shape)
    return 2 * m * k * n


@register_bytes(["_C::onednn_mm"])
def onednn_mm_bytes(c, a, bias, handler) -> Any:
    m, k, n = _mm_dims(c.shape, a.shape)
    size = a.element_size()
    weight = k * n * size
    bias_bytes = bias.numel() * bias.element_size() if bias is not None else 0
    return (m * k + m * n) * size + weight + bias_bytes


@register_bytes(["_C::onednn_scaled_mm"])
def onednn_scaled_mm_bytes(c, a, a_scales, azp, azp_adj, bias, handler) -> Any:
    m, k, n = _mm_dims(c.shape, a.shape)
    # int8 weight, one byte an element
    return m * k * a.element_size() + m * n * c.element_size() + k * n


@register_formula("_C::rms_norm")
def rms_norm_flop(out_shape_arg, input_shape, *args, out_shape=None, **kwargs) -> Any:
    # square, mean, multiply by rsqrt, multiply by weight
    return 4 * _numel(input_shape)


@register_formula("_C::fused_add_rms_norm")
def fused_add_rms_norm_flop(input_shape, residual_shape, *args, out_shape=None, **kwargs) -> Any:
    # the residual add, then RMS norm
    return 5 * _numel(input_shape)


@register_formula(["_C::silu_and_mul", "_C::gelu_and_mul", "_C::gelu_tanh_and_mul",
                   "_C::gelu_fast", "_C::gelu_new", "_C::gelu_quick"])
def act_and_mul_flop(out_shape_arg, input_shape, *args, out_shape=None, **kwargs) -> Any:
    # activation + multiply: one FLOP each per output element (the vector convention)
    return 2 * _numel(out_shape_arg)


@register_formula("_C::rotary_embedding")
def rotary_embedding_flop(positions_shape, query_shape, key_shape, head_size, cos_sin_shape,
                          *args, out_shape=None, **kwargs) -> Any:
    # each rotated pair: 4 multiplies and 2 adds -> 3 FLOPs per rotated element
    rot_dim = cos_sin_shape[-1]
    heads = _numel(query_shape) // head_size
    if key_shape is not None:
        heads = heads + _numel(key_shape) // head_size
    return 3 * rot_dim * heads


def layer_name(value: Any) -> str | None:
    """vLLM passes a layer's name to its ops as a ``LayerName`` (or, before, a str); in a
    traced graph's metadata it is wrapped in a fake script object."""
    value = getattr(value, "real_obj", value)
    value = getattr(value, "value", value)
    return value if isinstance(value, str) else None


@register_formula(["vllm::unified_attention_with_output", "vllm::unified_attention"],
                  kind="matmul", runtime="attention", get_raw=True)
def unified_attention_cost(query, key, value, output=None, layer=None, *args, out_val=None,
                           **kwargs) -> RuntimeCost:
    """Per (query token, key token) pair: QK^T and PV, 2 FLOPs per multiply-add; per context
    token, the K and V the layer reads from the KV cache (in the model's dtype).

    The pairs and context tokens depend on the KV lengths of the requests in the batch, which
    are not in the graph: the vLLM integration counts them at each call, the layer's sliding
    window (if any) applied.
    """
    out = output if output is not None else out_val
    tokens = query.shape[0]
    q_per_token = query.numel() // tokens
    o_per_token = out.numel() // tokens if out is not None else q_per_token
    kv_per_token = (key.numel() + value.numel()) // tokens * key.element_size()
    return RuntimeCost(2 * q_per_token + 2 * o_per_token, kv_per_token, layer_name(layer))


@register_formula(["vllm::unified_mla_attention_with_output", "vllm::unified_mla_attention"],
                  kind="matmul", runtime="attention", get_raw=True)
def unified_mla_attention_cost(q, kv_c_normed, k_pe, output=None, layer=None, *args,
                               out_val=None, **kwargs) -> RuntimeCost:
    """MLA (DeepSeek), counted in the model's form, as vLLM's perf.py counts it: per token,
    the latent KV's up-projection to every head's K (no-RoPE part) and V,
    ``2·c·H·(d_nope + d_v)``; per pair, ``2·H·(d_nope + d_rope)`` for QK^T and ``2·H·d_v``
    for PV; per context token, the latent cache entry ``(c + d_rope)`` the layer reads. (The
    absorbed decode kernel reorders this arithmetic; the model's FLOPs are the same work.)
    """
    out = output if output is not None else out_val
    tokens, heads, qk_dim = q.shape[0], q.shape[1], q.shape[-1]
    latent, rope = kv_c_normed.shape[-1], k_pe.shape[-1]
    v_dim = out.numel() // (tokens * heads) if out is not None else qk_dim - rope
    nope = qk_dim - rope
    per_token_bytes = (latent + rope) * kv_c_normed.element_size()
    return RuntimeCost(2 * heads * qk_dim + 2 * heads * v_dim, per_token_bytes,
                       layer_name(layer), 2 * tokens * latent * heads * (nope + v_dim))


# collectives move data between ranks: communication, not compute (zero FLOPs here)
register_zero_flop("vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update",
                   "vllm::all_reduce", "vllm::all_gather", "vllm::reduce_scatter",
                   "_C::shm_allreduce", "_C::shm_gather", "_C::shm_all_gather",
                   "vllm::outplace_all_reduce", "vllm::inplace_all_reduce")


# --- mixture of experts ------------------------------------------------------------------
#
# A routed token goes through its top-k experts: per expert, the gate/up projection
# (H -> 2I when gated) and the down projection (I -> H), 2 FLOPs a multiply-add. Weight
# bytes: the experts the step's tokens can reach, ``min(tokens * top_k, experts)`` of them
# (every routed token on a different expert until all are used: perf.py's assumption; the
# real routing is on the device and is never read).


def _routed(tokens: Any, top_k: Any, experts: Any) -> Any:
    return torch.sym_min(tokens * top_k, experts)


@register_formula(["_C::cpu_fused_moe", "_C::cpu_fused_moe_int8"], kind="matmul", get_raw=True)
def cpu_fused_moe_flop(output, input, w13, w2, *args, out_val=None, **kwargs) -> Any:
    """vLLM's CPU MoE: w13 [E, 2I, H] (or [E, I, H] ungated), w2 [E, H, I], top-k ids
    [T, k] (the routing tensors are the args after the biases, or scales for int8)."""
    topk_ids = next(a for a in reversed(args) if isinstance(a, torch.Tensor))
    tokens, top_k, experts = input.shape[0], topk_ids.shape[-1], w13.shape[0]
    per_expert = (w13.numel() + w2.numel()) // experts
    return 2 * tokens * top_k * per_expert


@register_io_bytes(["_C::cpu_fused_moe", "_C::cpu_fused_moe_int8"])
def cpu_fused_moe_io_bytes(output, input, w13, w2, *args, **kwargs) -> Any:
    """The experts no token can reach this step are not read."""
    topk_ids = next(a for a in reversed(args) if isinstance(a, torch.Tensor))
    experts = w13.shape[0]
    unused = experts - _routed(input.shape[0], topk_ids.shape[-1], experts)
    weights = w13.numel() * w13.element_size() + w2.numel() * w2.element_size()
    return -unused * (weights // experts)


def _vllm_layer(name: Any) -> Any:
    """The vLLM module an op names (MoE layers keep their weights there, not in the op's
    arguments): looked up in the config vLLM compiles under."""
    from vllm.config import get_current_vllm_config

    layers = get_current_vllm_config().compilation_config.static_forward_context
    return layers[str(layer_name(name))]


def _moe_dims(layer: Any) -> tuple[int, int, int, int, bool]:
    """(top k, local experts, hidden, intermediate per partition, gated) of a FusedMoE."""
    experts = getattr(layer, "local_num_experts", None) or layer.global_num_experts
    gated = getattr(layer, "is_act_and_mul", True)
    return (layer.top_k, experts, layer.hidden_size, layer.intermediate_size_per_partition,
            gated)


def _linear_flops_per_token(module: Any) -> int:
    """2 x in x out summed over a module's linear layers (a MoE's shared experts)."""
    total = 0
    for sub in module.modules():
        n_in = getattr(sub, "input_size_per_partition", None)
        n_out = getattr(sub, "output_size_per_partition", None)
        if n_in is None or n_out is None:
            weight = getattr(sub, "weight", None)
            if not isinstance(sub, torch.nn.Linear) or weight is None:
                continue
            n_out, n_in = weight.shape
        total += 2 * int(n_in) * int(n_out)
    return total


@register_formula(["vllm::moe_forward"], kind="matmul", get_raw=True)
def moe_forward_flop(hidden_states, router_logits, shared_input=None, input_ids=None,
                     layer=None, *args, out_val=None, **kwargs) -> Any:
    """vLLM's MoE on a GPU: the weights live in the layer the op names. The routed experts
    of this rank (expert parallelism: a share ``local / global`` of the routed tokens)."""
    mod = _vllm_layer(layer)
    top_k, local, hidden, inter, gated = _moe_dims(mod)
    share = local / getattr(mod, "global_num_experts", local)
    per_routed = int(share * 2 * hidden * inter * (3 if gated else 2))
    return per_routed * hidden_states.shape[0] * top_k


@register_formula(["vllm::moe_forward_shared"], kind="matmul", get_raw=True)
def moe_forward_shared_flop(hidden_states, router_logits, shared_input=None, input_ids=None,
                            layer=None, *args, out_val=None, **kwargs) -> Any:
    """``moe_forward`` plus the shared experts, which this op runs beside the routed ones."""
    routed = moe_forward_flop(hidden_states, router_logits, shared_input, input_ids, layer)
    shared = getattr(_vllm_layer(layer), "shared_experts", None)
    per_token = _linear_flops_per_token(shared) if shared is not None else 0
    return routed + hidden_states.shape[0] * per_token


@register_io_bytes(["vllm::moe_forward", "vllm::moe_forward_shared"])
def moe_forward_io_bytes(hidden_states, router_logits, shared_input=None, input_ids=None,
                         layer=None, *args, **kwargs) -> Any:
    """The experts' weights are in the layer, not among the graph's inputs: the ones the
    step's tokens can reach are added (bytes per expert from the layer's own tensors)."""
    mod = _vllm_layer(layer)
    top_k, local, *_ = _moe_dims(mod)
    weights = sum(p.numel() * p.element_size() for name, p in mod.named_parameters()
                  if name.startswith(("w13_", "w2_")))
    return _routed(hidden_states.shape[0], top_k, local) * (weights // local)


@register_io_bytes(["_C::rotary_embedding"])
def rotary_embedding_io_bytes(positions, query, key, head_size, cos_sin_cache, *args,
                              **kwargs) -> Any:
    """The cos/sin cache is read at the tokens' positions, not whole."""
    rows = cos_sin_cache.shape[0]
    unread = rows - torch.sym_min(positions.numel(), rows)
    return -unread * cos_sin_cache.shape[-1] * cos_sin_cache.element_size()


@register_io_bytes(["vllm::unified_mla_attention_with_output", "vllm::unified_mla_attention"])
def unified_mla_attention_io_bytes(q, kv_c_normed, k_pe, output=None, *args, **kwargs) -> Any:
    """The up-projection of the latent KV (``kv_b_proj``: c -> H·(d_nope + d_v)) is applied
    inside the op from the layer's weight, which is no graph input: its bytes are added
    (in the activations' dtype)."""
    tokens, heads, qk_dim = q.shape[0], q.shape[1], q.shape[-1]
    nope = qk_dim - k_pe.shape[-1]
    v_dim = output.numel() // (tokens * heads) if output is not None else nope
    return kv_c_normed.shape[-1] * heads * (nope + v_dim) * kv_c_normed.element_size()
