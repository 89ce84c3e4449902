"""The graphs AOTAutograd makes of a training step: forward and backward, each counted and
timed.

When a Dynamo graph needs gradients, what its backend returns runs only the forward half
of an ``autograd.Function``; the backward (about two thirds of a step's FLOPs) runs later,
inside ``loss.backward()``. So for such graphs fxflops instruments one level down, where
AOTAutograd hands its compilers aten graphs: Inductor's inner compile
(``compile_fx(inner_compile=...)``, called with ``is_backward``/``is_inference``), or for
``inner="aot_eager"`` AOTAutograd's own forward, backward and inference
compilers. Each graph goes through ``backends.wrap_graph`` like any other, in AOTAutograd's boxed calling convention, labelled ``meta["phase"]`` and
``meta["source"]``. The forward keeps the name the Dynamo graph would have had (an
inference run with gradients on reads the same rows as one without); the backward is
``<forward>.backward``.

Recomputation: nodes of a backward graph that the partitioner copied from the forward
(activation checkpointing; Inductor recomputing cheap ops instead of saving them) are
*hardware* FLOPs, not *model* FLOPs (``analysis.analyze(backward=True)``).

AOTAutograd's on-disk cache is turned off for these compiles (``enable_autograd_cache``): a
hit there would hand back compiled code without calling the compilers, uninstrumented.
Inductor's FX graph cache, below the inner compile, still serves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from fxflops import torch_compat
from fxflops.cost.binder import static_size
from fxflops.instrument.kernel_maps import KernelSetting
from fxflops.instrument.wrap import wrap_graph
from fxflops.recording.recorder import recorder


def compile_phases(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], inner: str,
                   name: str, meta: dict[str, Any], options: dict[str, Any],
                   inductor_patches: dict[str, Any] | None = None,
                   kernels: KernelSetting | None = None) -> Callable[..., Any]:
    """Compile a Dynamo graph that needs gradients with ``inner`` ("inductor" or
    "aot_eager"), instrumenting each graph AOTAutograd makes of it.

    The forward (or inference) graph is registered under ``name`` (which may hold
    ``{index}``), as the Dynamo graph would be without gradients; its backward as
    ``<that name>.backward``. Both carry ``meta["phase"]`` and ``meta["source"]`` (the
    forward's name). ``inductor_patches``: Inductor's config (torch.compile's ``mode`` and
    ``options``); ``kernels``: map (and profile) each graph's Inductor kernels.
    """
    # a static graph's size label is read from the Dynamo graph's first data input (the
    # aten graphs' inputs are all "primals_<n>", weights and data alike): forward and
    # backward rows then share the label of the call they belong to
    try:
        source_size: int | str = static_size(gm)
    except Exception:
        source_size = "static"
    source: list[str] = []  # the forward's registered name, once it is

    def instrumented(compile_graph: Callable[[], Any], graph: torch.fx.GraphModule,
                     phase: str) -> Any:
        if phase == "backward":
            if not source:  # the forward could not be registered
                source.append(name.format(index=recorder().reserve_index()))
            graph_name = f"{source[0]}.backward"
        else:
            graph_name = name
        # registered and dumped before compiling (Inductor's passes rewrite the graph)
        wrapped = wrap_graph(compile_graph, graph_name, {**meta, "phase": phase}, gm=graph,
                             backward=phase == "backward", static_size=source_size, boxed=True,
                             kernels=kernels if inner == "inductor" else None)
        record = getattr(wrapped, "record", None)
        registered = record.name if record is not None else wrapped.entry.name
        if phase != "backward":
            source[:] = [registered]
        if record is not None:
            record.meta["source"] = source[0]
        return wrapped

    with torch_compat.get("functorch_config").patch(enable_autograd_cache=False):
        if inner == "inductor":
            compile_fx = torch_compat.get("compile_fx")
            compile_fx_inner = torch_compat.get("compile_fx_inner")

            def inner_compile(graph: torch.fx.GraphModule, inputs: Sequence[Any],
                              **kwargs: Any) -> Any:
                phase = ("backward" if kwargs.get("is_backward") else
                         "inference" if kwargs.get("is_inference") else "forward")
                return instrumented(lambda: compile_fx_inner(graph, inputs, **kwargs), graph,
                                    phase)

            compiled: Any = compile_fx(gm, example_inputs, inner_compile=inner_compile,
                                       config_patches=inductor_patches or None, **options)
            return compiled  # a callable here (other types are for AOT export)

        make_boxed_func = torch_compat.get("make_boxed_func")
        aot_autograd = torch_compat.get("aot_autograd")

        def compiler(phase: str) -> Callable[..., Any]:
            def compile_graph(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
                return instrumented(lambda: make_boxed_func(graph.forward), graph, phase)

            return compile_graph

        backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                               inference_compiler=compiler("inference"), **options)
        return backend(gm, example_inputs)

