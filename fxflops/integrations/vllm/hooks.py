"""What the plugin changes in a vLLM process, each hook small and idempotent.

- whole forward: ``GPUModelRunner._model_forward`` (CPU runner included) is timed per
  padded token count, like ``VLLM_LOG_BATCHSIZE_INTERVAL`` but without synchronising
  (CPU clock on CPU; CUDA events on GPU) and with bounded memory;
- attention: the causal (query, key) pairs and KV-cache tokens of the batch, per sliding
  window, computed once per forward from the runner's host-side arrays (no device read),
  feed ``vllm::unified_attention*`` and ``vllm::unified_mla_attention*`` FLOPs and bytes;
- mode 2: ``CompilationConfig.init_backend``'s backend is wrapped by fxflops;
- mode 3: ``CompilerManager.compile`` (which both compiles and loads from vLLM's cache)
  returns instrumented piecewise graphs named by piece and compile range.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from fxflops import config
from fxflops.patching import Patch, patch_method
from fxflops.recording import charge_runtime, coster, recorder
from fxflops.util import warn_once

_state = threading.local()
# every patch this module applied, so that ``uninstall`` can undo them (newest first)
PATCHES: list[Patch] = []


def _patch(owner: Any, name: str, tag: str,
           make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    patch = patch_method(owner, name, tag, make_wrapper)
    if patch.applied:
        PATCHES.append(patch)


def uninstall() -> None:
    """Undo every patch of this module (tests; a process that wants vLLM back as it was)."""
    while PATCHES:
        PATCHES.pop().undo()


@functools.lru_cache(maxsize=64)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def arguments(fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> dict[str, Any]:
    """``fn``'s arguments by name, defaults filled in. Raises if vLLM changed the
    signature so that they no longer bind: callers read them inside their own ``try``."""
    bound = _signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def passthrough(original: Callable[..., Any],
                before: Callable[[dict[str, Any]], Any] | None = None,
                after: Callable[[dict[str, Any], Any], Any] | None = None,
                what: str = "") -> Callable[..., Any]:
    """A wrapper that calls ``original`` with exactly the arguments it was given.

    ``before(arguments)`` and ``after(arguments, result)`` read what fxflops needs by name,
    each in its own ``try``: a failure there (vLLM changed, fxflops broke) is warned once and
    never reaches vLLM. ``after`` may return a replacement result (None keeps vLLM's).
    """

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        named: dict[str, Any] | None = None
        try:
            named = arguments(original, args, kwargs)
            if before is not None:
                before(named)
        except Exception as e:
            warn_once(f"vllm-hook:{what}", "fxflops: %s not instrumented (%s: %s)", what,
                      type(e).__name__, e)
            named = None
        result = original(*args, **kwargs)
        if named is None or after is None:
            return result
        try:
            replaced = after(named, result)
        except Exception as e:
            warn_once(f"vllm-hook:{what}", "fxflops: %s not instrumented (%s: %s)", what,
                      type(e).__name__, e)
            return result
        return result if replaced is None else replaced

    return wrapper


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


def batch_lengths(runner: Any) -> tuple[Any, Any]:
    """(query lengths, cached lengths) per request of the batch being run, from the runner's
    host-side arrays only (never a device read)."""
    batch = runner.input_batch
    n = int(batch.num_reqs)
    starts = runner.query_start_loc.np[: n + 1]
    return starts[1:] - starts[:-1], batch.num_computed_tokens_cpu[:n]


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
    """A layer's sliding window (None: it attends to the whole context)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if layer is None or not is_forward_context_available():
        return None
    module = get_forward_context().no_compile_layers.get(layer)
    window = getattr(module, "sliding_window", None)
    return int(window) if window else None


def attention_layers(runner: Any) -> list[tuple[str, str | None, int, int]]:
    """("attention", layer name, FLOPs per pair, KV bytes per context token) of every
    attention layer of this rank, from the layers themselves (whole-forward rows: attention
    runs outside piecewise graphs). Standard attention: ``2·H·D`` (QK^T) + ``2·H·D_v``
    (PV) per pair, K and V per context token; MLA: see ``formulas_vllm``."""
    import torch

    layers = runner.vllm_config.compilation_config.static_forward_context
    elem = torch.empty((), dtype=runner.model_config.dtype).element_size()
    terms: list[tuple[str, str | None, int, int]] = []
    for name, layer in layers.items():
        heads = getattr(layer, "num_heads", None)
        if heads is None or not hasattr(layer, "impl"):
            continue
        if hasattr(layer, "kv_lora_rank"):  # MLA
            qk = layer.qk_nope_head_dim + layer.qk_rope_head_dim
            per_pair = 2 * heads * qk + 2 * heads * layer.v_head_dim
            per_token = (layer.kv_lora_rank + layer.qk_rope_head_dim) * elem
        else:
            d, dv = layer.head_size, getattr(layer, "head_size_v", layer.head_size)
            per_pair = 2 * heads * d + 2 * heads * dv
            per_token = layer.num_kv_heads * (d + dv) * elem
        terms.append(("attention", name, per_pair, per_token))
    return terms


def install_attention_coster() -> None:
    attention = coster("attention")
    attention.counts = current_counts
    attention.window_of = layer_window


def install_forward_timing() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _patch(GPUModelRunner, "_model_forward", "forward", _timed_forward)
    _note_rank()


def _forward_row(runner: Any, named: dict[str, Any]) -> Any:
    """The whole-forward row of this step (None for profiling and dummy runs, which have
    no attention metadata: vLLM skips them too); sets the step's attention pairs."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    ctx = get_forward_context() if is_forward_context_available() else None
    if ctx is None or ctx.attn_metadata is None:
        return None
    ids: Any = named.get("positions")
    if ids is None:
        ids = named["input_ids"]
    tokens = int(ids.shape[-1])  # padded up to a captured size under CUDA graphs
    _state.lengths, _state.counts = batch_lengths(runner), {}
    row = recorder().forward_row(tokens)
    # the tokens the scheduler gave this step: the padding is the rest (padding waste)
    row.note_scheduled(int(_state.lengths[0].sum()))
    mode = getattr(ctx, "cudagraph_runtime_mode", None)
    if mode is not None and getattr(mode, "name", "NONE") != "NONE":
        row.captured += 1
    if not row.runtime_terms:
        row.runtime_terms = attention_layers(runner)
    charge_runtime(row)
    return row


def _timed_forward(original: Any) -> Any:
    def _model_forward(*args: Any, **kwargs: Any) -> Any:
        row = None
        try:
            named = arguments(original, args, kwargs)
            row = _forward_row(named["self"], named)
            timer = _forward_timer(named["self"]) if row is not None else None
        except Exception as e:
            warn_once("vllm-forward", "fxflops: whole-forward timing off (%s: %s)",
                      type(e).__name__, e)
            row = None
        try:
            if row is None:  # (a dummy run, or fxflops failed): counts nothing either
                _state.counts = None
                return original(*args, **kwargs)
            if timer is not None:
                return timer.time_call(lambda: original(*args, **kwargs), (), row)
            t0 = time.perf_counter_ns()
            out = original(*args, **kwargs)
            row.add(time.perf_counter_ns() - t0)
            return out
        finally:
            _state.counts = None

    return functools.wraps(original)(_model_forward)


def _forward_timer(runner: Any) -> Any:
    timer = getattr(runner, "_fxflops_timer", False)
    if timer is False:
        from fxflops.backends import make_timer

        timer = make_timer(getattr(runner.device, "type", "cpu"))
        runner._fxflops_timer = timer
    return timer


def _rank() -> int | None:
    try:
        from vllm.distributed import parallel_state

        if parallel_state.model_parallel_is_initialized():
            return parallel_state.get_tensor_model_parallel_rank()
    except Exception:
        pass
    return None


def _note_rank() -> None:
    rank = _rank()
    if rank is not None:
        recorder().info["rank"] = rank


def install_flush_at_shutdown() -> None:
    from vllm.v1.executor import multiproc_executor

    def wrap(original: Any) -> Any:
        return passthrough(original, before=lambda named: recorder().flush(),
                           what="flush at worker shutdown")

    _patch(multiproc_executor.WorkerProc, "shutdown", "flush", wrap)


def note_vllm_config(vllm_config: Any) -> None:
    """What fxflops takes from vLLM's config: the rank, and where depyf dumps graphs
    (``debug_dump_path``), so the annotated dumps land beside vLLM's own."""
    _note_rank()
    try:
        path = vllm_config.compile_debug_dump_path()
    except Exception:
        path = None
    if path:
        os.environ[config.DUMP_DIR.name] = os.path.join(str(path), "fxflops")


def install_mode2_backend() -> None:
    """FXFLOPS=1 with mode 2 and a non-fxflops backend: wrap the backend vLLM resolves."""
    from vllm.config import compilation

    modes = (compilation.CompilationMode.STOCK_TORCH_COMPILE,
             compilation.CompilationMode.DYNAMO_TRACE_ONCE)

    def wrap_backend(named: dict[str, Any], backend: Any) -> Any:
        config = named["self"]
        note_vllm_config(named["vllm_config"])
        if config.mode in modes and config.backend != "fxflops":
            import fxflops

            return fxflops.backend(inner=backend, name="model{index}")
        return None

    def wrap(original: Any) -> Any:
        return passthrough(original, after=wrap_backend, what="mode-2 backend")

    _patch(compilation.CompilationConfig, "init_backend", "mode2", wrap)


def install_piecewise_compiler() -> None:
    """Mode 3: every piecewise graph vLLM compiles, or loads from its cache, is instrumented.
    ``CompilerManager.compile`` does both (it calls ``load`` first); wrapping it alone
    instruments each graph once."""
    from vllm.compilation import backends

    def wrap(original: Any) -> Any:
        return passthrough(original, after=_instrument_piece, what="piecewise graph")

    _patch(backends.CompilerManager, "compile", "piecewise", wrap)


def _instrument_piece(named: dict[str, Any], compiled: Any) -> Any:
    """Analyse one piecewise graph and wrap its compiled callable, like any other graph."""
    from fxflops.backends import instrument, plan

    _note_rank()
    graph, compile_range = named["graph"], named["compile_range"]
    graph_index, num_graphs = named.get("graph_index", 0), named.get("num_graphs", 1)
    start, end = int(compile_range.start), int(compile_range.end)
    single = start == end
    name = f"piece{graph_index}of{num_graphs}:" + (f"size{start}" if single
                                                  else f"range[{start},{end}]")
    meta: dict[str, Any] = {"inner": "vllm-piecewise", "piece": graph_index,
                            "pieces": num_graphs, "compile_range": [start, end]}
    if single:
        meta["compile_size"] = start
    graph_plan = plan(graph, named["example_inputs"])
    if single:
        graph_plan.static_size = start
    return instrument(compiled, graph_plan, name, meta, gm=graph)
