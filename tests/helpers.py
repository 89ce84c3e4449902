"""Helpers the test modules share (no test module imports another)."""

from __future__ import annotations

import gc
import inspect
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

# the tiny Llama of examples/vllm_tiny.py: hidden, intermediate, layers, heads, KV heads,
# head size
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 2, 4, 2, 64


def plan_on_gpu(patcher: Any) -> None:
    """The one seam for "plan it on a GPU": graphs instrumented from now on are planned for
    "cuda" (their example inputs are CPU tensors here: no GPU on this project's hosts) on
    an "NVIDIA H200", so that they are timed by (simulated) CUDA events. ``patcher``: a
    ``pytest.MonkeyPatch`` (or anything with its ``setattr``)."""
    from fxflops.instrument import registration, wrap

    real_plan = wrap.plan

    def planned_on_gpu(*args: Any, **kwargs: Any) -> Any:
        graph_plan = real_plan(*args, **kwargs)
        graph_plan.device = "cuda"
        return graph_plan

    patcher.setattr(wrap, "plan", planned_on_gpu)
    patcher.setattr(registration, "device_name", lambda device: "NVIDIA H200")


def compile_on_sim(patcher: Any, sim: Any) -> None:
    """Graphs compiled from now on are planned for "cuda" and timed by the simulator's
    events (``tests.cuda_sim``)."""
    from fxflops.instrument import wrap
    from fxflops.recording import cuda_events

    patcher.setattr(wrap, "clock_for", lambda device: cuda_events.CudaEventClock(sim))
    plan_on_gpu(patcher)


def on_device(sim: Any, ms: float) -> Any:
    """An inner backend whose compiled graph also runs ``ms`` of work on the (simulated)
    device, as a GPU graph's kernels would."""

    def inner(gm: Any, example_inputs: Any) -> Any:
        def run(*args: Any) -> Any:
            sim.launch(ms)
            return gm.forward(*args)

        return run

    return inner


def torch_lacks(op: str) -> bool:
    """Whether the installed torch's flop registry has no formula for ``op`` (read from
    torch's registry itself, not from fxflops)."""
    from torch.utils.flop_counter import flop_registry

    return op not in {str(k).replace(".", "::", 1) for k in flop_registry}


def dynamo_graph(fn, *args) -> dict:
    """The graph Dynamo makes of ``fn(*args)`` and its example inputs, as vLLM's piecewise
    backend receives them (``{"gm": ..., "ex": ...}``)."""
    captured = {}

    def grab(gm, example_inputs):
        captured["gm"], captured["ex"] = gm, example_inputs
        return gm.forward

    torch.compile(fn, backend=grab)(*args)
    return captured


def compiler_manager_kwargs() -> dict:
    from vllm.compilation.backends import CompilerManager

    params = inspect.signature(CompilerManager.__init__).parameters
    return {"use_aot_compile": True} if "use_aot_compile" in params else {}


def dense_matmul_per_token(hidden=HIDDEN, inter=INTER, layers=LAYERS, heads=HEADS,
                           kv_heads=KV_HEADS, head_dim=HEAD_DIM) -> int:
    """Independent analytic count: QKV, O, gate_up and down projections, 2 FLOPs a MAC."""
    qkv = hidden * (heads + 2 * kv_heads) * head_dim
    o = heads * head_dim * hidden
    mlp = hidden * 2 * inter + inter * hidden
    return layers * 2 * (qkv + o + mlp)


def config_with_cache(cache_dtype: str):
    from vllm.engine.arg_utils import EngineArgs

    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    import vllm_tiny

    path = vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), "fxflops-tiny-llama"))
    return EngineArgs(model=path, load_format="dummy", skip_tokenizer_init=True,
                      dtype="bfloat16", max_model_len=512, kv_cache_dtype=cache_dtype,
                      block_size=32).create_engine_config()


def graph_of(op: Any, args: list, out: Any, kwargs: dict[str, Any] | None = None
             ) -> torch.fx.GraphModule:
    """One call of ``op`` on placeholders carrying ``args``' fake values (non-tensors are
    constants) and ``kwargs``, its node carrying ``out``'s."""
    graph = torch.fx.Graph()
    nodes = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            node = graph.placeholder(f"arg{i}")
            node.meta["val"] = a
            nodes.append(node)
        else:
            nodes.append(a)
    call = graph.call_function(op, tuple(nodes), kwargs)
    call.meta["val"] = out
    graph.output(call if out is not None else None)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def vllm_cache_root(folder: Path) -> str:
    """``folder`` as a VLLM_CACHE_ROOT of a run's own (its compiled artifacts apart), sharing
    vLLM's model-class inspections with the default root (a subprocess each otherwise:
    examples/vllm_tiny.py's ``share_model_infos``)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import vllm_tiny

    vllm_tiny.share_model_infos(str(folder))
    return str(folder)


def perf_model(arch: str):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.perf import ModelMetrics

    sys.path.insert(0, str(ROOT / "examples"))
    import vllm_tiny

    path = vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), f"fxflops-tiny-{arch}"),
                                arch)
    cfg = EngineArgs(model=path, load_format="dummy", skip_tokenizer_init=True,
                     dtype="bfloat16", max_model_len=512).create_engine_config()
    return ModelMetrics(cfg)


def parameters(fn: Any, drop_first: bool) -> list[tuple[str, str, str | None]]:
    """(name, kind, default's repr or None) of each parameter of ``fn``."""
    params = list(inspect.signature(fn).parameters.values())[1 if drop_first else 0:]
    return [(p.name, p.kind.name, None if p.default is p.empty else repr(p.default))
            for p in params]


def graphs_of(record: Any) -> list[Any]:
    """The instrumented callables whose calls go to ``record``'s rows (a record keeps no
    reference to them: found among the live objects; by type, as a dead weak proxy among
    them raises on ``isinstance``)."""
    from fxflops.instrument.wrap import InstrumentedGraph
    return [o for o in gc.get_objects()
            if issubclass(type(o), InstrumentedGraph) and o.record is record]


class RowsByPhase:
    """The part of a graph record a captured call needs (``recording.captures``): its row
    in a phase, made at first use."""

    runtime_kinds = ()

    def __init__(self) -> None:
        from fxflops.recording.size_stats import SizeStats

        self._row = SizeStats
        self.rows: dict[tuple[str, int], Any] = {}

    def row_in(self, phase: str, key: int) -> Any:
        return self.rows.setdefault((phase, key), self._row((key,), key))


def captured_linears(patcher: Any, sim: Any, held: int) -> Any:
    """``held`` Linear(8, 8) layers compiled with fxflops' backend on the CUDA simulator
    (kernels of 0.5, 1.5, ... ms), each called once, then captured together in one CUDA
    graph in vLLM's "capture" phase (one: a piecewise graph; several: a FULL graph).
    Returns the graph."""
    import fxflops
    from fxflops.recording import phases

    compile_on_sim(patcher, sim)
    torch.manual_seed(0)
    fns = [torch.compile(torch.nn.Linear(8, 8), backend=fxflops.backend(
        inner=on_device(sim, 0.5 + i))) for i in range(held)]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for f in fns:
            f(x)
        graph = sim.CUDAGraph()
        with phases.warmup("capture"), sim.graph(graph):
            for f in fns:
                f(x)
    return graph
