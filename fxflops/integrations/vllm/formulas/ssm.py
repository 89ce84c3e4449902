"""Formulas for state-space and linear-attention layers (hybrid models): Mamba2's selective
scan, Gated DeltaNet, and the causal depthwise conv in front of both.

Counted in the **recurrent form, per token**, from the published algorithms:

- Mamba2 (Dao & Gu 2024, "Transformers are SSMs"), per head of ``P`` channels and state
  ``N``: ``h <- exp(dt·A)·h + (dt·x) ⊗ B`` and ``y = h·C + D·x``;
- Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024), per value head with state ``V x K``:
  ``S <- α·S``, ``u = S·k``, ``S <- S + β(v - u) ⊗ k``, ``o = S·q``.

The recurrent form is the model's work: prefill and decode cost the same per token, and the
count does not depend on where the scheduler cut a prompt. Chunked kernels (the GPU's, and
the CPU's gated-delta-rule prefill) re-associate the same recurrence into matmuls and do
more arithmetic (about 1.25x for Mamba2, 1.6-2.3x for Gated DeltaNet): that is the kernel's
choice, not counted here (as recomputation is hardware FLOPs, not model FLOPs).

Classes: the state products (the outer-product accumulation, ``S·k``, ``S·q``, ``h·C``) and
the conv's taps are *matmul* FLOPs, as attention's two products are; decay, gating,
softplus, sigmoid, exp, L2 norms, SiLU and skips are *vector* FLOPs, one per element per
step. A multiply-add is 2 FLOPs; an outer product ``a ⊗ b`` accumulated into a state is a
matmul of inner size 1 (``2·|a|·|b|``).

The graph ops vLLM compiles are opaque (``vllm::mamba_mixer2``, ``vllm::*gdn_attention_core``):
they take the token activations and a layer name, and the sizes come from the layer vLLM
registered under that name. The kernels they call (``_C::*_cpu``) are costed from their own
shapes too, should a graph ever hold them.
"""

from __future__ import annotations

from typing import Any

from fxflops.cost.registry import Split, register_formula
from fxflops.integrations.vllm.formulas.ops import vllm_layer

# --- the per-token arithmetic (matmul FLOPs, vector FLOPs) -------------------------------


def conv1d_per_token(channels: Any, width: Any, bias: bool, silu: bool) -> Split:
    """A causal depthwise conv: ``width`` multiply-adds per channel; bias and SiLU one
    FLOP each per channel."""
    return Split(2 * width * channels, channels * (int(bias) + int(silu)))


def mamba2_scan_per_token(heads: Any, head_dim: Any, state: Any, d_skip: bool = True,
                          z_gate: bool = False, dt_bias_softplus: bool = False) -> Split:
    """Mamba2's selective state update for one token.

    matmul: the outer product ``(dt·x) ⊗ B`` accumulated into ``h`` and the readout
    ``h·C``: ``2·P·N`` each per head. vector: the decay ``exp(dt·A)·h`` (``P·N``), ``dt·x``
    (``P``), ``dt·A`` and its exp (2) per head; the ``D·x`` skip (2 per channel); a ``z`` gate
    (SiLU and multiply, 2 per channel); the ``dt`` bias and softplus (2 per head).
    """
    matmul = 4 * heads * head_dim * state
    vector = heads * (head_dim * state + head_dim + 2)
    if d_skip:
        vector += 2 * heads * head_dim
    if z_gate:
        vector += 2 * heads * head_dim
    if dt_bias_softplus:
        vector += 2 * heads
    return Split(matmul, vector)


def delta_rule_per_token(v_heads: Any, k_dim: Any, v_dim: Any) -> Split:
    """Gated DeltaNet's recurrent step for one token, per value head: ``S·k``, the update
    ``β(v - u) ⊗ k`` and ``S·q`` are ``2·K·V`` each (matmul); the decay ``α·S`` (``K·V``),
    ``v - u`` and its ``β`` scaling (``2·V``) and ``α = exp(g)`` (1) are vector."""
    return Split(6 * v_heads * k_dim * v_dim, v_heads * (k_dim * v_dim + 2 * v_dim + 1))


def gdn_gating_per_token(v_heads: Any) -> Split:
    """``g = -exp(A_log)·softplus(a + dt_bias)`` (4) and ``β = sigmoid(b)`` (1) per head."""
    return Split(0, 5 * v_heads)


