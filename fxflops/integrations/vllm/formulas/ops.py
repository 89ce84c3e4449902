"""Formulas for vLLM's custom ops (``_C::*``, ``vllm::*``), registered by name.

Their conventions follow the aten ones: a multiply-add is 2 FLOPs, an elementwise op costs
one FLOP per element. Out-variant ops return nothing; their shapes come from the ``out``
argument.
"""

from __future__ import annotations

from fractions import Fraction
from math import prod
from typing import Any, NamedTuple

import torch

from fxflops.cost.graph_cost import RuntimeCost
from fxflops.cost.registry import PartialRead, register_bytes, register_formula, register_io_bytes
from fxflops.integrations.vllm.models import find_layer

# the graph ops whose formulas count the kernels that run inside them (``register_inside``:
# the attention and MoE backends' kernels, ``gpu`` and ``kernels``)
ATTENTION_OP = "vllm::unified_attention_with_output"
MLA_OP = "vllm::unified_mla_attention_with_output"
MOE_OP = "vllm::moe_forward"


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
    # CPU, x86 with AMX (sgl-kernels): the activation first, quantised inside the kernel
    "_C::int8_scaled_mm_with_quant", "_C::fp8_scaled_mm_cpu", "_C::fp8_scaled_mm_with_quant",
    "_C::int4_scaled_mm_cpu",
]
_QUANT_GEMMS_OUT = ["_C::cutlass_scaled_mm", "_C::cutlass_scaled_mm_azp",
                    "_C::cutlass_scaled_fp4_mm", "_C::cutlass_scaled_mm_blockwise"]
# CPU linears that write their first argument: oneDNN's; on x86 with AMX the SGL kernel a
# bf16/fp16 weight of at most 1 MiB goes to (vllm/model_executor/layers/utils.py,
# check_cpu_sgl_kernel), its weight VNNI-packed (or fp32 for N < 16: never read for the
# count); SGL's batched matmul (MLA's absorbed projections on AMX)
_CPU_GEMMS_OUT = ["_C::onednn_mm", "_C::onednn_scaled_mm", "_C::weight_packed_linear",
                  "_C::bmm_cpu"]


@register_formula(_QUANT_GEMMS_RETURNING, kind="matmul")
def quantized_gemm_flop(a_shape, *args, out_shape=None, **kwargs) -> Any:
    m, k, n = _mm_dims(out_shape, a_shape)
    return 2 * m * k * n


# out-variant linears: the output is the first argument, the activation the second
@register_formula([*_CPU_GEMMS_OUT, *_QUANT_GEMMS_OUT], kind="matmul")
def out_variant_mm_flop(c_shape, a_shape, *args, out_shape=None, **kwargs) -> Any:
    """``2·M·K·N`` (``bmm_cpu``: M counts every batch's rows, ``B·M``)."""
    m, k, n = _mm_dims(c_shape, a_shape)
    return 2 * m * k * n


@register_formula(["_C::cpu_gemm_wna16"], kind="matmul")
def cpu_gemm_wna16_flop(input_shape, q_weight_shape, output_shape, *args, out_shape=None,
                        **kwargs) -> Any:
    """CPU weight-only int4/int8 GEMM (GPTQ/AWQ on CPU): activation first, output third."""
    m, k, n = _mm_dims(output_shape, input_shape)
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


@register_formula(["_C::silu_and_mul", "_C::gelu_and_mul", "_C::gelu_tanh_and_mul"])
def act_and_mul_flop(out_shape_arg, input_shape, *args, out_shape=None, **kwargs) -> Any:
    # activation + multiply: one FLOP each per output element (the vector convention)
    return 2 * _numel(out_shape_arg)


@register_formula(["_C::gelu_fast", "_C::gelu_new", "_C::gelu_quick"])
def activation_flop(out_shape_arg, input_shape, *args, out_shape=None, **kwargs) -> Any:
    # an activation alone: one FLOP per output element
    return _numel(out_shape_arg)


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


# --- attention: the arithmetic, in one place --------------------------------------------
#
# Used by the graph's attention ops (below), by the whole-forward rows
# (``fxflops.integrations.vllm.forward``) and by the layer safety net
# (``fxflops.integrations.vllm.layers``), which read the same sizes off the layers.


