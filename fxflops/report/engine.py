"""The engine's own figures beside the measured ones: a serving engine's analytic estimate
of each step (its own MFU metrics) against the FLOPs of the graphs that ran, component by
component; speculative decoding's drafts, acceptances and the target FLOPs the rejected
drafts cost.

The estimate is kept per forward size (the worker evaluates it on the step it runs, beside
the forward's row), so each forward row has its own, step for step; a forward padded up to
a CUDA-graph size shows the padded tokens' share as ``padding``. The integration that
records the estimate sorts the engine's own breakdown into fxflops' components
(``recording.engine_stats.COMPONENTS``), what fxflops can tell apart in a graph:

- ``attention``: the two products over (query, key) pairs, which fxflops counts at run
  time from the real lengths, causally;
- ``moe``: the routed experts, in the graph the MoE ops' FLOPs (with the tokens other
  data-parallel ranks send them; an op that runs the shared experts beside the routed ones
  counts them too);
- ``lm_head``: the unembedding, which runs outside the compiled graphs;
- ``rest``: the projections and the dense and shared FFNs.

The headline ratio is measured over estimated with the LM head aside (the graphs cannot
hold it); a component that differs by more than ``TOLERANCE`` of that is named with the
likely reason (the engine's own, as its integration gives it, else a plain one).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fxflops.cost.graph_cost import evaluate
from fxflops.recording.engine_stats import COMPONENTS
from fxflops.report.figures import forward_graphs

if TYPE_CHECKING:
    from fxflops.recording.engine_stats import EngineStats, EstimateRow
    from fxflops.recording.recorder import Recorder
    from fxflops.recording.store import GraphRecord

# measured against estimated, per component and for the whole: a difference above this
# share of the estimate (LM head aside) is named
TOLERANCE = 0.01
# why a component may differ, where the engine's integration says nothing more precise
WHY = {
    "attention": "the estimate counts attention otherwise (every query against its whole "
                 "context, say); fxflops counts the causal pairs",
    "moe": "the experts' FLOPs differ (gathered or routed tokens, expert sizes)",
    "rest": "the projections or dense FFNs differ (layers the estimate does not model, or "
            "a graph that holds more or less than the model)",
    "padding": "the forwards ran padded up to a CUDA-graph size; the estimate counts the "
               "scheduled tokens",
    "lm_head": "the estimate counts the LM head, which runs outside the compiled graphs",
}


def is_moe_op(op: str) -> bool:
    """An op that runs a mixture of experts: its name says MoE or experts (``moe_forward``,
    ``fused_moe``, ``fused_experts``, ...)."""
    name = op.lower()
    return "moe" in name or "experts" in name


# per graph: its MoE ops' matmul FLOPs as an expression of its size symbols (made once),
# and their value per size
_MOE_AT: weakref.WeakKeyDictionary[GraphRecord, tuple[Any, dict[Any, int]]] = \
    weakref.WeakKeyDictionary()


def _moe_flops_at(rec: Recorder, size: Any) -> int:
    """The MoE ops' matmul FLOPs of one forward at ``size``: every graph of the forward (not
    a drafter's) with a row there."""
    total = 0
    for g in forward_graphs(rec):
        row = next((r for r in g.all_rows() if r.size == size), None)
        if row is None or row.cost is None:
            continue
        cached = _MOE_AT.get(g)
        if cached is None:
            expr = sum((r.matmul_flops for op, r in g.cost.by_op().items() if is_moe_op(op)), 0)
            cached = _MOE_AT[g] = (expr, {})
        expr, at = cached
        if size not in at:
            at[size] = evaluate(expr, dict(zip(g.cost.symbols, row.key)))
        total += at[size]
    return total


def _estimate_per_step(row: EstimateRow) -> dict[str, float]:
    parts = dict.fromkeys(COMPONENTS, 0.0)
    for component, value in row.by_component.items():
        parts[component] += value / row.steps
    parts["total"] = row.flops / row.steps
    return parts