def qk_l2norm_per_token(k_heads: Any, k_dim: Any) -> Split:
    """L2-normalising q and k (square, sum, divide: 3 per element each) and scaling q by
    ``1/√K`` (1 per element)."""
    return Split(0, 7 * k_heads * k_dim)


def gdn_layer_per_token(k_heads: Any, v_heads: Any, k_dim: Any, v_dim: Any, width: Any,
                        conv_bias: bool) -> Split:
    """A Gated DeltaNet layer's core (what vLLM's ``gdn_attention_core`` ops run): the conv
    over q, k and v (``2·H_k·K + H_v·V`` channels, SiLU), gating, q/k norms, delta rule."""
    channels = 2 * k_heads * k_dim + v_heads * v_dim
    return (conv1d_per_token(channels, width, conv_bias, True)
            .plus(gdn_gating_per_token(v_heads))
            .plus(qk_l2norm_per_token(k_heads, k_dim))
            .plus(delta_rule_per_token(v_heads, k_dim, v_dim)))


def mamba2_layer_per_token(heads: Any, head_dim: Any, state: Any, groups: Any, width: Any,
                           conv_bias: bool) -> Split:
    """A Mamba2 mixer's core (what ``vllm::mamba_mixer2`` runs): the conv over x, B and C
    (``H·P + 2·G·N`` channels, SiLU), ``dt``'s bias and softplus, the scan with its ``D``
    skip (the gated norm and the projections are graph ops of their own)."""
    channels = heads * head_dim + 2 * groups * state
    return conv1d_per_token(channels, width, conv_bias, True).plus(
        mamba2_scan_per_token(heads, head_dim, state, d_skip=True, dt_bias_softplus=True))


def _has_bias(layer: Any) -> bool:
    conv = getattr(layer, "conv1d", None)
    return getattr(conv, "bias", None) is not None


def _width(layer: Any) -> int:
    width = getattr(layer, "conv_kernel_size", None)
    if width is None:
        width = layer.conv1d.weight.shape[-1]
    return int(width)


def _ssm(names: list[str]) -> Any:
    """Register a named formula returning a Split (both classes)."""
    return register_formula(names, kind="matmul", named=True)


# --- vLLM's opaque layer ops --------------------------------------------------------------


@_ssm(["vllm::mamba_mixer2"])
def mamba_mixer2_flops(a: dict[str, Any]) -> Split:
    """``projected_states`` [T, z (I) | x, B, C (I + 2·G·N) | dt (H)] of this rank, ``output``
    [T, I]; head size, state size and conv width from the ``MambaMixer2`` layer."""
    layer = vllm_layer(a["layer_name"])
    head_dim, state = int(layer.head_dim), int(layer.ssm_state_size)
    projected, inner = a["projected_states"], a["output"].shape[-1]
    tokens, heads = projected.shape[0], inner // head_dim
    groups = (projected.shape[-1] - 2 * inner - heads) // (2 * state)
    return mamba2_layer_per_token(heads, head_dim, state, groups, _width(layer),
                                  _has_bias(layer)).times(tokens)


@_ssm(["vllm::cpu_gdn_attention_core", "vllm::qwen_gdn_attention_core",
       "vllm::qwen_gdn_attention_core_fused_norm_packed", "vllm::gdn_attention_core_xpu"])
def gdn_attention_core_flops(a: dict[str, Any]) -> Split:
    """Gated DeltaNet's layer core (Qwen3-Next): tokens and this rank's value heads from
    ``core_attn_out`` [T, H_v, V]; key heads, head sizes and conv width from the layer."""
    layer = vllm_layer(a["layer_name"])
    out = a["core_attn_out"]
    tokens, v_heads = out.shape[0], out.shape[1]
    k_dim, v_dim = int(layer.head_k_dim), int(layer.head_v_dim)
    k_heads = v_heads * int(layer.num_k_heads) // int(layer.num_v_heads)
    return gdn_layer_per_token(k_heads, v_heads, k_dim, v_dim, _width(layer),
                               _has_bias(layer)).times(tokens)


# --- the kernels, from their own shapes ---------------------------------------------------


@_ssm(["_C::mamba_chunk_scan_fwd_cpu"])
def mamba_chunk_scan_flops(a: dict[str, Any]) -> Split:
    """x [T, H, P], B/C [T, G, N]: the scan of T tokens (the CPU kernel is a sequential
    per-token recurrence; ``dt`` arrives biased and softplus'd)."""
    x = a["x"]
    return mamba2_scan_per_token(x.shape[1], x.shape[2], a["B"].shape[-1],
                                 d_skip=a.get("D") is not None,
                                 z_gate=a.get("z") is not None).times(x.shape[0])


