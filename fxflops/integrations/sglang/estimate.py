"""SGLang's own FLOPs and bytes estimate (``--enable-mfu-metrics`` with ``--enable-metrics``),
kept beside the measured rows.

SGLang (0.5.23) estimates each step in its scheduler
(``managers/scheduler_components/metrics_reporter.py``, ``SchedulerMetricsReporter``) and
exports it as ``sglang:estimated_flops_per_gpu_total`` and read/write byte counters. Its
formula, per GPU (``_init_estimated_perf_constants``): every layer a dense Llama-type
block, ``2·h·d·(H + 2·KV) + 2·h·d·H`` for the attention projections and ``6·h·I`` for the
MLP per token (``I`` the config's ``intermediate_size``), plus ``4·H·d·L`` per (query, key)
pair (decode: each token against its whole sequence; prefill: causal pairs). The plugin
records SGLang's own result of each step (``record_step``, after SGLang's
``_estimate_decode_perf`` / ``_estimate_prefill_perf``), split by SGLang's own constants
into ``attention`` (the pair products) and ``rest`` (``components``), per step's tokens.

Where it differs from what the graphs run (``WHY``, and ``side_by_side`` per compiled
size): no LM head, though SGLang's compiled forward holds it (its logits processor runs
inside ``model.forward``); no MoE (a MoE layer counted as one dense MLP of
``intermediate_size``); no MLA (queries and keys of ``head_dim``, no low-rank
projections); and no device peak, so SGLang exports FLOPs, never an MFU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fxflops.recording.recorder import Recorder, recorder

# why SGLang's estimate differs from the measured FLOPs, by fxflops component
WHY = {
    "rest": "SGLang's estimate leaves out the LM head, which its compiled forward holds "
            "(the logits processor runs inside model.forward), and counts a MoE layer as "
            "one dense MLP of intermediate_size and MLA as plain attention of head_dim",
    "moe": "SGLang's estimate has no MoE: each layer one dense MLP of intermediate_size",
    "attention": "SGLang counts 4·H·d per (query, key) pair over each sequence's length "
                 "(decode) or the causal pairs (prefill), with H and d as plain attention "
                 "(no MLA, no sliding window)",
    "lm_head": "SGLang's estimate has no LM head",
}


def components(reporter: Any, flops: float, pairs: float) -> dict[str, int]:
    """SGLang's FLOPs of a step split by its own constants: the pair products (its
    ``_attn_dot_flops_coeff`` times the pairs) and the rest (projections and MLP)."""
    attention = int(round(float(reporter._attn_dot_flops_coeff) * pairs))
    return {"attention": attention, "rest": int(round(flops)) - attention}


def record_step(reporter: Any, tokens: int, pairs: float, result: Sequence[float],
                rec: Recorder | None = None) -> None:
    """One step's estimate as SGLang computed it (``result``: flops, read, write bytes),
    kept per step's tokens beside the measured rows."""
    if tokens <= 0:
        return
    flops, read, write = (float(x) for x in result)
    parts = components(reporter, flops, pairs)
    rec = rec or recorder()
    rec.engine.why = WHY
    rec.engine.estimate(tokens).add(tokens, int(round(flops)), int(round(read)),
                                    int(round(write)), dict(parts), parts)


def after_decode_estimate(result: Any, reporter: Any, batch: Any, num_tokens: Any) -> None:
    """(AFTER hook on ``SchedulerMetricsReporter._estimate_decode_perf``.)"""
    from sglang.srt.managers.scheduler_components import metrics_reporter

    tokens = max(0, int(num_tokens))
    if tokens:
        record_step(reporter, tokens, float(metrics_reporter._decode_total_seq_lens(batch)),
                    result)


def after_prefill_estimate(result: Any, reporter: Any, batch: Any) -> None:
    """(AFTER hook on ``SchedulerMetricsReporter._estimate_prefill_perf``.)"""
    from sglang.srt.managers.scheduler_components import metrics_reporter

    if batch is None or batch.extend_lens is None:
        return
    record_step(reporter, int(sum(batch.extend_lens)),
                float(metrics_reporter._prefill_attention_pairs(batch)), result)


def side_by_side(rec: Recorder | None = None) -> list[dict[str, Any]]:
    """Per compiled size that SGLang also estimated a step of: the graph's matmul FLOPs
    per call and SGLang's FLOPs per step of as many tokens, their difference, and why
    (``WHY``). A size's graphs are every graph with a row there (a graph break's parts)."""
    rec = rec or recorder()
    estimates = {r.size: r for r in rec.engine.estimates_snapshot()}
    measured: dict[int, int] = {}
    for g in rec.graphs_snapshot():
        for row in g.all_rows():
            if isinstance(row.size, int) and row.cost is not None and row.size in estimates:
                measured[row.size] = measured.get(row.size, 0) + int(row.cost.matmul_flops)
    out = []
    for size in sorted(measured):
        est = estimates[size]
        per_step = est.flops / est.steps
        out.append({"size": size, "measured_matmul_flops": measured[size],
                    "sglang_flops": per_step,
                    "sglang_components": {k: v / est.steps
                                          for k, v in est.by_component.items()},
                    "difference": measured[size] - per_step, "why": dict(WHY)})
    return out
