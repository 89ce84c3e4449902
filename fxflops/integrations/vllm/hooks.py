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

import logging
import os
import threading
import time
from typing import Any

from fxflops.analysis import warn_once
from fxflops.patching import patch_method
from fxflops.recording import recorder

log = logging.getLogger("fxflops")
_state = threading.local()


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

    patch_method(GPUModelRunner, "_model_forward", "forward", _timed_forward)
    _note_rank()


def _timed_forward(original: Any) -> Any:
    def _model_forward(self: Any, input_ids: Any = None, positions: Any = None, *args: Any,
                       **kwargs: Any) -> Any:
        try:
            from vllm.forward_context import get_forward_context, is_forward_context_available

            ctx = get_forward_context() if is_forward_context_available() else None
            # profiling and dummy runs have no attention metadata: vLLM skips them too
            if ctx is None or ctx.attn_metadata is None:
                return original(self, input_ids, positions, *args, **kwargs)
            tokens = int((positions if positions is not None else input_ids).shape[-1])
            _state.pairs = batch_pairs(self)
            row = recorder().forward_row(tokens)
            if _state.pairs is not None:
                if not row.runtime_coeff:
                    row.runtime_coeff = attention_coeff(self)
                row.runtime_flops += row.runtime_coeff * _state.pairs
                row.runtime_calls += 1
        except Exception as e:
            warn_once("vllm-forward", "fxflops: whole-forward timing off (%s: %s)",
                      type(e).__name__, e)
            return original(self, input_ids, positions, *args, **kwargs)
        try:
            timer = _forward_timer(self)
            if timer is not None:
                return timer.time_call(lambda *a: original(self, *a, **kwargs),
                                       (input_ids, positions, *args), row)
            t0 = time.perf_counter_ns()
            out = original(self, input_ids, positions, *args, **kwargs)
            row.add(time.perf_counter_ns() - t0)
            return out
        finally:
            _state.pairs = None

    return _model_forward


def _forward_timer(runner: Any) -> Any:
    timer = getattr(runner, "_fxflops_timer", False)
    if timer is False:
        timer = None
        if getattr(runner.device, "type", "cpu") == "cuda":
            from fxflops.timing import CudaEventTimer

            timer = CudaEventTimer()
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
        def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
            recorder().flush()
            return original(self, *args, **kwargs)

        return shutdown

    patch_method(multiproc_executor.WorkerProc, "shutdown", "flush", wrap)


def note_vllm_config(vllm_config: Any) -> None:
    """What fxflops takes from vLLM's config: the rank, and where depyf dumps graphs
    (``debug_dump_path``), so the annotated dumps land beside vLLM's own."""
    _note_rank()
    try:
        path = vllm_config.compile_debug_dump_path()
    except Exception:
        path = None
    if path:
        os.environ["FXFLOPS_DUMP_DIR"] = os.path.join(str(path), "fxflops")


def install_mode2_backend() -> None:
    """FXFLOPS=1 with mode 2 and a non-fxflops backend: wrap the backend vLLM resolves."""
    from vllm.config import compilation

    modes = (compilation.CompilationMode.STOCK_TORCH_COMPILE,
             compilation.CompilationMode.DYNAMO_TRACE_ONCE)

    def wrap(original: Any) -> Any:
        def init_backend(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
            backend = original(self, vllm_config, *args, **kwargs)
            note_vllm_config(vllm_config)
            if self.mode in modes and self.backend != "fxflops":
                import fxflops

                return fxflops.backend(inner=backend, name="model{index}")
            return backend

        return init_backend

    patch_method(compilation.CompilationConfig, "init_backend", "mode2", wrap)


def install_piecewise_compiler() -> None:
    """Mode 3: every piecewise graph vLLM compiles or loads from its cache is instrumented."""
    from vllm.compilation import backends

    def wrap(original: Any) -> Any:
        def compile(self: Any, graph: Any, example_inputs: Any, additional_inductor_config: Any,
                    compilation_config: Any, compile_range: Any, graph_index: int = 0,
                    num_graphs: int = 1, is_encoder: bool = False) -> Any:
            compiled = original(self, graph, example_inputs, additional_inductor_config,
                                compilation_config, compile_range, graph_index, num_graphs,
                                is_encoder)
            try:
                _note_rank()
                return instrument_piece(graph, compiled, compile_range, graph_index,
                                        num_graphs, example_inputs)
            except Exception as e:
                warn_once("vllm-piece", "fxflops: piecewise graph not instrumented (%s: %s)",
                          type(e).__name__, e)
                return compiled

        return compile

    patch_method(backends.CompilerManager, "compile", "piecewise", wrap)


def instrument_piece(graph: Any, compiled: Any, compile_range: Any, graph_index: int,
                     num_graphs: int, example_inputs: Any) -> Any:
    """Analyse one piecewise graph and wrap its compiled callable."""
    from fxflops.analysis import analyze
    from fxflops.backends import InstrumentedGraph, _uses_cuda
    from fxflops.binder import SizeBinder

    cost = analyze(graph, example_inputs)
    binder = SizeBinder.from_graph(graph, cost.symbols)
    start, end = int(compile_range.start), int(compile_range.end)
    single = start == end
    name = f"piece{graph_index}of{num_graphs}:" + (f"size{start}" if single
                                                  else f"range[{start},{end}]")
    meta = {"inner": "vllm-piecewise", "piece": graph_index, "pieces": num_graphs,
            "compile_range": [start, end]}
    if single:
        meta["compile_size"] = start
    record = recorder().register(name, cost, binder, start if single else "dynamic", meta)
    timer = None
    if _uses_cuda(example_inputs):
        from fxflops.timing import CudaEventTimer

        timer = CudaEventTimer()
    return InstrumentedGraph(compiled, record, timer)