@_ssm(["_C::selective_state_update_cpu"])
def selective_state_update_flops(a: dict[str, Any]) -> Split:
    """One step per token: heads, head size and state size from ``state`` [slots, H, P, N]
    (``dt``, ``A``, ``D`` arrive as broadcast views), the tokens from ``x`` [T, H, P]."""
    state = a["state"]
    heads, head_dim, size = state.shape[-3], state.shape[-2], state.shape[-1]
    tokens = a["x"].numel() // (heads * head_dim)
    return mamba2_scan_per_token(heads, head_dim, size, d_skip=a.get("D") is not None,
                                 z_gate=a.get("z") is not None,
                                 dt_bias_softplus=bool(a.get("dt_softplus"))).times(tokens)


def _qkv_heads(a: dict[str, Any], q: str, v: str) -> tuple[Any, Any, Any, Any, Any]:
    """(tokens, key heads, K, value heads, V) of q/k [.., T, H_k, K] and v [.., T, H_v, V]
    (``head_first``: [.., H, T, D])."""
    query, value = a[q], a[v]
    if a.get("head_first"):
        k_heads, v_heads = query.shape[-3], value.shape[-3]
    else:
        k_heads, v_heads = query.shape[-2], value.shape[-2]
    k_dim, v_dim = query.shape[-1], value.shape[-1]
    return query.numel() // (k_heads * k_dim), k_heads, k_dim, v_heads, v_dim


@_ssm(["_C::chunk_gated_delta_rule_cpu"])
def chunk_gated_delta_rule_flops(a: dict[str, Any]) -> Split:
    """The delta rule over q/k [B, T, H_k, K], v [B, T, H_v, V] (and the q/k norms when
    the kernel does them), counted per token in the recurrent form."""
    tokens, k_heads, k_dim, v_heads, v_dim = _qkv_heads(a, "query", "value")
    per_token = delta_rule_per_token(v_heads, k_dim, v_dim)
    if a.get("use_qk_l2norm_in_kernel"):
        per_token = per_token.plus(qk_l2norm_per_token(k_heads, k_dim))
    return per_token.times(tokens)


@_ssm(["_C::fused_sigmoid_gating_delta_rule_update_cpu",
       "_C::fused_sigmoid_gating_delta_rule_update_spec_cpu"])
def fused_delta_rule_update_flops(a: dict[str, Any]) -> Split:
    """Gating, (norms) and one recurrent step per token of q/k [.., H_k, K], v [.., H_v, V]."""
    tokens, k_heads, k_dim, v_heads, v_dim = _qkv_heads(a, "q", "v")
    per_token = delta_rule_per_token(v_heads, k_dim, v_dim).plus(gdn_gating_per_token(v_heads))
    if a.get("use_qk_l2norm_in_kernel"):
        per_token = per_token.plus(qk_l2norm_per_token(k_heads, k_dim))
    return per_token.times(tokens)


@_ssm(["_C::fused_gdn_gating_cpu"])
def fused_gdn_gating_flops(a: dict[str, Any]) -> Split:
    """a/b [T, H_v]: the gates, per token and head."""
    return Split(0, 5 * a["a"].numel())


def _conv(x: Any, weight: Any, bias: Any, silu: bool) -> Split:
    """A depthwise conv of ``x`` (tokens x channels, either layout) with ``weight``
    [D_c, W]: per token and channel."""
    channels, width = weight.shape[0], weight.shape[-1]
    return conv1d_per_token(channels, width, bias is not None, silu).times(
        x.numel() // channels)


@_ssm(["_C::causal_conv1d_fwd_cpu"])
def causal_conv1d_fwd_flops(a: dict[str, Any]) -> Split:
    return _conv(a["x"], a["weight"], a.get("bias"), bool(a.get("silu_activation")))


@_ssm(["_C::causal_conv1d_update_cpu"])
def causal_conv1d_update_flops(a: dict[str, Any]) -> Split:
    return _conv(a["x"], a["weight"], a.get("bias"), bool(a.get("silu_activation")))


@_ssm(["_C::causal_conv1d_update_cpu_vec"])
def causal_conv1d_update_vec_flops(a: dict[str, Any]) -> Split:
    return _conv(a["x"], a["weight"], a.get("bias"), a.get("activation") in ("silu", "swish"))
