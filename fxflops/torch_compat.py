"""Every private torch API fxflops uses, in one table, with the torch releases it was
checked against (as ``integrations/vllm/symbols.py`` does for vLLM).

Compile-time internals (Inductor's entry points and config, AOTAutograd's compilers,
Dynamo's AOT artifacts and frames, structured tracing) are reached through :func:`get`
by their key, so that one place names the seam to look at when torch moves one. Core
types read directly (``torch._ops.OpOverload``, fake tensors, pytree) are listed with
``direct=True``. tests/test_torch_compat.py checks the table against the installed torch
(every entry resolves, unless ``optional``) and that fxflops names no private torch API
that is not in it.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

# releases every non-optional entry was checked against: CI runs the suite on each (2.13
# with vLLM; 2.14 with vLLM's GPU package; the newest, 2.15, and the GPU machine's, 2.11,
# where scripts/gpu_check.py runs, in scripts/torch_leg.sh)
CHECKED_WITH = ("2.11", "2.13", "2.14", "2.15")


class Private(NamedTuple):
    module: str
    name: str  # an attribute path in ``module`` ("" for the module itself)
    why: str
    optional: bool = False  # absent from some releases: fxflops does without
    direct: bool = False  # a core type read where it is used, not through ``get``


PRIVATES: dict[str, Private] = {
    # Inductor: the backend's compile, a training step's graphs, torch.compile's options
    "compile_fx": Private("torch._inductor.compile_fx", "compile_fx",
                          "the backend's Inductor compile (inner='inductor')"),
    "compile_fx_inner": Private("torch._inductor.compile_fx", "compile_fx_inner",
                                "a training step's forward and backward graphs"),
    "inductor_options": Private("torch", "_TorchCompileInductorWrapper",
                                "torch.compile's mode= and options= as Inductor's config"),
    "inductor_config": Private("torch._inductor.config", "",
                               "provenance tracking and C++ kernel profiling (kernel maps)"),
    "reset_provenance_globals": Private("torch._inductor.debug", "reset_provenance_globals",
                                        "a backward graph's own kernel map", optional=True),
    "trace_log": Private("torch._logging._internal", "trace_log",
                         "Inductor's provenance artifacts, captured as they are emitted"),
    "trace_structured": Private("torch._logging", "trace_structured",
                                "annotated dumps shown by tlparse"),
    # AOTAutograd: forward and backward compilers (inner='aot_eager'), its cache
    "aot_autograd": Private("torch._dynamo.backends.common", "aot_autograd",
                            "aot_eager's forward, backward and inference compilers"),
    "make_boxed_func": Private("functorch.compile", "make_boxed_func",
                               "AOTAutograd's boxed calling convention"),
    "functorch_config": Private("torch._functorch.config", "",
                                "enable_autograd_cache off while instrumenting"),
    # Dynamo: backends, frames, AOT artifacts (vLLM's cache)
    "lookup_backend": Private("torch._dynamo.backends.registry", "lookup_backend",
                              "an inner backend by name"),
    "list_backends": Private("torch._dynamo", "list_backends", "the demo's backend check"),
    "innermost_fn": Private("torch._dynamo.eval_frame", "innermost_fn",
                            "Inductor's callable without its second disable wrapper"),
    "current_compile_id": Private("torch._guards", "CompileContext.current_compile_id",
                                  "a graph's frame and DDP piece"),
    "lazy_graph_module": Private("torch.fx._lazy_graph_module", "_LazyGraphModule",
                                 "an eager backend's forward recompiled once"),
    "serializable_callable": Private("torch._dynamo.aot_compile_types", "SerializableCallable",
                                     "instrumented graphs in vLLM's AOT cache"),
    "bundled_aot_callable": Private("torch._dynamo.aot_compile_types",
                                    "BundledAOTAutogradSerializableCallable",
                                    "an Inductor artifact serialised"),
    "graph_module_callable": Private("torch._dynamo.aot_compile_types",
                                     "GraphModuleSerializableCallable",
                                     "an eager artifact serialised"),
    "dynamo_utils": Private("torch._dynamo.utils", "", "a DDP model that compiled nothing"),
    "graph_task_id": Private("torch._C", "_current_graph_task_id",
                             "one backward pass per autograd graph task"),
    "fsdp_collectives": Private("torch.distributed.fsdp._fully_shard._fsdp_collectives", "",
                                "FSDP2's collectives counted", optional=True),
    "fsdp_api": Private("torch.distributed.fsdp._fully_shard._fsdp_api", "",
                        "FSDP2's collectives counted", optional=True),
    # core types, read where they are used
    "op_overload": Private("torch._ops", "OpOverload", "op names and views", direct=True),
    "op_overload_packet": Private("torch._ops", "OpOverloadPacket", "op names", direct=True),
    "higher_order_operator": Private("torch._ops", "HigherOrderOperator", "op names",
                                     direct=True),
    "fake_tensor_mode": Private("torch._subclasses", "FakeTensorMode",
                                "shapes propagated without running", direct=True),
    "fake_tensor": Private("torch._subclasses", "FakeTensor", "recomputation tags",
                           direct=True),
    "detect_fake_mode": Private("torch._guards", "detect_fake_mode",
                                "a graph's own fake mode", direct=True),
    "pytree": Private("torch.utils._pytree", "", "flattening arguments", direct=True),
    "dispatch_mode": Private("torch.utils._python_dispatch", "TorchDispatchMode",
                             "torch-level nodes counted as FlopCounterMode does", direct=True),
}


def get(key: str) -> Any:
    """The private torch object of ``key`` (see ``PRIVATES``). Raises ``AttributeError``
    naming the entry and the releases it was checked against if this torch moved it."""
    entry = PRIVATES[key]
    try:
        obj: Any = importlib.import_module(entry.module)
        for part in filter(None, entry.name.split(".")):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        import torch

        raise AttributeError(
            f"torch {torch.__version__} has no {entry.module}{'.' if entry.name else ''}"
            f"{entry.name} ({entry.why}; fxflops checked it with torch "
            f"{', '.join(CHECKED_WITH)}): {e}") from e
    return obj