def attention_flops_per_pair(heads: Any, qk_dim: Any, v_dim: Any) -> Any:
    """Per (query, key) pair: QK^T (``H·D_qk`` multiply-adds) and PV (``H·D_v``), 2 FLOPs a
    multiply-add."""
    return 2 * heads * qk_dim + 2 * heads * v_dim


def kv_bytes_per_token(kv_heads: Any, k_dim: Any, v_dim: Any, element_size: int) -> Any:
    """KV-cache bytes one context token costs a layer to read: its K and V."""
    return kv_heads * (k_dim + v_dim) * element_size


def mla_costs(heads: int, nope: int, rope: int, v_dim: int, latent: int,
              element_size: int) -> tuple[int, int]:
    """MLA per pair (QK^T over the no-RoPE and RoPE parts, PV) and per context token (the
    latent cache entry and its RoPE key)."""
    return (attention_flops_per_pair(heads, nope + rope, v_dim),
            (latent + rope) * element_size)


def kv_cache_bytes_per_token(layer: Any, vllm_config: Any) -> int | None:
    """Bytes one token's entry takes in ``layer``'s KV cache, as vLLM lays the cache out:
    the layer's own KV-cache spec (``get_kv_cache_spec``), its page over its block size.
    That is the cache's dtype (fp8 is half of bf16), with what a quantised mode packs beside
    the values (per-token-head scales, TurboQuant's split K/V widths, fp8_ds_mla's entry) and
    without a hybrid model's page padding. None where the layer has no spec to read."""
    get_spec = getattr(layer, "get_kv_cache_spec", None)
    if get_spec is None or vllm_config is None:
        return None
    try:
        spec = get_spec(vllm_config)
        page = getattr(spec, "real_page_size_bytes", None)
        if page is None:
            page = spec.page_size_bytes
        per_token = Fraction(int(page), int(spec.block_size))
    except Exception:  # a layer without a cache of its own (encoder), or a spec we cannot read
        return None
    # (a fraction: states pooled over tokens, an encoder's; the caller's per-value count)
    return int(per_token) if per_token.denominator == 1 else None


def attention_costs(layer: Any, element_size: int,
                    vllm_config: Any = None) -> tuple[int, int] | None:
    """(FLOPs per pair, KV-cache bytes per context token) of a vLLM attention layer, read
    off the layer (None: not an attention layer). The bytes are the cache's (its dtype and
    packing, ``kv_cache_bytes_per_token``) where ``vllm_config`` lets the layer say them,
    else ``element_size`` bytes a value."""
    heads = getattr(layer, "num_heads", None)
    if heads is None or not hasattr(layer, "impl"):
        return None
    if hasattr(layer, "kv_lora_rank"):  # MLA
        per_pair, per_token = mla_costs(
            int(heads), int(layer.qk_nope_head_dim), int(layer.qk_rope_head_dim),
            int(layer.v_head_dim), int(layer.kv_lora_rank), element_size)
    else:
        d = int(layer.head_size)
        dv = int(getattr(layer, "head_size_v", None) or d)
        per_pair = attention_flops_per_pair(int(heads), d, dv)
        per_token = kv_bytes_per_token(int(layer.num_kv_heads), d, dv, element_size)
    cache = kv_cache_bytes_per_token(layer, vllm_config)
    return per_pair, (per_token if cache is None else cache)


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
    # per token: H·D_qk of queries and H·D_v of output; the per-head sizes cancel
    per_pair = attention_flops_per_pair(1, q_per_token, o_per_token)
    kv_per_token = kv_bytes_per_token(1, key.numel() // tokens, value.numel() // tokens,
                                      key.element_size())
    return RuntimeCost(per_pair, kv_per_token, layer_name(layer))


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
    per_pair, per_token_bytes = mla_costs(heads, nope, rope, v_dim, latent,
                                          kv_c_normed.element_size())
    return RuntimeCost(per_pair, per_token_bytes, layer_name(layer),
                       2 * tokens * latent * heads * (nope + v_dim))