def compare(measured: dict[str, float], estimate: dict[str, float],
            why: dict[str, str] | None = None) -> dict[str, Any]:
    """Ratio (LM head aside) and the components that differ, with why (``why``: the
    engine's reasons, by component; ``WHY`` where it gives none)."""
    reasons = {**WHY, **(why or {})}
    body = estimate["total"] - estimate["lm_head"]
    total = sum(measured[k] for k in COMPONENTS)
    differs = [{"component": k, "measured": measured[k], "estimate": estimate[k],
                "why": reasons[k]}
               for k in COMPONENTS
               if abs(measured[k] - estimate[k]) > TOLERANCE * max(body, 1.0)]
    return {"ratio": total / body if body > 0 else None,
            "agrees": bool(body > 0 and abs(total - body) <= TOLERANCE * body),
            "differs": differs}


def measured_components(rec: Recorder, fig: Mapping[str, Any]) -> dict[str, float]:
    """A forward row's matmul FLOPs per step by component: attention (counted at run time),
    the MoE ops (their static count and the tokens other DP ranks sent them), padding (the
    static FLOPs' share spent on padded tokens), the rest."""
    kinds = fig.get("runtime_kinds") or {"attention": fig["runtime_flops"]}
    attention = float(kinds.get("attention", 0))
    gathered = float(sum(v for k, v in kinds.items() if k != "attention"))
    static = float(fig["matmul_flops"]) - float(fig["runtime_flops"])
    share = float(fig.get("padding_flops_share") or 0.0)
    moe = float(_moe_flops_at(rec, fig["size"]))
    return {"attention": attention, "moe": moe * (1 - share) + gathered,
            "rest": (static - moe) * (1 - share), "padding": static * share, "lm_head": 0.0}


def estimate_comparison(rec: Recorder, forward: Sequence[Mapping[str, Any]]
                        ) -> list[dict[str, Any]]:
    """Per forward row (the report's ``forward``): measured and estimated FLOPs per step by
    component, their ratio and what differs; and ``"all"``, over every row compared. Empty
    where no graph was compiled (nothing measured to set beside it)."""
    if not forward_graphs(rec):
        return []
    estimates = {r.size: r for r in rec.engine.estimates_snapshot()}
    out = []
    measured_sum = dict.fromkeys(COMPONENTS, 0.0)
    estimate_sum = dict.fromkeys((*COMPONENTS, "total"), 0.0)
    steps = estimate_steps = 0
    for fig in forward:
        row = estimates.get(fig["size"])
        if row is None or not row.steps or not fig["calls"]:
            continue
        estimate = _estimate_per_step(row)
        measured = measured_components(rec, fig)
        out.append({"size": fig["size"], "steps": fig["calls"], "estimate_steps": row.steps,
                    "measured": measured, "estimate": estimate,
                    **compare(measured, estimate, rec.engine.why)})
        for k in COMPONENTS:
            measured_sum[k] += measured[k] * fig["calls"]
            estimate_sum[k] += estimate[k] * row.steps
        estimate_sum["total"] += estimate["total"] * row.steps
        steps += fig["calls"]
        estimate_steps += row.steps
    if out:
        measured = {k: v / steps for k, v in measured_sum.items()}
        estimate = {k: v / estimate_steps for k, v in estimate_sum.items()}
        out.append({"size": "all", "steps": steps, "estimate_steps": estimate_steps,
                    "measured": measured, "estimate": estimate,
                    **compare(measured, estimate, rec.engine.why)})
    return out


def spec_decode_figures(engine: EngineStats, forward: Sequence[Mapping[str, Any]]
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


def engine_section(rec: Recorder, forward: Sequence[Mapping[str, Any]]
                   ) -> dict[str, Any] | None:
    """The report's ``engine`` section (None: the engine said nothing)."""
    engine = rec.engine
    estimates = engine.estimates_snapshot()
    spec = spec_decode_figures(engine, forward)
    if not estimates and spec is None:
        return None
    out: dict[str, Any] = {}
    if estimates:
        out["estimate"] = [{"size": r.size, "steps": r.steps,
                            "scheduled_tokens": r.scheduled_tokens, "flops": r.flops,
                            "read_bytes": r.read_bytes, "write_bytes": r.write_bytes,
                            # the engine's own breakdown, by its own keys
                            "components": dict(sorted(r.by_key.items()))}
                           for r in estimates]
        out["estimate_vs_measured"] = estimate_comparison(rec, forward)
    if spec is not None:
        out["spec_decode"] = spec
    return out
