"""The whole forward of each vLLM step: timed per (padded) token count, with the step's
attention pairs and KV-cache tokens counted from the runner's host-side arrays.

vLLM has two model runners, and both are hooked:

- **V1** (``vllm/v1/worker/gpu_model_runner.py``, the CPU runner included): the forward is
  ``GPUModelRunner._model_forward``, called inside the step's forward context; the batch is
  ``runner.input_batch`` and ``runner.query_start_loc.np``. Its dummy and profile runs call
  the model directly, never ``_model_forward``.
- **V2** (``vllm/v1/worker/gpu/model_runner.py``, vLLM's default on a GPU): the forward is
  written inline in ``execute_model``. ``StepTimingCollector.record_batch(input_batch, ...)``
  is called exactly once per step, after the inputs are prepared and right before the
  forward (the FULL CUDA-graph replay, the piecewise or the eager one): the row and the
  clock start there, from ``input_batch.query_start_loc_np`` and
  ``num_computed_tokens_np``; they stop when ``execute_model`` returns. A dummy run
  (``dummy_run=True``) counts nothing.

Nothing here reads the device: the lengths are numpy arrays vLLM keeps on the host, and a
GPU is timed by CUDA events read later (``fxflops.recording.cuda_events``).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from fxflops.integrations.vllm.hooks import _patch, arguments
from fxflops.integrations.vllm.uncompiled import uncounted_forward
from fxflops.recording.clocks import clock_for
from fxflops.recording.recorder import recorder
from fxflops.recording.runtime_costs import charge_runtime, coster
from fxflops.recording.size_stats import RuntimeCounts
from fxflops.util import warn_once

_state = threading.local()

# --- attention: pairs and context tokens of the step -------------------------------------


def window_pairs(query_lens: Any, context_lens: Any, window: int | None = None) -> int:
    """(query, key) pairs of causal attention, summed over requests, with a sliding window.

    A request with ``q`` new tokens after ``c`` cached ones: new token ``i`` (0-based) sees
    ``c + i + 1`` keys, at most ``window`` of them. Without a window that is
    ``q * c + q * (q + 1) / 2`` pairs; with one, the keys seen by tokens ``c + 1 .. c + q``,
    each capped at the window.
    """
    import numpy as np

    q = np.asarray(query_lens, dtype=np.int64)
    c = np.asarray(context_lens, dtype=np.int64)
    full = q * c + q * (q + 1) // 2
    if window is None:
        return int(full.sum())
    lo, hi, w = c + 1, c + q, int(window)
    partial = (lo + w) * (w - lo + 1) // 2 + (hi - w) * w  # lo <= w < hi
    pairs = np.where(hi <= w, full, np.where(lo > w, q * w, partial))
    return int(pairs.sum())


def context_tokens(query_lens: Any, context_lens: Any, window: int | None = None) -> int:
    """KV-cache tokens attention reads, summed over requests: each request's context after
    this step (``c + q``), at most ``window``."""
    import numpy as np

    total = np.asarray(context_lens, dtype=np.int64) + np.asarray(query_lens, dtype=np.int64)
    if window is not None:
        total = np.minimum(total, int(window))
    return int(total.sum())


def current_counts(window: int | None) -> tuple[int, int] | None:
    """The current forward's (pairs, context tokens) with ``window``; computed once per
    window per forward (a model's layers share one or two windows)."""
    cache = getattr(_state, "counts", None)
    if cache is None:
        return None
    got = cache.get(window)
    if got is None:
        q, c = _state.lengths
        got = cache[window] = (window_pairs(q, c, window), context_tokens(q, c, window))
    return got


def layer_window(layer: str | None) -> int | None:
    """A layer's sliding window (None: it attends to the whole context), looked up in the
    layers of the runner of the current step (V2's FULL CUDA-graph steps set no forward
    context), else in vLLM's forward context."""
    if layer is None:
        return None
    layers = getattr(_state, "layers", None)
    if layers is None:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return None
        layers = get_forward_context().no_compile_layers
    window = getattr(layers.get(layer), "sliding_window", None)
    return int(window) if window else None


def layer_cache_bytes(layer: str | None) -> int | None:
    """Bytes a context token of ``layer`` takes in its KV cache (the cache's dtype and
    packing), from the layer of the current step's runner; None: not known here (the
    graph's own count, in the model's dtype, stands)."""
    from fxflops.integrations.vllm.formulas.ops import kv_cache_bytes_per_token

    layers = getattr(_state, "layers", None)
    if layer is None or layers is None:
        return None
    return kv_cache_bytes_per_token(layers.get(layer), getattr(_state, "config", None))


def attention_layers(runner: Any) -> list[tuple[str, str | None, int, int]]:
    """The run-time terms of the target's attention layers (``attention_terms``): its own
    model's (the forward context also holds a speculative decoder's drafter layers, which
    the target never runs)."""
    import torch

    try:
        model = runner.get_model()
    except Exception:
        model = None
    own = {id(m) for m in model.modules()} if isinstance(model, torch.nn.Module) else None
    return attention_terms(runner.vllm_config, runner.model_config.dtype,
                           lambda _name, layer: own is None or id(layer) in own)


def attention_terms(vllm_config: Any, dtype: Any, keep: Callable[[str, Any], bool]
                    ) -> list[tuple[str, str | None, int, int]]:
    """("attention", layer name, FLOPs per pair, KV bytes per context token) of the
    attention layers of this rank's forward context that ``keep(name, layer)``, read off
    the layers themselves (whole-forward rows: attention runs outside piecewise graphs);
    the arithmetic is ``formulas.ops``'."""
    import torch

    from fxflops.integrations.vllm.formulas.ops import attention_costs

    layers = vllm_config.compilation_config.static_forward_context
    elem = torch.empty((), dtype=dtype).element_size()
    terms: list[tuple[str, str | None, int, int]] = []
    for name, layer in layers.items():
        if not keep(name, layer):  # another model's layer
            continue
        costs = attention_costs(layer, elem, vllm_config)
        if costs is not None:
            terms.append(("attention", name, *costs))
    return terms


def other_ranks_tokens(window: int | None = None) -> tuple[int, int] | None:
    """The tokens the other data-parallel ranks send this rank's experts this step: vLLM's
    per-rank counts (``dp_metadata.num_tokens_across_dp_cpu``, a host tensor) less this
    rank's own; None without data parallelism (or outside a step). Once per step."""
    cache = getattr(_state, "counts", None)
    if cache is None:
        return None
    got = cache.get("dp", False)
    if got is False:
        got = cache["dp"] = _other_ranks_tokens()
    return got


def _other_ranks_tokens() -> tuple[int, int] | None:
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    dp = getattr(get_forward_context(), "dp_metadata", None)
    config = getattr(_state, "config", None)
    if dp is None or config is None:
        return None
    counts = [int(n) for n in dp.num_tokens_across_dp_cpu.tolist()]
    rank = int(getattr(config.parallel_config, "data_parallel_rank", 0) or 0)
    if len(counts) < 2 or rank >= len(counts):
        return None
    return sum(counts) - counts[rank], 0


def install_attention_coster() -> None:
    """The run-time costers a step feeds: attention (pairs and KV tokens, per window) and
    a MoE's tokens from the other data-parallel ranks."""
    from fxflops.integrations.vllm.formulas.ops import DP_TOKENS

    attention = coster("attention")
    attention.counts = current_counts
    attention.window_of = layer_window
    attention.bytes_of = layer_cache_bytes
    coster(DP_TOKENS).counts = other_ranks_tokens


# --- one step ---------------------------------------------------------------------------


def _replays() -> int:
    """CUDA-graph replays of instrumented graphs so far (0 where no CUDA clock exists)."""
    timing = sys.modules.get("fxflops.recording.cuda_events")
    return timing.replays() if timing is not None else 0


def count_lengths(vllm_config: Any, query_lens: Any, context_lens: Any) -> None:
    """Attention nodes that run from now on (until ``end_step``) count these requests'
    lengths: a step's (``begin_step``), or a drafter pass's (``drafter``)."""
    _state.lengths, _state.counts = (query_lens, context_lens), {}
    _state.layers = vllm_config.compilation_config.static_forward_context
    _state.config = vllm_config


def begin_step(runner: Any, tokens: int, query_lens: Any, context_lens: Any) -> Any:
    """The whole-forward row of a step of ``tokens`` (padded) tokens, its attention charged
    from the requests' query and cached lengths; the step's counts are set for the graphs'
    attention nodes until ``end_step``."""
    count_lengths(runner.vllm_config, query_lens, context_lens)
    _state.replays = _replays()
    row = recorder().forward_row(tokens)
    # the tokens the scheduler gave this step: the padding is the rest (padding waste)
    scheduled = int(query_lens.sum())
    with row.lock:
        if row.forward is not None:  # (a whole forward's row: always)
            row.forward.note_scheduled(scheduled)
    try:  # what vLLM says of the step: never in the way of the step's own figures
        uncounted = uncounted_forward(runner)
        if uncounted is not None:
            uncounted.count()
            return row  # (no graph: attention is not counted alone either)
        if getattr(runner, "_fxflops_perf", False) is not None:  # (None: estimate off)
            from fxflops.integrations.vllm.engine_stats import estimate_step

            estimate_step(runner, tokens, query_lens, context_lens)
    except Exception as e:
        warn_once("vllm-engine-step", "fxflops: vLLM's own figures of a step not read "
                  "(%s: %s)", type(e).__name__, e)
    if row.runtime is None:
        row.runtime = RuntimeCounts(attention_layers(runner) + moe_dp_terms(), by_kind=True)
    charge_runtime(row)
    return row


def moe_dp_terms() -> list[tuple[str, str | None, Any, Any]]:
    """The forward's MoE layers that take tokens from other data-parallel ranks (their
    graphs' run-time terms, each layer once: a model compiled per size range holds it in
    each range's graph); a drafter's are not the forward's."""
    from fxflops.integrations.vllm.formulas.ops import DP_TOKENS

    terms: dict[Any, tuple[str, str | None, Any, Any]] = {}
    for g in recorder().graphs_snapshot():
        if g.meta.get("workload") == "draft":
            continue
        for kind, layer, flops, bytes_ in g.runtime_terms():
            if kind == DP_TOKENS:
                terms.setdefault(layer, (kind, layer, flops, bytes_))
    return list(terms.values())


def forward_done(row: Any) -> None:
    """(After a step's forward.) A step that replayed any CUDA graph (FULL, or piecewise
    pieces: V1 and V2 alike) ran as a graph replay: ``captured``."""
    if _replays() != getattr(_state, "replays", 0):
        with row.lock:
            row.forward.captured += 1


def end_step() -> None:
    _state.counts = _state.lengths = _state.layers = _state.config = None


def clock_of(runner: Any) -> Any:
    """The runner's clock (``recording/clocks.py``): CUDA events on a GPU (made once per
    runner), else the CPU's."""
    timer = getattr(runner, "_fxflops_timer", None)
    if timer is None:
        timer = clock_for(getattr(runner.device, "type", "cpu"))
        runner._fxflops_timer = timer
    return timer


# --- V1: _model_forward -----------------------------------------------------------------


def batch_lengths(runner: Any) -> tuple[Any, Any]:
    """(query lengths, cached lengths) per request of the V1 runner's batch, from its
    host-side arrays only (never a device read)."""
    batch = runner.input_batch
    n = int(batch.num_reqs)
    starts = runner.query_start_loc.np[: n + 1]
    return starts[1:] - starts[:-1], batch.num_computed_tokens_cpu[:n]


def _v1_tokens(named: dict[str, Any]) -> int | None:
    """The step's (padded) token count; None for profiling and dummy runs, which have no
    attention metadata (vLLM skips them too)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    ctx = get_forward_context() if is_forward_context_available() else None
    if ctx is None or ctx.attn_metadata is None:
        return None
    ids: Any = named.get("positions")
    if ids is None:
        ids = named["input_ids"]
    return int(ids.shape[-1])  # padded up to a captured size under CUDA graphs


def _timed_forward(original: Any) -> Any:
    def _model_forward(*args: Any, **kwargs: Any) -> Any:
        token = None
        try:
            named = arguments(original, args, kwargs)
            runner = named["self"]
            tokens = _v1_tokens(named)
            if tokens is not None:
                row = begin_step(runner, tokens, *batch_lengths(runner))
                token = clock_of(runner).start(row)
        except Exception as e:  # (``token`` is still None: nothing is timed)
            warn_once("vllm-forward", "fxflops: whole-forward timing off (%s: %s)",
                      type(e).__name__, e)
        try:
            if token is None:  # (a dummy run, or fxflops failed): counts nothing either
                end_step()
            out = original(*args, **kwargs)
            if token is not None:
                row = token.row  # (before stop: a read pair goes back to the pool, reused)
                clock_of(named["self"]).stop(token)
                forward_done(row)
            return out
        finally:
            end_step()

    return functools.wraps(original)(_model_forward)


# --- V2: execute_model + StepTimingCollector.record_batch ---------------------------------


def _v2_record_batch(named: dict[str, Any], _result: Any) -> None:
    """Right before V2's forward: the step's row, and its clock started."""
    step = getattr(_state, "v2_step", None)
    if step is None or step.get("dummy") or "token" in step:
        return
    batch = named["input_batch"]
    runner = step["runner"]
    row = begin_step(runner, int(batch.num_tokens_after_padding), *v2_batch_lengths(batch))
    step["token"] = clock_of(runner).start(row)


def v2_batch_lengths(batch: Any) -> tuple[Any, Any]:
    """(query lengths, cached lengths) per request of a V2 ``InputBatch``, from its host
    arrays only."""
    n = int(batch.num_reqs)
    starts = batch.query_start_loc_np[: n + 1]
    return starts[1:] - starts[:-1], batch.num_computed_tokens_np[:n]


def _v2_execute_model(original: Any) -> Any:
    def execute_model(*args: Any, **kwargs: Any) -> Any:
        step: dict[str, Any] | None = None
        try:
            named = arguments(original, args, kwargs)
            step = {"runner": named["self"], "dummy": bool(named.get("dummy_run"))}
        except Exception as e:
            warn_once("vllm-forward-v2", "fxflops: whole-forward timing off (%s: %s)",
                      type(e).__name__, e)
        _state.v2_step = step
        try:
            out = original(*args, **kwargs)
            token = step.get("token") if step else None
            if token is not None:
                row = token.row  # (before stop: a read pair goes back to the pool, reused)
                clock_of(step["runner"]).stop(token)  # type: ignore[index]
                forward_done(row)
            return out
        finally:
            _state.v2_step = None
            end_step()

    return functools.wraps(original)(execute_model)


def install_forward_timing_v1() -> None:
    """Hook the V1 runner's forward (feature "whole forward (V1 runner)")."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _patch(GPUModelRunner, "_model_forward", "forward", _timed_forward)


def install_forward_timing_v2() -> None:
    """Hook the V2 runner's step (feature "whole forward (V2 runner)")."""
    from vllm.v1.worker.gpu import async_utils
    from vllm.v1.worker.gpu import model_runner as v2

    from fxflops.integrations.vllm.hooks import passthrough

    _patch(v2.GPUModelRunner, "execute_model", "forward", _v2_execute_model)
    _patch(async_utils.StepTimingCollector, "record_batch", "forward",
           lambda original: passthrough(original, after=_v2_record_batch,
                                        what="whole forward (V2 runner)"))
