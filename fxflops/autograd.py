"""The graphs AOTAutograd makes of a training step: forward and backward, each counted and
timed.

When a Dynamo graph needs gradients, what its backend returns runs only the forward half
of an ``autograd.Function``; the backward (about two thirds of a step's FLOPs) runs later,
inside ``loss.backward()``. So for such graphs fxflops instruments one level down, where
AOTAutograd hands its compilers aten graphs: Inductor's inner compile
(``compile_fx(inner_compile=...)``, called with ``is_backward``/``is_inference``), or for
``inner="eager"``/``"aot_eager"`` AOTAutograd's own forward, backward and inference
compilers. Each graph goes through ``backends.plan`` and ``backends.instrument`` like any
other, in AOTAutograd's boxed calling convention, labelled ``meta["phase"]`` and
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

from fxflops.backends import instrument, plan
from fxflops.binder import static_size
from fxflops.recording import recorder
from fxflops.util import warn_once


def compile_phases(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], inner: str,
                   name: str, meta: dict[str, Any], options: dict[str, Any]
                   ) -> Callable[..., Any]:
    """Compile a Dynamo graph that needs gradients with ``inner`` ("inductor", "eager" or
    "aot_eager"), instrumenting each graph AOTAutograd makes of it.

    The forward (or inference) graph is registered under ``name`` (which may hold
    ``{index}``), as the Dynamo graph would be without gradients; its backward as
    ``<that name>.backward``. Both carry ``meta["phase"]`` and ``meta["source"]`` (the
    forward's name).
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
        try:
            graph_plan = plan(graph, backward=phase == "backward")
            if graph_plan.cost.binder is None:
                raise ValueError("its size symbols appear in no input's shape")
            graph_plan.static_size = source_size
            if phase == "backward":
                if not source:  # the forward could not be instrumented
                    source.append(name.format(index=recorder().reserve_index()))
                graph_name = f"{source[0]}.backward"
            else:
                graph_name = name
            # registered and dumped before compiling: Inductor's passes rewrite the graph
            wrapped = instrument(_not_compiled, graph_plan, graph_name, {**meta, "phase": phase},
                                 graph, boxed=True)
            if phase != "backward":
                source[:] = [wrapped.record.name]
            wrapped.record.meta["source"] = source[0]
        except Exception as e:
            warn_once(f"phase:{phase}", "fxflops: could not instrument a %s graph (%s: %s); "
                      "it runs uninstrumented", phase, type(e).__name__, e)
            return compile_graph()
        wrapped.inner = compile_graph()
        return wrapped

    with torch._functorch.config.patch(enable_autograd_cache=False):
        if inner == "inductor":
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner

            def inner_compile(graph: torch.fx.GraphModule, inputs: Sequence[Any],
                              **kwargs: Any) -> Any:
                phase = ("backward" if kwargs.get("is_backward") else
                         "inference" if kwargs.get("is_inference") else "forward")
                return instrumented(lambda: compile_fx_inner(graph, inputs, **kwargs), graph,
                                    phase)

            compiled: Any = compile_fx(gm, example_inputs, inner_compile=inner_compile,
                                       **options)
            return compiled  # a callable here (other types are for AOT export)

        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        def compiler(phase: str) -> Callable[..., Any]:
            def compile_graph(graph: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
                return instrumented(lambda: make_boxed_func(graph.forward), graph, phase)

            return compile_graph

        backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                               inference_compiler=compiler("inference"), **options)
        return backend(gm, example_inputs)


def _not_compiled(*args: Any) -> Any:
    raise RuntimeError("fxflops: graph called before its compile finished")
