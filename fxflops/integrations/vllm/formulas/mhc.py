"""mHC: DeepSeek-V4's manifold hyper-connections (vllm/model_executor/layers/mhc.py), one
set of builders for every kernel that fuses them (vLLM's CPU ``hc_*_fused_cpu`` and the
GPU build's TileLang, Triton and AITER variants).

``hc`` residual streams [T, hc, H]. "pre": the flattened streams' mix logits, a GEMM with
``fn`` [hc·(2 + hc), hc·H] scaled by their RMS, gated (sigmoid/softmax), the hc x hc
combination made doubly stochastic by Sinkhorn, and the streams collapsed into the
layer's input by the pre-mix; "post": the streams mixed by that combination (an hc x hc
product per hidden element) plus the layer's output scaled in; "head": the final
collapse, its gates from the same kind of GEMM.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from fxflops.cost.formulas.builders import (
    Builder,
    Named,
    tensor,
)
from fxflops.cost.registry import Split


def _streams(a: Named, name: str) -> tuple[Any, Any, Any]:
    """(tokens, hc, H) of residual streams [.., hc, H]."""
    r = tensor(a, name)
    hc, hidden = r.shape[-2], r.shape[-1]
    return r.numel() // (hc * hidden), hc, hidden


def hc_projection(streams: str, fn: str = "fn") -> Builder:
    """The mix logits: ``x @ fn^T`` (matmul), the RMS of ``x`` (square and sum, 2 per
    element) and each logit's scale, bias and gate (3)."""

    def formula(a: Named) -> Split:
        n_tokens = _streams(a, streams)[0]
        outs, width = tensor(a, fn).shape[0], tensor(a, fn).shape[1]
        return Split(2 * n_tokens * outs * width, n_tokens * (2 * width + 3 * outs))

    return formula


def hc_sinkhorn(streams: str, iters: str) -> Builder:
    """Sinkhorn's normalisation of the hc x hc combination: per iteration a row and a
    column pass, each a sum and a divide (4 per element)."""

    def formula(a: Named) -> Split:
        n_tokens, hc, _ = _streams(a, streams)
        return Split(0, 4 * a[iters] * n_tokens * hc * hc)

    return formula


def hc_collapse(streams: str) -> Builder:
    """The pre-mix's weighted sum of the streams (2 per stream element)."""
    return lambda a: Split(0, 2 * tensor(a, streams).numel())


def hc_post(streams: str) -> Builder:
    """Post: each stream element a combination of hc streams (``2·hc``) plus the scaled
    layer output (2)."""

    def formula(a: Named) -> Split:
        hc = _streams(a, streams)[1]
        return Split(0, tensor(a, streams).numel() * (2 * hc + 2))

    return formula


def hc_norm(streams: str, weight: str = "norm_weight") -> Builder:
    """The RMS norm some variants fuse onto the layer input [T, H] (when given a weight)."""

    def formula(a: Named) -> Split:
        if a.get(weight) is None:
            return Split(0, 0)
        n_tokens, _, hidden = _streams(a, streams)
        return Split(0, 4 * n_tokens * hidden)

    return formula


def mhc_pre(streams: str = "residual", iters: str = "sinkhorn_repeat",
            collapse_with: str | None = None, norm: str = "norm_weight",
            fn: str = "fn") -> Builder:
    """Pre: projection (its width ``fn``'s, so a narrower model-entry input is counted
    as such), Sinkhorn, collapse (the delayed variants: only with a carried ``pre_mix``;
    at the model's entry the first stream is taken as is), the fused norm if any."""

    def formula(a: Named) -> Split:
        parts = [hc_projection(streams, fn)(a), hc_sinkhorn(streams, iters)(a),
                 hc_norm(streams, norm)(a)]
        if collapse_with is None or a.get(collapse_with) is not None:
            parts.append(hc_collapse(streams)(a))
        return reduce(Split.plus, parts)

    return formula


def post_then(pre: Builder, streams: str = "residual", post_if: str | None = None) -> Builder:
    """A post block (``post_if``: only when that argument is given) fused before ``pre``."""

    def formula(a: Named) -> Split:
        out = pre(a)
        if post_if is None or a.get(post_if) is not None:
            out = out.plus(hc_post(streams)(a))
        return out

    return formula


def hc_head(streams: str = "hs_flat", fn: str = "fn") -> Builder:
    """The final collapse: gates from the projection, then the weighted sum."""
    return lambda a: hc_projection(streams, fn)(a).plus(hc_collapse(streams)(a))


