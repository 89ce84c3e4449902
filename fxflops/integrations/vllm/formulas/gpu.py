"""Formulas of vLLM's GPU kernels (CUDA, ROCm, XPU) and of the vLLM ops around them.

One table line per op, grouped by family (``fxflops.cost.formulas.builders``; the sizes a
line names are the op's arguments by schema name, ``"out"`` its return value). Every op
here is one vLLM 0.32 or 0.33 may leave in a compiled graph; the kernels that only ever
run *inside* another graph op are in :data:`INSIDE` instead (their work is that op's
count, so a formula for them would never be used, or would count the work twice).
:data:`UNCOSTABLE` lists the few ops no formula here covers, and why.

Conventions (docs/conventions.md): a multiply-add is 2 FLOPs; a GEMM is ``2·M·K·N``
matmul FLOPs with ``M`` the activation's rows and ``K`` its width (never a packed
weight's; a packed fp4 activation holds two values a byte), ``N`` from the output or a
weight; quantising an activation moves bytes and costs no FLOPs; elementwise 1 per
element, activation-and-multiply 2 per output element, RMS norm 4 (3 without a weight),
fused add + RMS norm 5, layer norm 7, rotary embedding 3 per rotated element. State-space
and linear-attention layers are counted in the recurrent form per token, as
``fxflops.integrations.vllm.formulas.ssm`` counts them.
"""

from __future__ import annotations

from math import prod
from typing import Any

from fxflops.cost.formulas.builders import (
    OUT_N,
    SOFTMAX,
    Builder,
    Named,
    Size,
    arg,
    attention,
    dim,
    gemm,
    numel,
    per_element,
    register,
    rope,
    rows,
    tensor,
)
from fxflops.cost.graph_cost import RuntimeCost
from fxflops.cost.registry import Split, register_inside, register_uncostable
from fxflops.integrations.vllm.formulas.mhc import hc_collapse, hc_head, hc_post, mhc_pre, post_then
from fxflops.integrations.vllm.formulas.ops import (
    ATTENTION_OP,
    MLA_OP,
    MOE_OP,
    layer_name,
    moe_dims,
    vllm_layer,
)
from fxflops.integrations.vllm.formulas.ssm import (
    _has_bias,
    _width,
    conv1d_per_token,
    delta_rule_per_token,
    gdn_layer_per_token,
    mamba2_scan_per_token,
    qk_l2norm_per_token,
)

# --- sizes and builders this table needs beyond cost.formulas.builders ----------------



def fp4(name: str) -> Size:
    """``K`` of a packed fp4 activation: two values a byte."""
    return dim(name, -1, 2)


def fp4_if(name: str, scales: str) -> Size:
    """``K`` of an activation that arrives packed in fp4 when its scales come with it
    (else the op quantises it inside, from its unpacked width)."""
    return lambda a: tensor(a, name).shape[-1] * (2 if a.get(scales) is not None else 1)


def by_position(names: str, builder: Builder) -> Builder:
    """For C++ kernels whose schema no vLLM wheel ships (``_xpu_C``, ``_rocm_C``'s RDNA
    kernels, ``aiter``, ``oink``, ``fbgemm``): read the arguments by position, named as
    vLLM's call site names them, so that a schema spelling other names still counts."""
    keys = names.split()

    def formula(a: Named) -> Any:
        # the arguments in schema order (an argument named "out" holds the return value)
        return builder({**dict(zip(keys, a.values())), "out": a["out"]})

    return formula


def total(*builders: Builder) -> Builder:
    """The sum of several builders' counts (of one class)."""
    return lambda a: sum(b(a) for b in builders)


def rms_norm(of: str, weight: str | None = None, add: bool = False) -> Builder:
    """RMS norm: square, sum, scale (3 per element), times the weight (1, when there is
    one); a fused residual add first (1)."""

    def formula(a: Named) -> Any:
        per = 3 + int(weight is None or a.get(weight) is not None) + int(add)
        return per * tensor(a, of).numel()

    return formula


def and_mul(of: str) -> Builder:
    """Activation and multiply of ``of`` = [gate | up]: 2 per output element, the output
    half of ``of``'s width (so one per element of ``of``)."""
    return per_element(1, of)


def hadamard(x: str, rotation: str) -> Builder:
    """A block Hadamard rotation of ``x`` (FP-Quant, before fp4 quantisation): ``x`` in
    rows of ``R`` times the ``R x R`` matrix, ``2·numel·R``."""
    return lambda a: 2 * tensor(a, x).numel() * tensor(a, rotation).shape[0]


def einsum(expr: str = "expr", a_name: str = "a", b_name: str = "b") -> Builder:
    """DeepGEMM's einsum: 2 FLOPs per point of the product of every index's extent
    (``"bhr,hdr->bhd"``: ``2·B·H·R·D``)."""

    def formula(a: Named) -> Any:
        lhs = str(a[expr]).replace(" ", "").split("->")[0]
        spec_a, spec_b = lhs.split(",")
        extent: dict[str, Any] = {}
        for spec, t in ((spec_a, tensor(a, a_name)), (spec_b, tensor(a, b_name))):
            for letter, size in zip(spec, t.shape):
                extent.setdefault(letter, size)
        return 2 * prod(extent.values())

    return formula


def k_grouped(packed: bool = False) -> Builder:
    """DeepGEMM's K-grouped GEMM (weight-gradient style): ``d`` [G, M, N], the groups'
    K summed: ``sum(ks_cpu)`` when given, else the activation's extent (``a`` holds
    ``M·ΣK`` values in either orientation, two a byte when fp4)."""

    def formula(a: Named) -> Any:
        d = tensor(a, "d")
        ks = a.get("ks_cpu")
        if ks is not None:
            return 2 * d.shape[-2] * d.shape[-1] * sum(ks)
        return 2 * tensor(a, "a").numel() * (2 if packed else 1) * d.shape[-1]

    return formula