# (KV-cache updates and collectives are zero-FLOP: ``op_classes``)


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
    """The experts no token can reach this step are not read (of w13 and of w2)."""
    topk_ids = next(a for a in reversed(args) if isinstance(a, torch.Tensor))
    experts = w13.shape[0]
    unused = experts - _routed(input.shape[0], topk_ids.shape[-1], experts)
    return [PartialRead(2, unused * (w13.numel() // experts) * w13.element_size()),
            PartialRead(3, unused * (w2.numel() // experts) * w2.element_size())]


@register_io_bytes(["_C::onednn_mm"])
def onednn_mm_io_bytes(c, a, bias, handler) -> Any:
    """oneDNN's weight lives in its handle (the graph holds an 8-byte pointer): read whole,
    ``K x N`` in the activation's dtype."""
    m, k, n = _mm_dims(c.shape, a.shape)
    return k * n * a.element_size()


@register_io_bytes(["_C::onednn_scaled_mm"])
def onednn_scaled_mm_io_bytes(c, a, a_scales, azp, azp_adj, bias, handler) -> Any:
    """The int8 weight in the handle, one byte an element."""
    m, k, n = _mm_dims(c.shape, a.shape)
    return k * n


def vllm_layer(name: Any) -> Any:
    """The vLLM module an op names (MoE and state-space layers keep their weights and sizes
    there, not in the op's arguments): ``models.find_layer``, the integration's lookup."""
    return find_layer(str(layer_name(name)))


class MoEDims(NamedTuple):
    top_k: int
    local_experts: int
    global_experts: int
    hidden: int
    intermediate: int  # per partition (tensor parallelism)
    gated: bool  # gate and up projections (H -> 2I), as SiLU-and-mul

    @property
    def share(self) -> float:
        """This rank's share of the routed tokens (expert parallelism: local / global)."""
        return self.local_experts / (self.global_experts or self.local_experts)


def moe_dims(layer: Any) -> MoEDims | None:
    """The sizes of a vLLM MoE layer: a ``MoERunner`` (vLLM 0.32 on; its sizes in
    ``moe_config``, its weights in ``routed_experts``) or an older ``FusedMoE`` (sizes on
    the layer). None: neither."""
    cfg = getattr(layer, "moe_config", None)
    if cfg is not None and hasattr(cfg, "experts_per_token"):
        activation = getattr(cfg, "activation", None)
        gated = bool(getattr(activation, "is_gated", True))
        inter = getattr(cfg, "intermediate_size_per_partition", -1)
        if inter is None or inter < 0:
            inter = cfg.intermediate_size
        return MoEDims(int(cfg.experts_per_token),
                       int(cfg.num_local_experts or cfg.num_experts), int(cfg.num_experts),
                       int(cfg.hidden_dim), int(inter), gated)
    if hasattr(layer, "top_k") and hasattr(layer, "intermediate_size_per_partition"):
        global_experts = int(getattr(layer, "global_num_experts", 0) or 0)
        local = int(getattr(layer, "local_num_experts", 0) or global_experts)
        return MoEDims(int(layer.top_k), local, global_experts or local,
                       int(layer.hidden_size), int(layer.intermediate_size_per_partition),
                       bool(getattr(layer, "is_act_and_mul", True)))
    return None


def moe_dp_size(layer: Any) -> int:
    """The data-parallel ranks a vLLM MoE layer's op dispatches tokens from (1: none)."""
    cfg = getattr(getattr(layer, "moe_config", None), "moe_parallel_config", None) \
        or getattr(layer, "moe_parallel_config", None)
    return int(getattr(cfg, "dp_size", 1) or 1)


def moe_weights(layer: Any) -> int:
    """Bytes of a MoE layer's routed experts' weights (``w13_*`` and ``w2_*`` tensors, on
    the layer or its ``routed_experts``)."""
    holder = getattr(layer, "routed_experts", None) or layer
    return sum(p.numel() * p.element_size() for name, p in holder.named_parameters()
               if name.split(".")[-1].startswith(("w13_", "w2_")))


def _moe_layer_dims(name: Any) -> MoEDims:
    dims = moe_dims(vllm_layer(name))
    if dims is None:
        raise TypeError(f"layer {layer_name(name)} has no MoE sizes fxflops knows")
    return dims


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


# the run-time kind of a MoE's routed experts: the tokens the other data-parallel ranks
# send them (vLLM gathers every DP rank's tokens inside the op)
DP_TOKENS = "dp_tokens"


@register_formula(["vllm::moe_forward"], kind="matmul", get_raw=True, runtime=DP_TOKENS)
def moe_forward_flop(hidden_states, router_logits, shared_input=None, input_ids=None,
                     layer=None, *args, out_val=None, **kwargs) -> RuntimeCost:
    """vLLM's MoE on a GPU: the weights live in the layer the op names. The routed experts
    of this rank, per token routed to them: ``top_k`` experts of ``2·H·I·3`` (gated), a
    share ``local / global`` of them under expert parallelism (the expectation under
    balanced routing: which experts a token picks is data), with ``I`` this rank's
    partition (data x tensor parallel, ``FusedMoEParallelConfig``).

    Statically, this rank's own tokens. Under data parallelism the op dispatches every DP
    rank's tokens to the experts (an all-gather, or an all-to-all to the experts' ranks):
    the other ranks' tokens (``dp_metadata.num_tokens_across_dp_cpu``, a host tensor vLLM
    keeps per step) are counted at run time, at the same FLOPs per token."""
    mod = vllm_layer(layer)
    dims = _moe_layer_dims(layer)
    per_routed = int(dims.share * 2 * dims.hidden * dims.intermediate * (3 if dims.gated else 2))
    per_token = per_routed * dims.top_k
    # (no data parallelism: nothing to add at run time, a static node)
    gathered = per_token if moe_dp_size(mod) > 1 else 0
    return RuntimeCost(gathered, 0, layer_name(layer), per_token * hidden_states.shape[0])


@register_formula(["vllm::moe_forward_shared"], kind="matmul", get_raw=True, runtime=DP_TOKENS)
def moe_forward_shared_flop(hidden_states, router_logits, shared_input=None, input_ids=None,
                            layer=None, *args, out_val=None, **kwargs) -> RuntimeCost:
    """``moe_forward`` plus the shared experts, which this op runs beside the routed ones, on
    this rank's own tokens (before the dispatch)."""
    routed = moe_forward_flop(hidden_states, router_logits, shared_input, input_ids, layer)
    mod = vllm_layer(layer)
    shared = getattr(mod, "shared_experts", None)
    if shared is None:  # a MoERunner wraps them in its SharedExperts
        wrapped = getattr(mod, "_shared_experts", None)
        shared = getattr(wrapped, "shared_experts", None) or getattr(wrapped, "_module", None) \
            or wrapped
    per_token = _linear_flops_per_token(shared) if isinstance(shared, torch.nn.Module) else 0
    return routed._replace(static_flops=routed.static_flops + hidden_states.shape[0] * per_token)


@register_io_bytes(["vllm::moe_forward", "vllm::moe_forward_shared"])
def moe_forward_io_bytes(hidden_states, router_logits, shared_input=None, input_ids=None,
                         layer=None, *args, **kwargs) -> Any:
    """The experts' weights are in the layer, not among the graph's inputs: the ones the
    step's tokens can reach are added (bytes per expert from the layer's own tensors)."""
    mod = vllm_layer(layer)
    dims = _moe_layer_dims(layer)
    local = dims.local_experts
    return _routed(hidden_states.shape[0], dims.top_k, local) * (moe_weights(mod) // local)


@register_io_bytes(["_C::rotary_embedding"])
def rotary_embedding_io_bytes(positions, query, key, head_size, cos_sin_cache, *args,
                              **kwargs) -> Any:
    """The cos/sin cache is read at the tokens' positions, not whole (the layers share
    one: taken off once)."""
    rows = cos_sin_cache.shape[0]
    unread = rows - torch.sym_min(positions.numel(), rows)
    return PartialRead(4, unread * cos_sin_cache.shape[-1] * cos_sin_cache.element_size())


@register_io_bytes(["vllm::unified_mla_attention_with_output", "vllm::unified_mla_attention"])
def unified_mla_attention_io_bytes(q, kv_c_normed, k_pe, output=None, *args, **kwargs) -> Any:
    """The up-projection of the latent KV (``kv_b_proj``: c -> H·(d_nope + d_v)) is applied
    inside the op from the layer's weight, which is no graph input: its bytes are added
    (in the activations' dtype)."""
    tokens, heads, qk_dim = q.shape[0], q.shape[1], q.shape[-1]
    nope = qk_dim - k_pe.shape[-1]
    v_dim = output.numel() // (tokens * heads) if output is not None else nope
    return kv_c_normed.shape[-1] * heads * (nope + v_dim) * kv_c_normed.element_size()
