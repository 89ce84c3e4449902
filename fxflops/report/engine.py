"""The engine's own figures beside the measured ones: vLLM's analytic estimate of each step
(``--enable-mfu-metrics``) against the FLOPs of the graphs that ran, component by
component; speculative decoding's drafts, acceptances and the target FLOPs the rejected
drafts cost.

The estimate is per scheduled size, the measured rows per forward size (padded up to a
CUDA-graph size on a GPU): a forward row is compared with the estimate rows of the sizes it
served (``scheduled``), per step. vLLM's keys are grouped into what fxflops can tell apart
in a graph:

- ``attention``: the two products over (query, key) pairs (``*.attn_qk``, ``*.attn_av``),
  which fxflops counts at run time from the real lengths, causally;
- ``moe``: the routed experts (``ffn.routed_ffn``), in the graph the MoE op's FLOPs;
- ``lm_head``: ``unembed.*``, which runs outside vLLM's compiled graphs;
- ``rest``: the projections and the dense and shared FFNs.

The headline ratio is measured over estimated with the LM head aside (the graphs cannot
hold it); a component that differs by more than ``TOLERANCE`` of that is named with the
likely reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fxflops.cost.graph_cost import evaluate

if TYPE_CHECKING:
    from fxflops.recording.engine_stats import EngineStats, EstimateRow
    from fxflops.recording.store import Recorder

# measured against estimated, per component and for the whole: a difference above this
# share of the estimate (LM head aside) is named
TOLERANCE = 0.01
COMPONENTS = ("attention", "moe", "rest", "lm_head")
WHY = {
    "attention": "vLLM counts attention as every query against its whole context (prefill "
                 "and verified drafts too); fxflops counts the causal pairs",
    "moe": "the experts' FLOPs differ (gathered or routed tokens, expert sizes)",
    "rest": "the projections or dense FFNs differ (layers the estimate does not model, or "
            "a graph that holds more or less than the model)",
    "lm_head": "vLLM counts the LM head, which runs outside the compiled graphs",
}


def component_of(key: str) -> str:
    """The group of one of vLLM's breakdown keys (``"attn.attn_qk"``, ``"unembed.unembed"``)."""
    if key.startswith("unembed"):
        return "lm_head"
    if key.endswith(("attn_qk", "attn_av")):
        return "attention"
    if key.endswith("routed_ffn"):
        return "moe"
    return "rest"


def is_moe_op(op: str) -> bool:
    """An op that runs a mixture of experts (vLLM's ``moe_forward``, ``_C::cpu_fused_moe``,
    ``_C::fused_experts_cpu``, ...)."""
    name = op.lower()
    return "moe" in name or "experts" in name


def _moe_flops_at(rec: Recorder, size: Any) -> int:
    """The MoE ops' matmul FLOPs of one forward at ``size``: every graph with a row there."""
    total = 0
    for g in rec.graphs_snapshot():
        row = g.rows.get(size) if not isinstance(size, str) else None
        if row is None:
            row = next((r for r in g.all_rows() if r.size == size), None)
        if row is None or row.cost is None:
            continue
        binding = dict(zip(g.cost.symbols, row.key))
        total += sum(evaluate(r.matmul_flops, binding) for op, r in g.cost.by_op().items()
                     if is_moe_op(op))
    return total


def _estimate_per_step(rows: list[EstimateRow]) -> tuple[int, dict[str, float]]:
    steps = sum(r.steps for r in rows)
    parts = dict.fromkeys(COMPONENTS, 0.0)
    for r in rows:
        for key, value in r.by_component.items():
            parts[component_of(key)] += value
    parts = {k: v / steps for k, v in parts.items()} if steps else parts
    parts["total"] = sum(r.flops for r in rows) / steps if steps else 0.0
    return steps, parts