def qk_norm_rope(q_width: Size, k_width: Size, head: Size, rot: Size) -> Builder:
    """Per-head RMS norm of q and k (4 per element) and rotary embedding of their first
    ``rot`` dimensions (3 per rotated element): ``q_width``/``k_width`` are the elements
    of q and k over all tokens, ``head`` the head size."""

    def formula(a: Named) -> Any:
        elements = q_width(a) + k_width(a)
        return 4 * elements + 3 * rot(a) * (elements // head(a))

    return formula


def hpc_rope_norm(a: Named) -> Any:
    """``vllm::hpc_rope_norm_forward`` (HunYuan V3 with the HPC attention backend): RoPE
    and per-head RMS norm of q and k (the KV-cache write and q's fp8 quantisation are
    bytes). qkv [T, (H_q + 2·H_k)·D], output [T, H_q·D]. The model rotates whole heads
    (``get_rope(head_dim)``), so rope is 3 FLOPs an element, like the norm's 4, and the
    head size (the layer's) cancels out."""
    q_width = tensor(a, "output").numel()
    k_width = (tensor(a, "qkv").numel() - q_width) // 2
    return (4 + 3) * (q_width + k_width)


# --- attention-like ops ------------------------------------------------------------------


def vit_attention(q: str = "q", out: str = "out", seqlens: str = "cu_seqlens") -> Builder:
    """A vision-encoder attention wrapper: non-causal, per sequence. A fixed-length batch
    (``q`` [B, S, H, D], no ``cu_seqlens``) is counted statically: ``2·B·H·S²·(D + D_v)``.
    Packed sequences of different lengths (``cu_seqlens``, device data) are counted at
    run time like the decoder's attention, per (query, key) pair, so the pairs are then
    the decoder batch's, not the images': an approximation."""
    per_pair = attention(q, out)

    def formula(a: Named) -> RuntimeCost:
        query = tensor(a, q)
        if a.get(seqlens) is None and query.dim() == 4:
            batch, seq, heads, d = query.shape
            dv = tensor(a, out).shape[-1]
            return RuntimeCost(0, 0, None, 2 * batch * heads * seq * seq * (d + dv))
        return per_pair(a)

    return formula


def indexer_logits(q: str = "q_quant", head_dim: str = "head_dim",
                   cache: str = "kv_cache") -> Builder:
    """DeepSeek-V3.2's lightning indexer: per (query, key) pair each index head's q·k,
    ``2·H_i·D_i``, counted at run time from the step's causal pairs like attention (its
    ReLU, head weights and sum, ``3·H_i`` a pair, are left out: about 1 %); per context
    token, the key's cache entry (``kv_cache`` [blocks, block size, bytes])."""

    def formula(a: Named) -> RuntimeCost:
        heads = tensor(a, q).shape[-2]
        kv = tensor(a, cache)
        per_token = kv.numel() // (kv.shape[0] * kv.shape[1]) * kv.element_size()
        return RuntimeCost(2 * heads * a[head_dim], per_token)

    return formula


def topk_attention(q: str, topk: Size, dv: Size) -> Builder:
    """Sparse attention over at most ``topk`` selected keys a query (DeepSeek-V3.2/V4's
    indices, Qwen4's QSA): ``2·H·(D_qk + D_v)`` per selected pair, as matmul FLOPs, an
    upper bound (a query early in a sequence has fewer keys than ``topk``)."""

    def formula(a: Named) -> Any:
        query = tensor(a, q)
        heads, d = query.shape[-2], query.shape[-1]
        n_tokens = query.numel() // (heads * d)
        return 2 * heads * (d + dv(a)) * n_tokens * topk(a)

    return formula


def flashmla_mega(a: Named) -> Split:
    """FlashMLA's fused DeepSeek-V4.1 attention (q norm, rope, sparse attention over the
    ``indices``, the output's inverse rope): q [T, H, D], ``indices`` [.., T, K] (and the
    extra KV's ``extra_indices``), V of ``d_v``."""
    q = tensor(a, "q")
    heads, d = q.shape[-2], q.shape[-1]
    n_tokens = q.numel() // (heads * d)
    topk = tensor(a, "indices").shape[-1]
    if a.get("extra_indices") is not None:
        topk = topk + tensor(a, "extra_indices").shape[-1]
    matmul = 2 * heads * (d + a["d_v"]) * n_tokens * topk
    vector = 2 * 3 * a["rope_dim"] * heads * n_tokens  # rope of q, inverse rope of out
    if a.get("enable_q_norm"):
        vector = vector + 4 * q.numel()
    return Split(matmul, vector)


# --- mHC: the builders are ``mhc``'s; AITER's split-k pre gate is this build's own ------


def mhc_pre_mix(a: Named) -> Split:
    """The pre gate recovered from AITER's split-k projection ``gemm_out`` [splitk, T,
    hc·(2 + hc)]: the split-k sum of the first hc columns and of ``sqrsum``, then each
    gate's RMS scale, scale, bias, sigmoid and epsilon (5)."""
    splitk, n_tokens = tensor(a, "gemm_out").shape[0], tensor(a, "gemm_out").shape[1]
    hc = a["hc_mult"]
    return Split(0, n_tokens * (splitk * (hc + 1) + 5 * hc))


# --- layer ops: sizes from the vLLM layer the op names -----------------------------------
#
# Counted like ``ssm`` counts vllm::mamba_mixer2: the recurrent form per token; the
# projections an op runs inside itself are GEMMs (these ops, unlike mamba_mixer2, take the
# hidden states and write the layer's output).


def _linear(n_in: Any, n_out: Any) -> Split:
    return Split(2 * n_in * n_out, 0)


def mamba1_per_token(hidden: int, inner: int, state: int, rank: int, width: int,
                     conv_bias: bool, dt_norms: bool) -> Split:
    """A Mamba-1 layer (``MambaMixer``) for one token on this rank (``inner`` channels):
    in_proj (H -> 2·D_i), the conv over x (SiLU), x_proj (D_i -> R + 2N, RMS norms of
    dt, B, C when the model has them), dt_proj (R -> D_i), the selective scan, out_proj.

    The scan is Mamba2's with one channel a head (P = 1): per channel ``4·N`` matmul (the
    outer product into the state and the readout) and ``N + 3`` vector, plus the D skip,
    the z gate and dt's bias and softplus (2 each); Mamba-1's decay ``exp(dt·A)`` is per
    (channel, state) pair, not per head, which adds ``2·(N - 1)`` per channel."""
    scan = mamba2_scan_per_token(inner, 1, state, d_skip=True, z_gate=True,
                                 dt_bias_softplus=True).plus(Split(0, 2 * inner * (state - 1)))
    norms = Split(0, 4 * (rank + 2 * state)) if dt_norms else Split(0, 0)
    return (_linear(hidden, 2 * inner)
            .plus(conv1d_per_token(inner, width, conv_bias, True))
            .plus(_linear(inner, rank + 2 * state)).plus(norms)
            .plus(_linear(rank, inner)).plus(scan).plus(_linear(inner, hidden)))


def mamba_mixer(a: Named) -> Split:
    """``vllm::mamba_mixer`` (Jamba, Mamba-1 models): this rank's channels from ``A``
    [D_i, N]; state size, dt rank and conv width from the layer."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "hidden_states")
    per_token = mamba1_per_token(x.shape[-1], int(layer.A.shape[0]), int(layer.ssm_state_size),
                                 int(layer.time_step_rank), _width(layer), _has_bias(layer),
                                 bool(getattr(layer, "use_rms_norm", False)))
    return per_token.times(x.numel() // x.shape[-1])


def short_conv(a: Named) -> Split:
    """``vllm::short_conv`` (LFM2): in_proj (H -> 3·D: B, C, x), ``B·x``, the depthwise
    conv of width ``L_cache`` (no activation), ``C·``, out_proj (D -> H); D this rank's
    conv channels (the conv weight's rows)."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "hidden_states")
    hidden, channels = x.shape[-1], int(layer.conv.weight.shape[0])
    per_token = (_linear(hidden, 3 * channels)
                 .plus(conv1d_per_token(channels, int(layer.L_cache), bool(layer.bias), False))
                 .plus(Split(0, 2 * channels)).plus(_linear(channels, hidden)))
    return per_token.times(x.numel() // hidden)


def linear_attention(a: Named) -> Split:
    """``vllm::linear_attention`` (MiniMax-Text-01's lightning attention): qkv_proj
    (H -> 3I) and SiLU, per head the decayed state ``kv <- λ·kv + kᵀv`` and ``o = q·kv``
    (``4·d²`` matmul, ``d²`` decay), the TP RMS norm (4 per element), output_gate
    (H -> I) with its sigmoid and multiply, out_proj (I -> H); ``I = heads·d`` this
    rank's. Prefill's intra-block form re-associates the same recurrence (the kernel's
    choice, not counted)."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "hidden_states")
    hidden, heads, d = x.shape[-1], int(layer.tp_heads), int(layer.head_dim)
    inner = heads * d
    per_token = (_linear(hidden, 3 * inner).plus(Split(0, 3 * inner))
                 .plus(Split(4 * heads * d * d, heads * d * d))
                 .plus(Split(0, 4 * inner)).plus(_linear(hidden, inner))
                 .plus(Split(0, 2 * inner)).plus(_linear(inner, hidden)))
    return per_token.times(x.numel() // hidden)


def olmo_gdn(a: Named) -> Split:
    """``vllm::olmo_hybrid_gdn_full_forward``: OLMo-Hybrid's whole Gated DeltaNet layer:
    in_proj_qkvg (H -> 2·H_k·K + 2·H_v·V), b and a projections (H -> H_v each), the GDN
    core (conv, gating, q/k norms, delta rule), the gated RMS norm of the output (norm 4,
    SiLU gate 1, multiply 1), o_proj (H_v·V -> H); heads this rank's."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "hidden_states")
    tp = int(getattr(layer, "tp_size", 1))
    k_heads, v_heads = int(layer.num_k_heads) // tp, int(layer.num_v_heads) // tp
    k_dim, v_dim, hidden = int(layer.head_k_dim), int(layer.head_v_dim), x.shape[-1]
    values = v_heads * v_dim
    per_token = (_linear(hidden, 2 * k_heads * k_dim + 2 * values)
                 .plus(_linear(hidden, 2 * v_heads))
                 .plus(gdn_layer_per_token(k_heads, v_heads, k_dim, v_dim, _width(layer),
                                           _has_bias(layer)))
                 .plus(Split(0, 6 * values)).plus(_linear(values, hidden)))
    return per_token.times(x.numel() // hidden)


def kda_recurrence_per_token(heads: Any, k_dim: Any, v_dim: Any) -> Split:
    """Kimi Delta Attention's step: Gated DeltaNet's delta rule with a decay per key
    channel (``diag(α)·S``): the same products, and ``exp(g)`` for every key channel
    instead of once a head (``K - 1`` more per head)."""
    return delta_rule_per_token(heads, k_dim, v_dim).plus(Split(0, heads * (k_dim - 1)))


def bailing_kda(a: Named) -> Split:
    """``vllm::bailing_v3_kda_attention`` (Ling/Bailing V3): inside the op, the three
    depthwise convs over q, k and v (SiLU), the q/k L2 norms and the KDA recurrence; the
    projections, the gate ``g1`` and ``β`` come in computed. Heads and head size from
    ``core_attn_out`` [1, T, H, D], conv width from the layer."""
    layer = vllm_layer(a["layer_name"])
    out = tensor(a, "core_attn_out")
    heads, d = out.shape[-2], out.shape[-1]
    n_tokens = tensor(a, "q_proj_states").numel() // (heads * d)
    width = int(getattr(layer, "conv_size", 0) or _width(layer))
    bias = getattr(getattr(layer, "q_conv1d", None), "bias", None) is not None
    per_token = (conv1d_per_token(3 * heads * d, width, bias, True)
                 .plus(qk_l2norm_per_token(heads, d))
                 .plus(kda_recurrence_per_token(heads, d, d)))
    return per_token.times(n_tokens)


def flashkda(a: Named) -> Split:
    """``_flashkda_C::fwd`` (Kimi K3's KDA prefill): the gate from ``g`` per key channel
    (bias, scale by ``exp(A)``, bounded sigmoid: 4) and the KDA recurrence; q/k [.., T,
    H, K], v [.., T, H, V]."""
    q, v = tensor(a, "q"), tensor(a, "v")
    heads, k_dim, v_dim = q.shape[-2], q.shape[-1], v.shape[-1]
    per_token = Split(0, 4 * heads * k_dim).plus(kda_recurrence_per_token(heads, k_dim, v_dim))
    return per_token.times(q.numel() // (heads * k_dim))


def ple_short_conv(a: Named) -> Split:
    """``vllm::qwen4_exp_ple_short_conv``: a dilated depthwise conv over the PLE input's
    channels (width from the layer, no bias or activation) accumulated into ``residual``
    (1), plus ``outer_residual`` when given (1)."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "inputs")
    channels = x.shape[-1]
    adds = 1 + int(a.get("outer_residual") is not None)
    per_token = conv1d_per_token(channels, int(layer.conv_kernel_size), False, False).plus(
        Split(0, adds * channels))
    return per_token.times(x.numel() // channels)


def qsa_attention(q: str) -> Builder:
    """Qwen4-exp's sparse attention (QSA): each query attends the keys its indexer
    selected, at most ``indexer.output_width`` (the layer the op names); heads and head
    size from ``q`` (the prepare variant's output [T, H, D]). The indexer's own scoring
    runs inside the op too and is not counted (its sizes are the indexer's, not the
    op's); the prepare variant's q/k norm and rope are not counted either."""

    def formula(a: Named) -> Any:
        width = int(vllm_layer(a["layer_name"]).indexer.output_width)
        return topk_attention(q, lambda _: width, dim(q, -1))(a)

    return formula


# --- LoRA, and the Transformers backend's MoE --------------------------------------------


def lora_linear_async(a: Named) -> Any:
    """``vllm::lora_linear_async``: the base linear (K -> ``output_size``) and its LoRA on
    a second stream: per slice shrink (K -> r) and expand (r -> that slice's outputs),
    ranks from the layer's ``lora_a_stacked`` [L, 1, r, K]. An upper bound: every token
    counted through its slice's adapter (tokens with none skip it at run time)."""
    layer = vllm_layer(a["layer_name"])
    x = tensor(a, "x")
    m, k = x.numel() // x.shape[-1], x.shape[-1]
    lora = sum(2 * m * w.shape[-2] * (k + n)
               for w, n in zip(layer.lora_a_stacked, layer.output_slices))
    return 2 * m * k * a["output_size"] + lora


def lora_shrink(a: Named) -> Any:
    """Punica's shrink: each slice's ``K -> r`` (``lora_a_weights[i]`` [L, .., r, K]) for
    every token (an upper bound: tokens without an adapter are skipped at run time)."""
    x = tensor(a, "inputs")
    return 2 * x.numel() * sum(w.shape[-2] for w in a["lora_a_weights"])


def lora_expand(a: Named) -> Any:
    """Punica's expand: each slice's ``r -> N_i`` (``lora_b_weights[i]`` [L, .., N_i, r])
    for every token of ``inputs`` [slices, T, r] (upper bound, as shrink)."""
    x = tensor(a, "inputs")
    return 2 * x.shape[-2] * x.shape[-1] * sum(w.shape[-2] for w in a["lora_b_weights"])


def moe_lora_shrink(a: Named) -> Any:
    """The MoE LoRA shrink: every routed (token, expert) pair through each slice's
    ``K -> r``; T and K from ``qcurr_hidden_states`` [T, K], r from ``lora_a_stacked``."""
    x = tensor(a, "qcurr_hidden_states")
    rank = a["lora_a_stacked"][0].shape[-2]
    return 2 * len(a["lora_a_stacked"]) * x.numel() * a["top_k_num"] * rank


def moe_lora_expand(a: Named) -> Any:
    """The MoE LoRA expand: every routed pair through each slice's ``r -> N_i``; T from
    ``topk_weights`` [T, k], r from ``a_intermediate_cache1`` [.., r]."""
    n_tokens = tensor(a, "topk_weights").shape[0]
    rank = tensor(a, "a_intermediate_cache1").shape[-1]
    outs = sum(w.shape[-2] for w in a["lora_b_stacked"])
    return 2 * n_tokens * a["top_k_num"] * rank * outs


def transformers_moe(a: Named) -> Any:
    """``vllm::transformers_moe_forward`` (the Transformers backend's MoE): as
    ``vllm::moe_forward``, the routed experts' gate/up and down projections from the
    MoE layer the op names, top-k from ``topk_ids`` [T, k]."""
    dims = moe_dims(vllm_layer(a["layer_name"]))
    if dims is None:
        raise TypeError(f"layer {layer_name(a['layer_name'])} has no MoE sizes fxflops knows")
    n_tokens, top_k = tensor(a, "topk_ids").shape[0], tensor(a, "topk_ids").shape[-1]
    per_routed = dims.share * 2 * dims.hidden * dims.intermediate * (3 if dims.gated else 2)
    return int(per_routed) * n_tokens * top_k


# --- routing: scores per router logit (the top-k selection itself is free) --------------



def scores(of: str, per: int) -> Builder:
    return per_element(per, of)


def scoring(of: str, func: str, bias: str | None = None) -> Builder:
    """Scores by the op's ``scoring_func``: softmax 5 a logit, sigmoid 1 (+1 for a
    correction bias)."""

    def formula(a: Named) -> Any:
        per = SOFTMAX if a.get(func, "softmax") == "softmax" else 1
        per += int(bias is not None and a.get(bias) is not None)
        return per * tensor(a, of).numel()

    return formula


def mega_gate(a: Named) -> Split:
    """DeepGEMM's fused router: the router GEMM (x [T, H] by ``weight`` [E, H]) and the
    scores of its T·E logits."""
    x, experts = tensor(a, "x"), tensor(a, "weight").shape[0]
    logits = (x.numel() // x.shape[-1]) * experts
    per = SOFTMAX if a["scoring_func"] == "softmax" else 1 + int(a.get("bias") is not None)
    return Split(gemm("x", dim("weight", 0))(a), per * logits)


# --- the table ------------------------------------------------------------------------

_GEMMS: dict[str, tuple[Builder, str]] = {
    # Linears that return [M, N]: 2·M·K·N, K from the activation (packed fp4: two values
    # a byte), N from the output; bias adds are not counted (as torch counts addmm).
    "vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm": (gemm("A", OUT_N), "matmul"),
    "vllm::bf16x3_router_gemm": (gemm("X", OUT_N), "matmul"),  # model FLOPs (3 bf16 passes)
    "vllm::cuda_flashinfer_bf16_gemm": (gemm("x", OUT_N), "matmul"),
    "vllm::dynamic_flashinfer_deepgemm_blockscale_gemm": (gemm("input", OUT_N), "matmul"),
    "vllm::flashinfer_fp8_blockscale_gemm": (gemm("input", OUT_N), "matmul"),
    "vllm::flashinfer_mm_bf16_fp4": (gemm("A", OUT_N), "matmul"),
    "vllm::flashinfer_mm_fp4": (gemm("A", OUT_N, k=fp4("A")), "matmul"),
    "vllm::fp32_router_gemm_dispatch": (gemm("x", OUT_N), "matmul"),
    "vllm::gemm_with_dynamic_quant": (gemm("x", OUT_N, k=fp4_if("x", "x_scales")), "matmul"),
    "vllm::inc_ark_woq_linear": (gemm("x", OUT_N), "matmul"),
    "vllm::int8_scaled_mm_func": (gemm("qx", OUT_N), "matmul"),
    "vllm::marlin_gemm": (gemm("a", OUT_N), "matmul"),
    "vllm::matmul_mxf4_bf16": (gemm("x", OUT_N, k=fp4("x")), "matmul"),
    "vllm::matmul_nvf4_bf16": (gemm("x", OUT_N, k=fp4("x")), "matmul"),
    "vllm::min_latency_fused_qkv_a_proj": (gemm("input_", OUT_N), "matmul"),
    "vllm::mm_mxfp8": (gemm("A", OUT_N), "matmul"),
    "vllm::qwen4_exp_low_latency_gemm": (gemm("x", OUT_N), "matmul"),
    "vllm::rdna3_mxfp4_w4a8_apply": (gemm("x_2d", OUT_N), "matmul"),
    "vllm::rdna_hybrid_w4a16_apply": (gemm("x_2d", OUT_N), "matmul"),
    "vllm::rocm_aiter_gemm_a8w8_blockscale": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_aiter_gemm_a8w8_blockscale_bpreshuffle": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_aiter_gemm_a8wfp4": (gemm("x", OUT_N), "matmul"),  # fp8 activation
    "vllm::rocm_aiter_hipb_mm_fp8": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale_preshuffle": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_aiter_w8a8_gemm": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_bf16x3_router_gemm_dispatch": (gemm("x", OUT_N), "matmul"),
    "vllm::rocm_mxfp8_block32_gemm": (gemm("x", OUT_N), "matmul"),
    "vllm::rocm_per_tensor_float_w8a8_scaled_mm_impl": (gemm("A", OUT_N), "matmul"),
    "vllm::rocm_unquantized_gemm": (gemm("x", OUT_N), "matmul"),
    "vllm::triton_w4a16_gemm": (gemm("a", OUT_N), "matmul"),
    "vllm::w8a8_triton_block_scaled_mm_func": (gemm("qx", OUT_N), "matmul"),
    # out-variant (writes ``output``) and the async-TP GEMM whose output is scattered
    "vllm::fp8_gemm_nt_op": (gemm("q_input", dim("output", -1)), "matmul"),
    "vllm::patched_fused_scaled_matmul_reduce_scatter": (gemm("A", dim("B", -1)), "matmul"),
    # the base linear and its LoRA, sizes from the LoRA layer
    "vllm::lora_linear_async": (lora_linear_async, "matmul"),
    # C++ kernels vLLM calls directly, schema not shipped: the activation first
    "_xpu_C::fp4_gemm": (by_position("x", gemm("x", OUT_N, k=fp4("x"))), "matmul"),
    "_xpu_C::fp8_gemm": (by_position("x", gemm("x", OUT_N)), "matmul"),
    "_xpu_C::fp8_gemm_w8a16": (by_position("x", gemm("x", OUT_N)), "matmul"),
    "_xpu_C::int4_gemm_w4a16": (by_position("x", gemm("x", OUT_N)), "matmul"),
    "_xpu_C::int4_gemm_w4a8": (by_position("x", gemm("x", OUT_N)), "matmul"),  # int8 x
    "fbgemm::f4f4bf16": (by_position("x", gemm("x", OUT_N, k=fp4("x"))), "matmul"),
    "_rocm_C::gptq_gemm_rdna3": (by_position("a", gemm("a", OUT_N)), "matmul"),
    "_rocm_C::gptq_gemm_rdna3_wmma": (by_position("a", gemm("a", OUT_N)), "matmul"),
}

_BATCHED_GEMMS: dict[str, tuple[Builder, str]] = {
    # Batched GEMMs: the activation's rows are every batch's rows (B·M), so 2·M·K·N over
    # the activation counts them all.
    "vllm::bmm_fp8": (gemm("A", OUT_N), "matmul"),
    "vllm::deepgemm_mxfp8_bmm": (gemm("x", OUT_N), "matmul"),  # [T, G, K] x [G, N, K]
    "vllm::xpu_fp8_bmm": (gemm("a", OUT_N), "matmul"),
    # DeepSeek-V4.1's grouped wo_a: [T, G·K] or [T, G, K] -> [T, G, o_lora_rank]
    "vllm::rocm_dsv41_mxfp8_wo_a_bmm": (gemm("a", arg("o_lora_rank")), "matmul"),
    # DeepGEMM's out-variant GEMMs (``d`` [.., M, N]): ``a`` holds M·K values in either
    # orientation (nt/tn/...), so 2·numel(a)·N; SYRK (D = A·Aᵀ) and SYMM (D = A·B, A
    # symmetric) counted as the full product, as torch counts ``a @ a.mT``.
    "deep_gemm::cublaslt_gemm_nn": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::cublaslt_gemm_nt": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::cublaslt_gemm_tn": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::cublaslt_gemm_tt": (gemm("a", dim("d", -1)), "matmul"),
    # DeepGEMM's dense bf16 GEMMs (no vLLM caller today; the same layouts as cuBLASLt's)
    "deep_gemm::bf16_gemm_nn": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::bf16_gemm_nt": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::bf16_gemm_tn": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::bf16_gemm_tt": (gemm("a", dim("d", -1)), "matmul"),
    # QuTLASS' micro-scaled GEMMs (A is [M, K]; fp4 packs two values a byte), output [M, N]
    "_qutlass_C::matmul_nvf4_bf16_tn": (gemm("A", OUT_N, k=fp4("A")), "matmul"),
    "_qutlass_C::matmul_ada_mxf4_bf16_tn": (gemm("A", OUT_N, k=fp4("A")), "matmul"),
    "_qutlass_C::matmul_mxf8_bf16_tn": (gemm("A", OUT_N), "matmul"),
    "_qutlass_C::matmul_mxf8_bf16_nn": (gemm("A", OUT_N), "matmul"),
    "deep_gemm::batched_syrk": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::batched_symm": (gemm("a", dim("d", -1)), "matmul"),
    "deep_gemm::einsum": (einsum(), "matmul"),
    "deep_gemm::k_grouped_bf16_gemm_tn_contiguous": (k_grouped(), "matmul"),
    "deep_gemm::k_grouped_fp8_gemm_nt_contiguous": (k_grouped(), "matmul"),
    "deep_gemm::k_grouped_fp8_gemm_tn_contiguous": (k_grouped(), "matmul"),
    "deep_gemm::k_grouped_fp4_gemm_nt_contiguous": (k_grouped(packed=True), "matmul"),
}

_LORA: dict[str, tuple[Builder, str]] = {
    # Punica's LoRA kernels, out-variant: every token through each slice's adapter (an
    # upper bound: tokens without one are skipped at run time).
    "vllm::lora_shrink": (lora_shrink, "matmul"),
    "vllm::lora_shrink_fp8": (lora_shrink, "matmul"),
    "vllm::lora_expand": (lora_expand, "matmul"),
    "vllm::lora_expand_fp8": (lora_expand, "matmul"),
    "vllm::xpu_bgmv_shrink": (gemm("inputs", dim("output_tensor", -1)), "matmul"),
    "vllm::xpu_bgmv_expand": (gemm("inputs", dim("lora_b_weights", -2)), "matmul"),
    "vllm::xpu_bgmv_expand_slice": (gemm("inputs", arg("slice_size")), "matmul"),
    # the MoE LoRA's two halves, per routed (token, expert) pair
    "vllm::fused_moe_lora_shrink": (moe_lora_shrink, "matmul"),
    "vllm::fused_moe_lora_shrink_fp8": (moe_lora_shrink, "matmul"),
    "vllm::fused_moe_lora_expand": (moe_lora_expand, "matmul"),
    "vllm::fused_moe_lora_expand_fp8": (moe_lora_expand, "matmul"),
}

_HADAMARD: dict[str, tuple[Builder, str]] = {
    # FP-Quant: a block Hadamard rotation (a GEMM with the R x R matrix) before the fp4
    # quantisation (bytes).
    "vllm::fused_quantize_mx": (hadamard("x_flat", "hadamard_matrix"), "matmul"),
    "vllm::fused_quantize_nv": (hadamard("x_flat", "hadamard_matrix"), "matmul"),
    "vllm::safeFusedQuantizeNv": (hadamard("a", "b"), "matmul"),
}

_NORMS: dict[str, tuple[Builder, str]] = {
    # RMS norm 4 a element (3 with no weight), quantised output or not (bytes)
    "vllm_ir::rms_norm": (rms_norm("x", "weight"), "vector"),
    "vllm_aiter::rms_norm": (rms_norm("x"), "vector"),
    "oink::rmsnorm": (by_position("x", rms_norm("x")), "vector"),
    "vllm::rocm_aiter_fused_rms_fp8_per_tensor_static_quant": (rms_norm("x"), "vector"),
    "vllm::rocm_aiter_rmsnorm_fp8_group_quant": (rms_norm("x"), "vector"),
    "vllm::rocm_aiter_rmsnorm_fused_dynamic_quant": (rms_norm("x"), "vector"),
    "vllm::fused_mla_dual_rms_norm": (total(rms_norm("x1"), rms_norm("x2")), "vector"),
    "vllm::fused_mla_dual_rms_norm_group_quant": (total(rms_norm("q"), rms_norm("kv")),
                                                  "vector"),
    "vllm::fused_mla_dual_rms_norm_per_token_quant": (total(rms_norm("q"), rms_norm("kv")),
                                                      "vector"),
    "vllm::minimax_qk_norm_fusion": (  # q and k of every token (the TP all-reduce: comm)
        lambda a: 4 * tensor(a, "qkv").shape[0] * (a["q_size"] + a["kv_size"]), "vector"),
    # the residual add fused in front: 5 (4 with no weight)
    "vllm_ir::fused_add_rms_norm": (rms_norm("x", "weight", add=True), "vector"),
    "vllm_aiter::fused_add_rms_norm": (rms_norm("x", add=True), "vector"),
    "oink::fused_add_rms_norm": (by_position("x", rms_norm("x", add=True)), "vector"),
    "vllm::rocm_aiter_fused_add_rms_fp8_per_tensor_static_quant": (rms_norm("x", add=True),
                                                                   "vector"),
    "vllm::rocm_aiter_rmsnorm_fused_add_dynamic_quant": (rms_norm("x", add=True), "vector"),
    "vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant": (rms_norm("x", add=True), "vector"),
    "vllm::rocm_aiter_triton_add_rmsnorm_pad": (rms_norm("x", add=True), "vector"),
    "vllm::flashinfer_fused_add_rms_norm_nvfp4_quant": (rms_norm("input", add=True), "vector"),
    "vllm::rocm_aiter_fused_allreduce_rmsnorm": (rms_norm("input_", add=True), "vector"),
    "vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group": (rms_norm("input_", add=True),
                                                                 "vector"),
    "vllm::rocm_aiter_fused_allreduce_rmsnorm_quant_per_group_with_bf16_norm": (
        rms_norm("input_", add=True), "vector"),
    # pattern 0 is the bare all-reduce (communication); the others add the residual
    # and RMS-normalise (and quantise)
    "vllm::flashinfer_trtllm_fused_allreduce_norm": (
        lambda a: 5 * tensor(a, "allreduce_in").numel() if a["pattern_code"] else 0,
        "vector"),
    # helion's: the residual add when given
    "vllm_helion::rms_norm_dynamic_per_token_quant": (
        lambda a: (4 + int(a.get("residual") is not None)) * tensor(a, "input").numel(),
        "vector"),
    "vllm_helion::rms_norm_per_block_quant": (
        lambda a: (4 + int(a.get("residual") is not None)) * tensor(a, "input").numel(),
        "vector"),
    # Gemma's (1 + w) weight: one more add; grouped per stream (Qwen4-exp)
    "vllm::xpu_gemma_rms_norm": (per_element(5, "input"), "vector"),
    "vllm::xpu_fused_add_gemma_rms_norm": (per_element(6, "input"), "vector"),
    "vllm::qwen4_exp_grouped_gemma_rmsnorm": (per_element(5, "x"), "vector"),
    # layer norm 7 (mean, variance, normalise, affine); 8 with the residual add; Nemotron's
    # scales by (1 + w), one more (as Gemma's RMS norm: _C::nemotron_layer_norm alike)
    "vllm::xpu_layer_norm": (per_element(7, "input"), "vector"),
    "vllm::xpu_nemotron_layer_norm": (per_element(8, "input"), "vector"),
    "vllm::xpu_fused_input_norm": (per_element(7, "x"), "vector"),
    "vllm::xpu_fused_add_layer_norm": (per_element(8, "input"), "vector"),
    "vllm::xpu_fused_add_nemotron_layer_norm": (per_element(9, "input"), "vector"),
    # gated RMS norm: norm 4, gate activation 1, multiply 1 (norm alone without a gate)
    "vllm::fla_rms_norm_gated": (
        lambda a: (6 if a.get("z") is not None else 4) * tensor(a, "x").numel(), "vector"),
    "vllm::rocm_aiter_fused_rms_gated_fp8_group_quant": (per_element(6, "x"), "vector"),
}

_ACTIVATIONS: dict[str, tuple[Builder, str]] = {
    # activation and multiply: 2 per output element (the output half the input's width)
    "vllm::rocm_aiter_act_mul_and_fp8_group_quant": (and_mul("x"), "vector"),
    "vllm_helion::silu_and_mul_per_block_quant": (and_mul("input"), "vector"),
    "vllm_helion::silu_mul_fp8": (and_mul("input"), "vector"),
    # sparse GELU-and-mul (Gemma 3n): the gate's mean and std threshold (2), GELU,
    # multiply: 4 per output element
    "vllm::gelu_and_mul_sparse_triton": (per_element(4, "out"), "vector"),
    "vllm_ir::gelu_and_mul_sparse": (per_element(4, "out"), "vector"),
}

_ROTARY: dict[str, tuple[Builder, str]] = {
    # 3 per rotated element of q and k (a pair: 4 multiplies, 2 adds)
    "vllm::flashinfer_rotary_embedding": (
        rope("query", "key", dim("cos_sin_cache", -1), arg("head_size")), "vector"),
    "vllm::rocm_aiter_triton_rotary_embedding": (
        rope("query", "key", dim("cos_sin_cache", -1), arg("head_size")), "vector"),
    "vllm::mrope": (rope("query", "key", arg("rotary_dim"), arg("head_size")), "vector"),
    "vllm::xpu_ops_deepseek_scaling_rope": (
        rope("query", "key", arg("rotary_dim"), dim("query", -1)), "vector"),
    "vllm::xpu_apply_rotary_emb": (per_element(3, "x"), "vector"),  # x: the rotated part
    "vllm::fused_inv_rope_fp8_quant_kernel": (  # o's inverse rope; the quantisation: bytes
        rope("o", None, lambda a: 2 * a["half_rope"], dim("o", -1)), "vector"),
    # rope fused with the KV-cache write (bytes): q/k [T, H, D] (MLA: q_pe and k_pe)
    "vllm::fused_rope_and_unified_kv_cache_update": (
        rope("query", "key", dim("cos_sin_cache", -1), dim("value", -1)), "vector"),
    "vllm::fused_rope_unified_mla_kv_cache_update": (
        rope("q_pe", "k_pe", dim("cos_sin_cache", -1), dim("q_pe", -1)), "vector"),
    # per-head q/k RMS norm (4) and rope fused (with the KV-cache write)
    "vllm::fused_qk_norm_rope_and_unified_kv_cache_update": (qk_norm_rope(
        numel("q_out"), numel("k_out"), dim("q_weight", 0), dim("cos_sin_cache", -1)),
        "vector"),
    "vllm::fused_qk_norm_mrope_and_unified_kv_cache_update": (qk_norm_rope(
        numel("q_out"),
        lambda a: (tensor(a, "qkv").numel() - tensor(a, "q_out").numel()) // 2,
        dim("q_weight", 0), arg("rotary_dim")), "vector"),
    "vllm::muse_spark_fused_qk_norm_rope_kv_insert": (qk_norm_rope(
        lambda a: rows("qkv")(a) * a["num_heads"] * a["head_dim"],
        lambda a: rows("qkv")(a) * a["num_kv_heads"] * a["head_dim"],
        arg("head_dim"), arg("rotary_dim")), "vector"),
    "vllm_helion::fused_qk_norm_rope": (qk_norm_rope(
        lambda a: rows("qkv")(a) * a["num_heads_q"] * a["head_dim"],
        lambda a: rows("qkv")(a) * a["num_heads_k"] * a["head_dim"],
        arg("head_dim"), dim("cos_sin_cache", -1)), "vector"),
    "vllm::hpc_rope_norm_forward": (hpc_rope_norm, "vector"),
    # DeepSeek-V4's indexer q: rope (3 per rotated element) and the head weights' two
    # scales (2 per head); index_q [T, H_i, D_i]
    "vllm::xpu_deepseek_fused_indexer_q_rope_fp8": (
        lambda a: rows("index_q")(a) * (3 * tensor(a, "index_q_cos_sin_cache").shape[-1] + 2),
        "vector"),
    "vllm::xpu_deepseek_fused_indexer_q_rope_mxfp4": (
        lambda a: rows("index_q")(a) * (3 * tensor(a, "index_q_cos_sin_cache").shape[-1] + 2),
        "vector"),
}

_ROUTING: dict[str, tuple[Builder, str]] = {
    # Router scores, per logit: softmax 5, sigmoid 1 (+1 with a correction bias); the
    # top-k selection is free. aiter's fused_topk takes the router's logits (no GEMM).
    "vllm::rocm_aiter_topk_softmax": (scores("gating_output", SOFTMAX), "vector"),
    "vllm::rocm_aiter_topk_gating": (scores("gating_output", SOFTMAX), "vector"),
    "vllm::rocm_aiter_fused_topk": (scores("router_logits", SOFTMAX), "vector"),
    "aiter::topk_softmax": (by_position("topk_weights topk_indices token_expert_indices "
                                        "gating_output", scores("gating_output", SOFTMAX)),
                            "vector"),
    "vllm::rocm_aiter_topk_sigmoid": (scores("gating_output", 1), "vector"),
    "vllm::rocm_aiter_biased_grouped_topk": (scores("gating_output", 2), "vector"),
    "vllm::rocm_aiter_grouped_topk": (scoring("gating_output", "scoring_func"), "vector"),
    "deep_gemm::bf16_mega_gate": (mega_gate, "matmul"),  # router GEMM + scores
    # the Transformers backend's MoE: vllm::moe_forward's count, top-k from topk_ids
    "vllm::transformers_moe_forward": (transformers_moe, "matmul"),
}

_ATTENTION: dict[str, tuple[Builder, str]] = {
    # vision encoders' attention: static for a fixed-length batch, else at run time
    "vllm::flash_attn_maxseqlen_wrapper": (vit_attention(), "attention"),
    "vllm::triton_attn_wrapper": (vit_attention(), "attention"),
    "vllm::torch_sdpa_wrapper": (vit_attention(), "attention"),
    "vllm::flashinfer_wrapper": (vit_attention(), "attention"),
    "vllm::aiter_fp8_attn_wrapper": (vit_attention(), "attention"),
    # DeepSeek-V3.2's lightning indexer: per causal (query, key) pair, at run time
    "vllm::sparse_attn_indexer": (indexer_logits(), "attention"),
    "vllm::rocm_aiter_sparse_attn_indexer": (indexer_logits("q_fp8"), "attention"),
    # sparse attention over the selected keys (a static upper bound: top-k a query)
    "_flashmla_C::fused_norm_rope_attn_rope_cast_decode": (flashmla_mega, "matmul"),
    "_flashmla_C::fused_norm_rope_attn_rope_cast_fwd": (flashmla_mega, "matmul"),
    "vllm::qwen4_exp_qsa_with_output": (qsa_attention("query"), "matmul"),
    "vllm::qwen4_exp_qsa_prepare_with_output": (qsa_attention("output"), "matmul"),
}

_LAYERS: dict[str, tuple[Builder, str]] = {
    # whole layers (projections included) and recurrent cores, sizes from the layer
    "vllm::mamba_mixer": (mamba_mixer, "matmul"),
    "vllm::short_conv": (short_conv, "matmul"),
    "vllm::linear_attention": (linear_attention, "matmul"),
    "vllm::olmo_hybrid_gdn_full_forward": (olmo_gdn, "matmul"),
    "vllm::bailing_v3_kda_attention": (bailing_kda, "matmul"),
    "vllm::qwen4_exp_ple_short_conv": (ple_short_conv, "matmul"),
    "_flashkda_C::fwd": (flashkda, "matmul"),
    # Qwen3 DFlash2's drafter: a causal grouped conv whose taps (``taps`` = base's
    # elements over the width) are per-token coefficients ``base + delta``: 2 a tap (the
    # multiply-add, matmul as a conv's taps are) and 1 a tap for the coefficient
    "vllm::dflash2_grouped_conv": (lambda a: Split(
        2 * tensor(a, "x").numel() * (tensor(a, "base").numel() // tensor(a, "x").shape[-1]),
        tensor(a, "x").numel() * (tensor(a, "base").numel() // tensor(a, "x").shape[-1])),
        "matmul"),
    # gathered NVFP4 rows dotted with the Markov embedding: 2·D an index
    "vllm::nvfp4_gathered_bias": (
        lambda a: 2 * tensor(a, "index").numel() * tensor(a, "markov_embed").shape[-1],
        "matmul"),
}

_HYPER_CONNECTIONS: dict[str, tuple[Builder, str]] = {
    # DeepSeek-V4 mHC (see the helpers above): pre = projection + Sinkhorn + collapse
    # (+ the fused norm); post; fused post + pre; head = projection + collapse
    "vllm::mhc_pre_tilelang": (mhc_pre(), "matmul"),
    "vllm::mhc_pre_aiter": (mhc_pre(), "matmul"),
    "_xpu_C::mhc_pre": (by_position("residual fn hc_scale hc_base rms_eps hc_pre_eps "
                                    "hc_sinkhorn_eps hc_post_mult_value sinkhorn_repeat",
                                    mhc_pre()), "matmul"),
    "vllm::mhc_pre_delayed_tilelang": (mhc_pre(collapse_with="pre_mix"), "matmul"),
    "vllm::mhc_pre_delayed_aiter": (
        post_then(mhc_pre(collapse_with="pre_mix"), post_if="sublayer_out"), "matmul"),
    "vllm::mhc_fused_post_pre_delayed_rms_norm_aiter": (
        post_then(mhc_pre(collapse_with="pre_mix"), post_if="sublayer_out"), "matmul"),
    "vllm::mhc_fused_post_pre_tilelang": (post_then(mhc_pre()), "matmul"),
    "vllm::mhc_fused_post_pre_aiter": (post_then(mhc_pre()), "matmul"),
    "vllm::mhc_fused_post_pre_delayed_tilelang": (
        post_then(mhc_pre(collapse_with="pre_mix")), "matmul"),
    "_xpu_C::mhc_fused_post_pre": (by_position(
        "x residual post_layer_mix comb_res_mix fn hc_scale hc_base rms_eps hc_pre_eps "
        "hc_sinkhorn_eps hc_post_mult_value sinkhorn_repeat", post_then(mhc_pre())),
        "matmul"),
    "deep_gemm::mega_mhc": (post_then(mhc_pre(iters="num_sinkhorn_iters",
                                               norm="rmsnorm_weight")), "matmul"),
    "vllm::mhc_post_tilelang": (hc_post("residual"), "vector"),
    "vllm::mhc_post_aiter": (hc_post("residual"), "vector"),
    "_xpu_C::mhc_post": (by_position("x residual post_layer_mix comb_res_mix",
                                     hc_post("residual")), "vector"),
    "vllm::hc_head_fused_kernel_tilelang": (hc_head(), "matmul"),
    "vllm::hc_head_triton": (hc_head(), "matmul"),
    "_xpu_C::hc_head_fused": (by_position("hs_flat fn", hc_head()), "matmul"),
    "vllm::hc_collapse_triton": (hc_collapse("x"), "vector"),
    "vllm::mhc_pre_mix_triton": (mhc_pre_mix, "vector"),
    # Qwen4-exp's hyper-connections, per element: combine (scale and add: 2), combine +
    # Gemma norm (2 + 5), gated mix (sigmoid, multiply, add: 3), scaled SiLU (2); the PLE
    # gate: three Gemma RMS norms (5 each), the k·q dot (2) and the gate's multiply (1)
    "vllm::qwen4_exp_hc_combine": (per_element(2, "residual"), "vector"),
    "vllm::qwen4_exp_hc_combine_norm": (per_element(7, "residual"), "vector"),
    "vllm::qwen4_exp_hc_gate_mix": (per_element(3, "x"), "vector"),
    "vllm::qwen4_exp_hc_silu": (per_element(2, "x"), "vector"),
    "vllm::qwen4_exp_ple_gate": (per_element(18, "hidden"), "vector"),
}

TABLE: dict[str, tuple[Builder, str]] = {
    **_GEMMS, **_BATCHED_GEMMS, **_LORA, **_HADAMARD, **_NORMS, **_ACTIVATIONS, **_ROTARY,
    **_ROUTING, **_ATTENTION, **_LAYERS, **_HYPER_CONNECTIONS,
}
register(TABLE)


# --- kernels that run only inside another graph op: that op's formula counts them -----

_INDEXER = "vllm::sparse_attn_indexer"

INSIDE: dict[str, str] = {
    # attention backends' kernels, run by the layer's impl inside the attention op
    "_vllm_fa2_C::varlen_fwd": ATTENTION_OP,
    "_vllm_fa2_C::fwd_sparse": ATTENTION_OP,
    "_vllm_fa2_C::varlen_fwd_sparse": ATTENTION_OP,
    "_vllm_fa3_C::fwd": ATTENTION_OP,
    "_rocm_C::paged_attention": ATTENTION_OP,
    "aiter::paged_attention_v1": ATTENTION_OP,
    "fmha_sm100::sparse_kvouter_attn": ATTENTION_OP,  # MiniMax-M3's MSA backend
    # MLA backends' kernels (FlashMLA, AITER), inside the MLA attention op
    "_flashmla_C::dense_decode_fwd": MLA_OP,
    "_flashmla_C::dense_prefill_fwd": MLA_OP,
    "_flashmla_C::sparse_decode_fwd": MLA_OP,
    "_flashmla_C::sparse_prefill_fwd": MLA_OP,
    "_flashmla_extension_C::fwd_kvcache_mla_fp8": MLA_OP,
    "vllm::rocm_aiter_gather_kv_b_proj": MLA_OP,
    "vllm::rocm_aiter_mla_decode_fwd": MLA_OP,
    "vllm::rocm_aiter_mla_decode_fwd_lse": MLA_OP,
    # fused-MoE experts and their grouped GEMMs, run by the MoE runner inside moe_forward
    "deep_gemm::bf16_mega_moe": MOE_OP,
    "deep_gemm::fp4_fp4_mega_moe": MOE_OP,
    "deep_gemm::fp8_fp4_mega_moe": MOE_OP,
    "deep_gemm::nvfp4_mega_moe": MOE_OP,
    "deep_gemm::m_grouped_bf16_gemm_nn_contiguous": MOE_OP,
    "deep_gemm::m_grouped_bf16_gemm_nt_contiguous": MOE_OP,
    "deep_gemm::m_grouped_bf16_gemm_nt_masked": MOE_OP,
    "deep_gemm::m_grouped_fp8_fp4_gemm_nn_contiguous": MOE_OP,
    "deep_gemm::m_grouped_fp8_fp4_gemm_nt_contiguous": MOE_OP,
    "deep_gemm::m_grouped_fp8_fp4_gemm_nt_masked": MOE_OP,
    "vllm::deepseek_v4_mega_moe_experts": MOE_OP,
    "vllm::fused_experts": MOE_OP,
    "vllm::fused_flydsl_moe_impl": MOE_OP,
    "vllm::fused_moe_lora": MOE_OP,
    "vllm::fused_moe_lora_fp8": MOE_OP,
    "vllm::rocm_aiter_asm_moe_tkw1": MOE_OP,
    "vllm::rocm_aiter_fused_moe": MOE_OP,
    "_rocm_C::moe_gptq_gemm_rdna3": MOE_OP,  # RDNA3's W4A16 experts
    # linear kernels inside the vLLM op that picks them
    "_rocm_C::wvSplitK": "vllm::rocm_unquantized_gemm",
    "_rocm_C::wvSplitKrc": "vllm::rocm_unquantized_gemm",
    "_rocm_C::LLMM1": "vllm::rocm_unquantized_gemm",
    "_rocm_C::wvSplitKQ": "vllm::rocm_per_tensor_float_w8a8_scaled_mm_impl",
    "_rocm_C::wvSplitK_int4_g": "vllm::rdna_hybrid_w4a16_apply",
    "_rocm_C::mxfp4_w4a8_gemv_rdna3": "vllm::rdna3_mxfp4_w4a8_apply",
    "_qutlass_C::matmul_mxf4_bf16_tn": "vllm::matmul_mxf4_bf16",
    "deep_gemm::fp8_fp4_gemm_nn": "vllm::fp8_gemm_nt_op",
    "deep_gemm::fp8_fp4_gemm_nt": "vllm::fp8_gemm_nt_op",
    "deep_gemm::fp8_fp4_gemm_tn": "vllm::fp8_gemm_nt_op",
    "deep_gemm::fp8_fp4_gemm_tt": "vllm::fp8_gemm_nt_op",
    "deep_gemm::cublaslt_nvfp4_gemm_nt": "vllm::fp8_gemm_nt_op",
    "deep_gemm::fp8_einsum": "vllm::deepgemm_mxfp8_bmm",
    "_xpu_C::fp8_bmm": "vllm::xpu_fp8_bmm",
    "_xpu_C::bgmv_shrink": "vllm::xpu_bgmv_shrink",
    "_xpu_C::bgmv_expand": "vllm::xpu_bgmv_expand",
    "_xpu_C::bgmv_expand_slice": "vllm::xpu_bgmv_expand_slice",
    # FP-Quant's Hadamard-rotate-and-quantise kernels, inside its two ops
    "_qutlass_C::fusedQuantizeMxAbsMax": "vllm::fused_quantize_mx",
    "_qutlass_C::fusedQuantizeMxQuest": "vllm::fused_quantize_mx",
    "_qutlass_C::fusedQuantizeNvAbsMax": "vllm::fused_quantize_nv",
    # the lightning indexer's logits kernels, inside the indexer op
    "deep_gemm::fp8_fp4_mqa_logits": _INDEXER,
    "deep_gemm::fp8_fp4_paged_mqa_logits": _INDEXER,
    "deep_gemm::fp8_fp4_paged_sparse_mqa_logits": _INDEXER,
    "deep_gemm::fp8_fp4_sparse_mqa_logits": _INDEXER,
    "vllm::xpu_fp8_mqa_logits": _INDEXER,
    "vllm::xpu_fp8_paged_mqa_logits": _INDEXER,
    "_xpu_C::fp8_mqa_logits": _INDEXER,
    "_xpu_C::fp8_paged_mqa_logits": _INDEXER,
    # XPU kernels inside the vllm:: op that wraps each (vllm/_xpu_ops.py)
    "_xpu_C::gdn_attention": "vllm::gdn_attention_core_xpu",
    "_xpu_C::deepseek_scaling_rope": "vllm::xpu_ops_deepseek_scaling_rope",
    "_xpu_C::deepseek_fused_indexer_q_rope_fp8": "vllm::xpu_deepseek_fused_indexer_q_rope_fp8",
    "_xpu_C::deepseek_fused_indexer_q_rope_mxfp4":
        "vllm::xpu_deepseek_fused_indexer_q_rope_mxfp4",
    "_xpu_C::fused_input_norm": "vllm::xpu_fused_input_norm",
    # found in 0.33's compiled extensions (the census of names in its Python misses them)
    "_vllm_fa2_C::fwd_kvcache": ATTENTION_OP,
    "_qutlass_C::fusedQuantizeNvQuest": "vllm::fused_quantize_nv",
    "deep_gemm::tf32_hc_prenorm_gemm": "vllm::mhc_pre_tilelang",  # the mHC mix projection
}
for _kernel, _caller in INSIDE.items():
    register_inside(_caller, _kernel)

# --- ops no formula here covers ----------------------------------------------------------

UNCOSTABLE: dict[str, str] = {
    "vllm::deepseek_v4_cpu_prepare_and_attn":
        "DeepSeek-V4's whole attention block on CPU (wq_b, q norm and rope, compressor, "
        "indexer, sparse MLA, inverse rope, grouped wo_a and wo_b): its keys a query "
        "are the sliding window plus either the indexer's top-k or every compressed "
        "context token (context / compress_ratio), by layer; fxflops' run-time attention "
        "term (causal pairs, one window) cannot express the second, and counting only "
        "the projections would pass a partial count for a whole one",
}
for _op, _why in UNCOSTABLE.items():
    register_uncostable(_op, _why)
