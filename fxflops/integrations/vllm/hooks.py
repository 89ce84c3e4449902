"""What the plugin changes in a vLLM process, each hook small and idempotent.

- whole forward: ``GPUModelRunner._model_forward`` (CPU runner included) is timed per
  padded token count, like ``VLLM_LOG_BATCHSIZE_INTERVAL`` but without synchronising
  (CPU clock on CPU; CUDA events on GPU) and with bounded memory;
- attention: the causal (query, key) pairs of the batch, computed once per forward from the
  runner's host-side arrays (no device read), feed ``vllm::unified_attention*`` FLOPs;
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
from fxflops.recording import recorder
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


def causal_pairs(query_lens: Any, context_lens: Any) -> int:
    """(query, key) pairs of causal attention, summed over requests.

    A request with ``q`` new tokens after ``c`` cached ones: new token ``i`` (0-based) sees
    ``c + i + 1`` keys, so it has ``q * c + q * (q + 1) / 2`` pairs.
    """
    total = 0
    for q, c in zip(query_lens, context_lens):
        q, c = int(q), int(c)
        total += q * c + q * (q + 1) // 2
    return total


def batch_pairs(runner: Any) -> int | None:
    """Pairs of the batch being run, from host-side arrays only (never a device read)."""
    batch = runner.input_batch
    n = int(batch.num_reqs)
    if n == 0:
        return 0
    starts = runner.query_start_loc.np[: n + 1]
    query_lens = starts[1:] - starts[:-1]
    return causal_pairs(query_lens, batch.num_computed_tokens_cpu[:n])


def attention_coeff(runner: Any) -> int:
    """FLOPs per pair of all attention layers of this rank: 2*(H*D) for QK^T + 2*(H*D) for PV."""
    mc, pc = runner.model_config, runner.parallel_config
    heads = mc.get_num_attention_heads(pc)
    layers = mc.get_num_layers(pc)
    return layers * 4 * heads * mc.get_head_size()


def current_pairs() -> int | None:
    return getattr(_state, "pairs", None)


def install_attention_coster() -> None:
    recorder().coster("attention").pairs = current_pairs


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
    tokens = int(ids.shape[-1])
    _state.pairs = batch_pairs(runner)
    row = recorder().forward_row(tokens)
    if _state.pairs is not None:
        if not row.runtime_coeff:
            row.runtime_coeff = attention_coeff(runner)
        row.runtime_flops += row.runtime_coeff * _state.pairs
        row.runtime_calls += 1
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
        if row is None:
            return original(*args, **kwargs)
        try:
            if timer is not None:
                return timer.time_call(lambda: original(*args, **kwargs), (), row)
            t0 = time.perf_counter_ns()
            out = original(*args, **kwargs)
            row.add(time.perf_counter_ns() - t0)
            return out
        finally:
            _state.pairs = None

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
