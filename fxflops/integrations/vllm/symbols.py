"""Every vLLM symbol fxflops patches or reads, with the parameters it binds by name.

fxflops binds vLLM's arguments by name (``hooks.arguments``), never by position, so a
signature that moves an argument keeps working; one that renames or drops it does not.
tests/test_vllm_symbols.py checks this table against the installed vLLM, so that an upgrade
says which hook to look at. (Checked by hand against vLLM 0.32 and 0.33.)
"""

from __future__ import annotations

from typing import NamedTuple


class Symbol(NamedTuple):
    module: str
    name: str  # attribute path in the module: "Class.method"
    params: tuple[str, ...] = ()  # the parameters fxflops reads by name
    why: str = ""
    optional: bool = False  # absent from some releases (fxflops does without)


SYMBOLS: tuple[Symbol, ...] = (
    # whole forward, V1 runner (the CPU runner; a GPU with VLLM_USE_V2_MODEL_RUNNER=0)
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward",
           ("self", "input_ids", "positions"), "whole-forward timing (V1)"),
    # whole forward, V2 runner (vLLM's default on a GPU)
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
           ("self", "dummy_run"), "whole-forward timing (V2)", optional=True),
    Symbol("vllm.v1.worker.gpu.async_utils", "StepTimingCollector.record_batch",
           ("self", "input_batch", "full_cudagraph"), "V2: the step's batch, before its forward",
           optional=True),
    Symbol("vllm.forward_context", "get_forward_context", (), "attention metadata, layers"),
    Symbol("vllm.forward_context", "is_forward_context_available"),
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
           "mode 3, a warm start from vLLM's AOT artifact: each piece loaded", optional=True),
    Symbol("vllm.compilation.caching", "VllmSerializableFunction.deserialize_graph_module",
           ("data", "fake_mode"), "the pieces' graphs in vLLM's AOT artifact", optional=True),
    Symbol("vllm.compilation.caching", "StandaloneCompiledArtifacts.get_loaded",
           ("submod_name", "shape"), "a piece loaded from vLLM's AOT artifact", optional=True),
    Symbol("vllm.compilation.caching", "StandaloneCompiledArtifacts.submodule_names",
           (), "the pieces of vLLM's AOT artifact, in order", optional=True),
    Symbol("vllm.compilation.piecewise_backend", "create_concrete_args", ("graph", "size"),
           "a loaded piece's example inputs, as vLLM compiles it", optional=True),
    Symbol("vllm.compilation.piecewise_backend", "get_fake_args_from_graph", ("graph",),
           "a loaded piece's example inputs, as vLLM compiles it", optional=True),
    Symbol("vllm.ray.ray_env", "DEFAULT_ENV_VAR_PREFIXES", (),
           "fxflops' settings copied to Ray's workers"),
    Symbol("vllm.compilation.wrapper", "TorchCompileWithNoGuardsWrapper.__init__", ("self",),
           "the layer census: each model vLLM compiles"),
    Symbol("vllm.config", "get_current_vllm_config", (), "layers by name at compile time"),
    Symbol("vllm.config", "VllmConfig.compile_debug_dump_path", ("self",),
           "graph dumps beside depyf's"),
    # process
    Symbol("vllm.v1.executor.multiproc_executor", "WorkerProc.shutdown", ("self",),
           "flush at a worker's shutdown"),
    Symbol("vllm.distributed.parallel_state", "model_parallel_is_initialized"),
    Symbol("vllm.distributed.parallel_state", "get_tp_group"),
    Symbol("vllm.distributed.parallel_state", "get_pp_group"),
    # data parallelism: the DP size a dense model's engines drop (hooks.install_dp_size_note)
    Symbol("vllm.engine.arg_utils", "EngineArgs.create_engine_config", ("self",),
           "the DP size, where the engine config is made"),
    Symbol("vllm.config.parallel", "ParallelConfig.reconfigure_for_independent_dp_rank",
           ("self",), "the DP size, before vLLM sets it to 1", optional=True),
    # warm-up phases (hooks.WARMUP_METHODS): the methods that run the model for vLLM itself
    Symbol("vllm.v1.worker.cpu_worker", "CPUWorker.determine_available_memory", ("self",),
           "the memory-profiling run (CPU)"),
    Symbol("vllm.v1.worker.cpu_worker", "CPUWorker.compile_or_warm_up_model", ("self",),
           "warm-up compiles (CPU)"),
    Symbol("vllm.v1.worker.cpu_model_runner", "CPUModelRunner.warming_up_model", ("self",),
           "the CPU runner's warm-up"),
    Symbol("vllm.v1.worker.gpu_worker", "Worker.determine_available_memory", ("self",),
           "the memory-profiling run (GPU)"),
    Symbol("vllm.v1.worker.gpu_worker", "Worker.compile_or_warm_up_model", ("self",),
           "warm-up compiles, kernel warm-up (GPU)"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.profile_run", ("self",),
           "the memory-profiling dummy forward (V1)"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.capture_model", ("self",),
           "CUDA-graph capture (V1)"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.profile_cudagraph_memory",
           ("self",), "CUDA graphs captured to measure their memory (V1)"),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_cudagraph_memory",
           ("self",), "CUDA graphs captured to measure their memory (V2)", optional=True),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_run", ("self",),
           "the memory-profiling dummy forward (V2)", optional=True),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model", ("self",),
           "CUDA-graph capture (V2)", optional=True),
    # what vLLM says of each step (engine_stats): its own estimate, its drafts' score
    Symbol("vllm.v1.metrics.perf", "ModelMetrics", (), "vLLM's own estimate of a step"),
    Symbol("vllm.v1.metrics.perf", "ModelMetrics.get_num_flops_breakdown", ("self", "ctx",
           "per_gpu"), "vLLM's own estimate, by component"),
    Symbol("vllm.v1.metrics.perf", "ExecutionContext.add",
           ("self", "num_tokens", "context_len", "is_prefill"), "a step's requests"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync",
           ("self", "scheduler_output"), "speculative decoding: drafts and accepted tokens"),
    Symbol("vllm.compilation.backends", "model_tag", (),
           "a speculative decoder's drafter, while it is built"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer",
           "SpecDecodeBaseProposer.build_per_group_and_layer_attn_metadata",
           ("self", "common_attn_metadata"), "a drafter pass's lengths (V1 proposers)"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.__init__",
           ("self",), "a proposer made: its classes' modules' forward context hooked"),
    Symbol("vllm.v1.spec_decode.llm_base_proposer", "set_forward_context",
           ("attn_metadata", "vllm_config", "num_tokens"),
           "each drafter pass: its layers, its tokens"),
    # V2's speculators (drafter) and acceptance (engine_stats)
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator", "DraftModelSpeculator.__init__",
           ("self",), "a V2 speculator made: its propose and module hooked", optional=True),
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator", "DraftModelSpeculator.propose",
           ("self", "input_batch", "dummy_run"), "a V2 speculator's step", optional=True),
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator",
           "DraftModelSpeculator._build_attn_metadata",
           ("self", "num_reqs", "query_start_loc_np", "seq_lens_cpu_upper_bound", "step"),
           "a V2 drafter pass's lengths", optional=True),
    Symbol("vllm.v1.worker.gpu.spec_decode.speculator", "DraftModelSpeculator.max_model_len",
           (), "a V2 drafter pass's sequence lengths, capped", optional=True),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
           ("self", "scheduler_output"), "V2: the step's drafts", optional=True),
    Symbol("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens", ("self",),
           "V2: the step's output is made", optional=True),
    Symbol("vllm.v1.worker.gpu.async_utils", "AsyncOutput.__init__",
           ("self", "model_runner_output"), "V2: a step's output, its requests' order",
           optional=True),
    Symbol("vllm.v1.worker.gpu.async_utils", "AsyncOutput.get_output", ("self",),
           "V2: sampled counts on the host, drafts accepted", optional=True),
    Symbol("vllm.v1.worker.gpu.input_batch", "InputBatch",
           ("num_reqs", "query_start_loc_np", "num_computed_tokens_np",
            "num_tokens_after_padding"), "V2: a step's lengths, host arrays", optional=True),
    Symbol("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", ("self",),
           "a worker made: the warm-up phases attached to its classes"),
    Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.get_model", ("self",),
           "the target's own layers (the drafter's are in the forward context too)"),
    Symbol("vllm.model_executor.layers.attention.attention", "Attention.get_kv_cache_spec",
           ("self", "vllm_config"), "KV-cache bytes per token in the cache's dtype"),
    # layers the census and the formulas read
    Symbol("vllm.model_executor.layers.linear", "LinearBase", (), "linear layers' sizes"),
    Symbol("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner", (),
           "MoE layers (moe_config, routed_experts)"),
)
