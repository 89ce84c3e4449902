"""What the plugin changes in a vLLM process, each hook small and idempotent.

- whole forward and attention counts: ``forward`` (the V1 and V2 model runners);
- the layer census for the safety net: ``layers``;
- mode 2: ``CompilationConfig.init_backend``'s backend is wrapped by fxflops;
- mode 3: ``CompilerManager.compile`` (which both compiles and loads from vLLM's cache)
  returns instrumented piecewise graphs named by piece and compile range;
- warm-up: the worker's memory profiling, warm-up compiles and CUDA-graph capture run in a
  warm-up phase (``fxflops.recording.phases.warmup``): their calls are not traffic.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from fxflops import config
from fxflops.patching import Patch, patch_method, subclasses
from fxflops.recording.recorder import recorder
from fxflops.util import warn_once


class Undo(NamedTuple):
    """A change that is not a patched method (a set vLLM reads, extended), undone alike."""

    undo: Callable[[], Any]


# every patch this module applied, so that ``uninstall`` can undo them (newest first)
PATCHES: list[Patch | Undo] = []


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


def vllm_ranks(vllm_config: Any = None) -> dict[str, int]:
    """This worker's place: tensor- and pipeline-parallel rank and size from vLLM's groups,
    the data-parallel replica from the parallel config (``data_parallel_index``: dense
    models' DP ranks all read 0 in ``data_parallel_rank``), its global rank, its node."""
    out: dict[str, int] = {}
    try:
        from vllm.distributed import parallel_state

        if parallel_state.model_parallel_is_initialized():
            tp, pp = parallel_state.get_tp_group(), parallel_state.get_pp_group()
            out.update(tp=tp.rank_in_group, tp_size=tp.world_size, pp=pp.rank_in_group,
                       pp_size=pp.world_size)
    except Exception:
        pass
    try:
        if vllm_config is None:
            from vllm.config import get_current_vllm_config

            vllm_config = get_current_vllm_config()
        parallel = vllm_config.parallel_config
        out["dp"] = int(getattr(parallel, "data_parallel_index", None) or
                        getattr(parallel, "data_parallel_rank", 0) or 0)
        # a dense model's DP engine is reconfigured as DP=1: its size as it was before
        noted = os.environ.get(_DP_SIZE_VAR, "")
        out["dp_size"] = max(int(parallel.data_parallel_size or 1), _DP_SIZE[0], out["dp"] + 1,
                             int(noted) if noted.isdigit() else 1)
        out["node"] = int(getattr(parallel, "node_rank", 0) or 0)
        out["nodes"] = int(getattr(parallel, "nnodes", 1) or 1)
    except Exception:
        pass
    if "tp" in out:  # one number per worker of the whole job: replica, stage, shard
        out["rank"] = (out.get("dp", 0) * out["pp_size"] + out["pp"]) * out["tp_size"] + out["tp"]
        out["world"] = out.get("dp_size", 1) * out["pp_size"] * out["tp_size"]
    return out


# the data-parallel size before vLLM made a dense model's DP engine independent (DP=1);
# handed to its workers (spawned: they see only the changed config) in the environment
_DP_SIZE = [1]
_DP_SIZE_VAR = "_FXFLOPS_VLLM_DP_SIZE"


def install_dp_size_note() -> None:
    """Keep the data-parallel size that ``reconfigure_for_independent_dp_rank`` drops (a
    dense model's DP engines each run as DP=1, ``data_parallel_index`` their rank): noted
    in the environment where the engine config is made (the process that starts the DP
    engines, whose children inherit it) and where it is dropped."""
    import sys

    from vllm.config import parallel

    def note(size: Any) -> None:
        _DP_SIZE[0] = max(_DP_SIZE[0], int(size or 1))
        if _DP_SIZE[0] > 1:
            os.environ[_DP_SIZE_VAR] = str(_DP_SIZE[0])

    def made(named: dict[str, Any], vllm_config: Any) -> None:
        note(vllm_config.parallel_config.data_parallel_size)

    method = getattr(parallel.ParallelConfig, "reconfigure_for_independent_dp_rank", None)
    if method is not None:
        _patch(parallel.ParallelConfig, "reconfigure_for_independent_dp_rank", "dp-size",
               lambda original: passthrough(
                   original, before=lambda named: note(named["self"].data_parallel_size),
                   what="DP size"))
    arg_utils = sys.modules.get("vllm.engine.arg_utils")  # imported by then where it is used
    if arg_utils is not None:
        _patch(arg_utils.EngineArgs, "create_engine_config", "dp-size",
               lambda original: passthrough(original, after=made, what="DP size"))


def _note_rank(vllm_config: Any = None) -> None:
    ranks = vllm_ranks(vllm_config)
    if "tp" in ranks:
        rec = recorder()
        info = rec.info
        if ranks.get("nodes", 1) > 1 and "ranks" not in info:
            # many nodes, each started apart (its own run id): the job's one, from the
            # store of vLLM's process group (every worker of every node reads the same)
            from fxflops.placement import shared_run_id

            rec.run_id = shared_run_id(rec.run_id) or rec.run_id
            os.environ[config.RUN_ID.name] = rec.run_id
        info["ranks"] = {**info.get("ranks", {}), **ranks}
        info["rank"] = ranks["rank"]


# vLLM's methods that run the model for itself, not for requests, and the phase their
# calls are recorded in (the innermost counts: the CPU worker's memory profiling runs its
# warm-up, which runs ``profile_run``; V2's memory profiling captures CUDA graphs into a
# throw-away pool, ``capture_model(profile_only=True)``: profiling, not capture)
WARMUP_METHODS = {
    "determine_available_memory": "profile",  # the memory-profiling dummy forward
    "profile_run": "profile",
    "profile_cudagraph_memory": "profile",  # graphs captured to measure their memory
    "compile_or_warm_up_model": "warmup",  # compile sizes, kernel warm-up, JIT warm-up steps
    "warming_up_model": "warmup",  # the CPU runner's
    "capture_model": "capture",  # CUDA graphs
}
# where the workers and model runners are (those imported: a worker imports its own; a
# release without one of them has none to patch). vLLM 0.34's CPU runner
# (``vllm.v1.worker.cpu.model_runner``) subclasses V2's ``GPUModelRunner``: found below it.
_WORKER_CLASSES = (("vllm.v1.worker.worker_base", "WorkerBase"),
                   ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
                   ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
                   ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"))


def install_warmup_phases_per_worker() -> None:
    """Attach the warm-up phases (``install_warmup_phases``) as each worker is made
    (``WorkerWrapperBase.init_worker``: its classes are imported by then, and its memory
    profiling, warm-up and capture are still to come), in every compilation mode; the
    layer census attaches them too, for classes loaded later."""
    from vllm.v1.worker import worker_base

    _patch(worker_base.WorkerWrapperBase, "init_worker", "warmup",
           lambda original: passthrough(original, after=lambda named, _: install_warmup_phases(),
                                        what="warm-up phases"))


def install_warmup_phases() -> None:
    """Run vLLM's warm-up methods in their warm-up phase, on every worker and model runner
    class this process has imported (idempotent; a class loaded later is patched at the
    next call)."""
    import sys

    from fxflops.recording.phases import warmup

    roots: list[type] = []
    for module_name, class_name in _WORKER_CLASSES:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        if isinstance(cls, type):
            roots.append(cls)

    def in_phase(phase: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with warmup("profile" if kwargs.get("profile_only") else phase):
                    return original(*args, **kwargs)

            return wrapper

        return wrap

    for root in roots:
        for cls in subclasses(root):
            for name, phase in WARMUP_METHODS.items():
                if callable(cls.__dict__.get(name)):
                    _patch(cls, name, "warmup", in_phase(phase))


def settings_reach_ray_workers() -> None:
    """Under Ray, vLLM copies to its workers only the environment variables whose prefixes
    it lists (``vllm.ray.ray_env.DEFAULT_ENV_VAR_PREFIXES``, read at each copy): fxflops'
    (``FXFLOPS``, ``FXFLOPS_*``) is added to that set, not to
    ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, which is part of vLLM's compile-cache key."""
    from vllm.ray import ray_env

    prefixes = ray_env.DEFAULT_ENV_VAR_PREFIXES
    if not isinstance(prefixes, set):
        raise TypeError(f"DEFAULT_ENV_VAR_PREFIXES is a {type(prefixes).__name__}, not a set")
    if "FXFLOPS" not in prefixes:
        prefixes.add("FXFLOPS")
        PATCHES.append(Undo(lambda: prefixes.discard("FXFLOPS")))


def install_flush_at_shutdown() -> None:
    from vllm.v1.executor import multiproc_executor

    def flush() -> None:
        from fxflops.outputs.session import attach

        attach(recorder()).flush()

    def wrap(original: Any) -> Any:
        return passthrough(original, before=lambda named: flush(),
                           what="flush at worker shutdown")

    _patch(multiproc_executor.WorkerProc, "shutdown", "flush", wrap)


def note_vllm_config(vllm_config: Any) -> None:
    """What fxflops takes from vLLM's config: the ranks, and where depyf dumps graphs
    (``debug_dump_path``), so the annotated dumps land beside vLLM's own."""
    _note_rank(vllm_config)
    try:
        path = vllm_config.compile_debug_dump_path()
    except Exception:
        path = None
    if path:
        os.environ[config.DUMP_DIR.name] = os.path.join(str(path), "fxflops")


# vLLM's model tags (``vllm.compilation.backends.set_model_tag``): a speculative decoder's
# drafter is built, and its backend made, under one of ``DRAFT_TAGS`` (a drafter's own
# compiled heads under theirs, inside its tag: DFlash2's candidate selector, LiLiCorr's
# head); ``OTHER_TAGS`` are the target's own parts and encoders. A tag in neither is
# counted as the target's: tests/integrations/vllm/test_vllm_drafter.py reads every tag in the installed
# vLLM's sources, and fails on one that is in neither set.
DRAFT_TAGS = frozenset({"eagle_head", "draft_model", "medusa_head", "dflash_head",
                        "dspark_head", "extract_hidden_states", "dflash2_candidate_selector",
                        "lilicorr_head"})
OTHER_TAGS = frozenset({"backbone", "self_decoder", "cross_decoder", "NaViTEncoder",
                        "AutoEncoder"})


def drafting(vllm_config: Any) -> bool:
    """Whether the model vLLM is building now is a speculative decoder's drafter."""
    if getattr(vllm_config, "speculative_config", None) is None:
        return False
    from vllm.compilation import backends

    return getattr(backends, "model_tag", None) in DRAFT_TAGS


def install_mode2_backend() -> None:
    """FXFLOPS=1 with mode 2 and a non-fxflops backend: wrap the backend vLLM resolves."""
    from vllm.config import compilation

    modes = (compilation.CompilationMode.STOCK_TORCH_COMPILE,
             compilation.CompilationMode.DYNAMO_TRACE_ONCE)

    def wrap_backend(named: dict[str, Any], backend: Any) -> Any:
        config = named["self"]
        note_vllm_config(named["vllm_config"])
        if config.mode not in modes:
            return None
        from fxflops.instrument.backend import backend as fxflops_backend

        if drafting(named["vllm_config"]):  # a drafter's graphs: rows of their own
            inner = "inductor" if config.backend == "fxflops" else backend
            return fxflops_backend(inner=inner, name="draft{index}", workload="draft")
        if config.backend != "fxflops":
            return fxflops_backend(inner=backend, name="model{index}")
        return None

    def wrap(original: Any) -> Any:
        return passthrough(original, after=wrap_backend, what="mode-2 backend")

    _patch(compilation.CompilationConfig, "init_backend", "mode2", wrap)


def install_piecewise_compiler() -> None:
    """Mode 3: every piecewise graph vLLM compiles, or loads from its cache, is instrumented.
    ``CompilerManager.compile`` does both (it calls ``load`` first); wrapping it alone
    instruments each graph once. (A warm start from vLLM's AOT artifact calls neither:
    ``install_warm_start``.)"""
    from vllm.compilation import backends

    from fxflops.instrument.wrap import kernels_setting

    def wrap(original: Any) -> Any:
        return passthrough(original, after=_instrument_compiled_piece, what="piecewise graph")

    _patch(backends.CompilerManager, "compile", "piecewise", wrap)
    if kernels_setting() is not None:  # outside it: the compile's kernel map captured
        _patch(backends.CompilerManager, "compile", "piecewise-kernels", _capturing_kernels)


def install_warm_start() -> None:
    """A warm start from vLLM's AOT artifact (vLLM >= 0.33 with torch >= 2.12:
    ``VLLM_USE_MEGA_AOT_ARTIFACT``, on by default) calls no compiler: its pieces are
    instrumented as the artifact is turned back into the model's forward
    (``_instrumenting_loaded_pieces``; feature "warm start (AOT artifact)")."""
    from vllm.compilation import caching

    _patch(caching, _RECONSTRUCT, "piecewise-warm", _instrumenting_loaded_pieces)


# vLLM's function that turns an AOT artifact back into the model's forward (>= 0.33), looked up
# in its module at each call
_RECONSTRUCT = "reconstruct_serializable_fn_from_mega_artifact"


# the model tag of the piecewise graph being analysed (its compiler's prefix), for the layer
# census (``layers``): a piece analysed from fake inputs holds no weights to tell its model
COMPILING_TAG: contextvars.ContextVar[str | None] = \
    contextvars.ContextVar("fxflops_compiling_tag", default=None)


# (the graph as analysed before Inductor compiled it, the capture of its kernel map) of the
# piece being compiled (FXFLOPS_KERNELS)
_PENDING_KERNELS: contextvars.ContextVar[tuple[Any, Any] | None] = \
    contextvars.ContextVar("fxflops_pending_kernels", default=None)


def _capturing_kernels(original: Callable[..., Any]) -> Callable[..., Any]:
    """Around vLLM's compile of a piece: its graph read before Inductor rewrites it, and the
    kernel map Inductor emits (a fresh compile, or Inductor's cache)."""
    from fxflops.cost import kernels
    from fxflops.instrument import provenance

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            shape = kernels.snapshot(arguments(original, args, kwargs)["graph"])
        except Exception:
            shape = None
        with provenance.capture() as captured:
            token = _PENDING_KERNELS.set((shape, captured))
            try:
                return original(*args, **kwargs)
            finally:
                _PENDING_KERNELS.reset(token)

    return wrapper


def _instrument_compiled_piece(named: dict[str, Any], compiled: Any) -> Any:
    """(After ``CompilerManager.compile``.) The piece it compiled or loaded, instrumented."""
    compile_range = named["compile_range"]
    pending = _PENDING_KERNELS.get()
    kernel_maps = (pending[0], pending[1].maps()) if pending and pending[0] else None
    return instrument_piece(compiled, named["graph"], named["example_inputs"],
                            (int(compile_range.start), int(compile_range.end)),
                            named.get("graph_index", 0), named.get("num_graphs", 1),
                            getattr(named.get("self"), "prefix", ""), kernel_maps)


def instrument_piece(compiled: Any, graph: Any, example_inputs: Any,
                     compile_range: tuple[int, int], graph_index: int, num_graphs: int,
                     prefix: str = "", kernel_maps: Any = None) -> Any:
    """Analyse one piecewise graph and wrap its compiled callable, like any other graph,
    named by its place among the pieces and its compile range. ``prefix``: the model tag
    the piece was compiled under (a speculative decoder's drafter compiles its own).

    Where vLLM keeps what it compiled in its AOT artifact (an object with
    ``serialize()``: Inductor's ``AOTCompiledArtifact``), the instrumented piece hands vLLM
    the same bytes: vLLM's artifact is as vLLM writes it, with or without fxflops, and a
    warm start instruments what it loads (``_instrumenting_loaded_pieces``)."""
    from fxflops.instrument.wrap import kernels_setting, wrap_graph

    _note_rank()
    start, end = compile_range
    single = start == end
    name = f"piece{graph_index}of{num_graphs}:" + (f"size{start}" if single
                                                  else f"range[{start},{end}]")
    meta: dict[str, Any] = {"inner": "vllm-piecewise", "piece": graph_index,
                            "pieces": num_graphs, "compile_range": [start, end]}
    if prefix in DRAFT_TAGS:
        meta["workload"] = "draft"
        name = "draft:" + name
    if single:
        meta["compile_size"] = start
    token = COMPILING_TAG.set(prefix or None)  # (the layer safety net: whose piece)
    try:
        instrumented = wrap_graph(lambda: compiled, name, meta, gm=graph,
                                  example_inputs=example_inputs,
                                  static_size=start if single else None,
                                  kernels=kernels_setting() if kernel_maps else None,
                                  kernel_maps=kernel_maps)
    finally:
        COMPILING_TAG.reset(token)
    serialize = getattr(compiled, "serialize", None)
    if callable(serialize) and instrumented is not compiled:
        instrumented.serialize = serialize
    return instrumented


def _instrumenting_loaded_pieces(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's warm start from its AOT artifact: each piece it loads is instrumented as a
    compiled one is, analysed from the artifact's own split graph (the pieces' FX graphs,
    pickled beside their compiled code; the piece's index, its compile range and the
    model tag as vLLM keeps them). vLLM loads what it would, and calls each piece through
    its instrumented wrapper, as after a cold compile; a failure here leaves the pieces as
    loaded, warned once."""

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        artifacts = None
        try:
            named = arguments(original, args, kwargs)
            loaded = named["standalone_compile_artifacts"]
            loaded.get_loaded = _loaded_piece_instrumenter(loaded, named["state"],
                                                           loaded.get_loaded)
            artifacts = loaded  # (its get_loaded is fxflops' until vLLM has loaded them)
        except Exception as e:
            warn_once("vllm-hook:warm pieces", "fxflops: pieces loaded from vLLM's AOT "
                      "artifact not instrumented (%s: %s)", type(e).__name__, e)
        try:
            return original(*args, **kwargs)
        finally:
            if artifacts is not None:
                vars(artifacts).pop("get_loaded", None)

    return wrapper


def _loaded_piece_instrumenter(artifacts: Any, state: dict[str, Any],
                               get_loaded: Callable[[str, str], Any]
                               ) -> Callable[[str, str], Any]:
    """``get_loaded(submod_name, shape)`` returning the loaded piece instrumented."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from vllm.compilation.caching import VllmSerializableFunction

    from fxflops import torch_compat

    FakeTensorMode = torch_compat.get("fake_tensor_mode")

    # the split graph, unpickled apart from vLLM's (its own fake mode: nothing of vLLM's
    # shape environment is touched)
    split = VllmSerializableFunction.deserialize_graph_module(
        state["graph_module"], FakeTensorMode(shape_env=ShapeEnv()))
    names = artifacts.submodule_names()
    prefix = str(state.get("prefix", ""))

    def instrumented(submod_name: str, shape: str) -> Any:
        compiled = get_loaded(submod_name, shape)
        try:
            graph = getattr(split, submod_name)
            start, end = (int(part) for part in shape.strip("()").split(","))
            return instrument_piece(compiled, graph, _piece_inputs(graph, start, end),
                                    (start, end), names.index(submod_name), len(names),
                                    prefix)
        except Exception as e:
            warn_once("vllm-hook:warm pieces", "fxflops: pieces loaded from vLLM's AOT "
                      "artifact not instrumented (%s: %s)", type(e).__name__, e)
            return compiled

    return instrumented


def _piece_inputs(graph: Any, start: int, end: int) -> Any:
    """The example inputs vLLM compiles a piece with (``PiecewiseBackend``): concrete at a
    single size, the graph's own fake inputs for a range."""
    from vllm.compilation import piecewise_backend

    if start == end:
        return piecewise_backend.create_concrete_args(graph, start)
    return piecewise_backend.get_fake_args_from_graph(graph)