def compare(measured: dict[str, float], estimate: dict[str, float]) -> dict[str, Any]:
    """Ratio (LM head aside) and the components that differ, with why."""
    body = estimate["total"] - estimate["lm_head"]
    total = sum(measured[k] for k in COMPONENTS)
    differs = [{"component": k, "measured": measured[k], "estimate": estimate[k], "why": WHY[k]}
               for k in COMPONENTS
               if abs(measured[k] - estimate[k]) > TOLERANCE * max(body, 1.0)]
    return {"ratio": total / body if body > 0 else None,
            "agrees": bool(body > 0 and abs(total - body) <= TOLERANCE * body),
            "differs": differs}


def estimate_comparison(rec: Recorder, forward: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per forward row (the report's ``forward``): measured and estimated FLOPs per step by
    component, their ratio and what differs; and ``"all"``, over every row compared. None
    where no graph was compiled (nothing measured to set beside it)."""
    if not rec.graphs_snapshot():
        return []
    estimates = {r.size: r for r in rec.engine.estimates_snapshot()}
    out = []
    measured_sum = dict.fromkeys(COMPONENTS, 0.0)
    estimate_sum = dict.fromkeys((*COMPONENTS, "total"), 0.0)
    n = m = 0  # steps measured, steps estimated
    for fig in forward:
        served = [estimates[int(n)] for n in fig.get("scheduled") or {str(fig["size"]): 1}
                  if int(n) in estimates]
        steps, estimate = _estimate_per_step(served)
        if not steps or not fig["calls"]:
            continue
        moe = _moe_flops_at(rec, fig["size"])
        attention = float(fig["runtime_flops"])
        measured = {"attention": attention, "moe": float(moe),
                    "rest": float(fig["matmul_flops"]) - attention - moe, "lm_head": 0.0}
        out.append({"size": fig["size"], "steps": fig["calls"], "estimate_steps": steps,
                    "measured": measured, "estimate": estimate,
                    **compare(measured, estimate)})
        for k in COMPONENTS:
            measured_sum[k] += measured[k] * fig["calls"]
            estimate_sum[k] += estimate[k] * steps
        estimate_sum["total"] += estimate["total"] * steps
        n += fig["calls"]
        m += steps
    if out:
        measured = {k: v / n for k, v in measured_sum.items()}
        estimate = {k: v / m for k, v in estimate_sum.items()}
        out.append({"size": "all", "steps": n, "estimate_steps": m, "measured": measured,
                    "estimate": estimate, **compare(measured, estimate)})
    return out


def spec_decode_figures(engine: EngineStats, forward: list[dict[str, Any]]
                        ) -> dict[str, Any] | None:
    """Drafts proposed and accepted, and what the rejected ones cost the target: its FLOPs
    per scheduled token over the run's forwards (every step's, drafts verified included)
    times the rejected tokens."""
    spec = engine.spec_decode
    if not spec.drafts:
        return None
    flops = sum(f["total_flops"] for f in forward)
    tokens = sum(f.get("scheduled_tokens") or f["size"] * f["calls"] for f in forward
                 if isinstance(f["size"], int))
    per_token = flops / tokens if tokens else None
    return {"drafts": spec.drafts, "proposed": spec.proposed, "accepted": spec.accepted,
            "rejected": spec.rejected, "acceptance_rate": spec.accepted / spec.proposed,
            "mean_proposed": spec.proposed / spec.drafts,
            "mean_accepted": spec.accepted / spec.drafts,
            "rejected_flops": int(per_token * spec.rejected) if per_token is not None else None,
            "flops_per_scheduled_token": per_token}


def engine_section(rec: Recorder, forward: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The report's ``engine`` section (None: the engine said nothing)."""
    engine = rec.engine
    estimates = engine.estimates_snapshot()
    spec = spec_decode_figures(engine, forward)
    if not estimates and spec is None:
        return None
    out: dict[str, Any] = {}
    if estimates:
        out["estimate"] = [{"size": r.size, "steps": r.steps, "flops": r.flops,
                            "read_bytes": r.read_bytes, "write_bytes": r.write_bytes,
                            "components": dict(sorted(r.by_component.items()))}
                           for r in estimates]
        out["estimate_vs_measured"] = estimate_comparison(rec, forward)
    if spec is not None:
        out["spec_decode"] = spec
    return out
