"""Formulas for vLLM's custom ops (``_C::*``, ``vllm::*``), registered by name.

Their conventions follow the aten ones: a multiply-add is 2 FLOPs, an elementwise op costs
one FLOP per element. Out-variant ops return nothing; their shapes come from the ``out``
argument.
"""

from __future__ import annotations

from math import prod
from typing import Any

from fxflops.registry import register_bytes, register_formula, register_zero_flop


def _numel(shape: Any) -> Any:
    return prod(shape)


def _mm_dims(c_shape: Any, a_shape: Any) -> tuple[Any, Any, Any]:
    """(M, K, N) of a linear whose weight is hidden in a handle: K from ``a``, N from ``c``."""
    k = a_shape[-1]
    n = c_shape[-1]
    m = _numel(a_shape) // k
    return m, k, n


@register_formula(["_C::onednn_mm", "_C::onednn_scaled_mm"], kind="matmul")
def onednn_mm_flop(c_shape, a_shape, *args, out_shape=None, **kwargs) -> Any:
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


@register_formula(["vllm::unified_attention_with_output", "vllm::unified_attention"],
                  kind="matmul", runtime="attention")
def unified_attention_pair_flop(query_shape, key_shape, value_shape, output_shape=None, *args,
                                out_shape=None, **kwargs) -> Any:
    """FLOPs per (query token, key token) pair: QK^T and PV, 2 FLOPs per multiply-add.

    The number of pairs depends on the KV lengths of the requests in the batch, which are
    not in the graph: the vLLM integration multiplies this by the pairs of each call.
    """
    tokens = query_shape[0]
    q_per_token = _numel(query_shape) // tokens
    out = output_shape if output_shape is not None else out_shape
    o_per_token = _numel(out) // tokens if out is not None else q_per_token
    return 2 * q_per_token + 2 * o_per_token


# collectives move data between ranks: communication, not compute (zero FLOPs here)
register_zero_flop("vllm::unified_kv_cache_update",
                   "vllm::all_reduce", "vllm::all_gather", "vllm::reduce_scatter",
                   "_C::shm_allreduce", "_C::shm_gather", "_C::shm_all_gather",
                   "vllm::outplace_all_reduce", "vllm::inplace_all_reduce")
