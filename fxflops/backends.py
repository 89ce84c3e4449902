"""The ``fxflops`` torch.compile backend, and the one way any graph gets instrumented.

``torch.compile(m, backend="fxflops")`` (registered through the ``torch_dynamo_backends``
entry point) analyses each graph Dynamo hands over, lets the inner backend (Inductor by
default) compile it, and returns an :class:`InstrumentedGraph` that times every call per
runtime size. Every path that instruments a graph — this backend, vLLM's mode 2 and
piecewise graphs (compiled or loaded from vLLM's cache), an AOT artifact loaded from disk —
goes through :func:`plan` (analyse) and :func:`instrument` (register, describe the process,
dump, choose the timer, wrap). A failure inside fxflops is logged once and the inner
callable is used as is.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from fxflops.analysis import analysis_version, analyze
from fxflops.binder import static_size
from fxflops.cost import GraphCost
from fxflops.recording import GraphRecord, charge_runtime, coster, recorder
from fxflops.util import meta_value, warn_once

if TYPE_CHECKING:
    from fxflops.timing import CudaEventTimer

log = logging.getLogger(__name__)
_now = time.perf_counter_ns


@dataclasses.dataclass
class GraphPlan:
    """What instrumenting a graph needs to know of it; picklable, so it travels with a
    serialised artifact."""

    cost: GraphCost
    static_size: int | str
    device: str  # "cuda" or "cpu": which clock times the calls
    analysed_by: str = ""  # analysis_version() of the code that made ``cost``


def plan(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None, *,
         backward: bool = False) -> GraphPlan:
    """Analyse ``gm`` (shapes from its metadata, or propagated from ``example_inputs``);
    ``backward``: an AOTAutograd backward graph (see ``analysis.analyze``)."""
    cost = analyze(gm, example_inputs, backward=backward)
    values = example_inputs if example_inputs is not None else [
        meta_value(n) for n in gm.graph.nodes if n.op == "placeholder"]
    device = "cuda" if any(isinstance(x, torch.Tensor) and x.device.type == "cuda"
                           for x in values) else "cpu"
    return GraphPlan(cost, static_size(gm), device, analysis_version())


def instrument(compiled: Callable[..., Any], graph_plan: GraphPlan, name: str,
               meta: dict[str, Any], gm: torch.fx.GraphModule | None = None, *,
               boxed: bool = False) -> InstrumentedGraph:
    """Register the graph, note the process's device and dtype (MFU's peak), dump the
    annotated graph when ``gm`` is given, and wrap ``compiled`` with the right clock.

    ``boxed``: ``compiled`` takes AOTAutograd's boxed calling convention (one list of
    arguments, which it may clear), and so does the wrapper.
    """
    record = recorder().register(name, graph_plan.cost, graph_plan.static_size, meta)
    _describe_process(graph_plan)
    if gm is not None:
        _dump(gm, record)
    return InstrumentedGraph(compiled, record, graph_plan, make_timer(graph_plan.device),
                             boxed=boxed)


def make_timer(device: str) -> CudaEventTimer | None:
    """The clock for calls on ``device``: CUDA events on a GPU, None (the CPU clock) else."""
    if device != "cuda":
        return None
    from fxflops.timing import CudaEventTimer

    return CudaEventTimer()


def _describe_process(graph_plan: GraphPlan) -> None:
    from fxflops.peaks import DTYPE_NAMES

    info = recorder().info
    if "device" not in info:
        info["device"] = device_name(graph_plan.device)
    # MFU's peak is the one of the dtype the matmuls ran in
    dtype = DTYPE_NAMES.get(graph_plan.cost.matmul_dtype or "")
    if dtype and "dtype" not in info:
        info["dtype"] = dtype


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return f"cpu:{platform.processor() or platform.machine()}"


def _dump(gm: torch.fx.GraphModule, record: GraphRecord) -> None:
    try:
        from fxflops.dump import dump_graph

        dump_graph(gm, record)
    except Exception as e:
        warn_once("dump", "fxflops: could not dump graph %s: %s", record.name, e)


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_class(name: str) -> Any:
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class InstrumentedGraph(SerializableCallable):
    """A compiled graph that records, per call, its size and how long it took.

    Per call on the CPU clock: the size key (``operator.itemgetter`` for the usual single
    size symbol), one dict lookup, two clock reads, one ring-buffer slot. Sympy runs once
    per new size, never per call. Graphs with run-time costs (vLLM attention), on a GPU, or
    whose instrumentation gave up take ``_call_special``.
    """

    boxed = False

    def __init__(self, inner: Callable[..., Any], record: GraphRecord, graph_plan: GraphPlan,
                 timer: CudaEventTimer | None = None, boxed: bool = False) -> None:
        self.inner = inner
        self.record = record
        self.plan = graph_plan
        self._timer = timer
        self._rows = record.rows
        self._key = record.binder.key
        # run-time costs (vLLM attention): their costers exist from now on, wired by an
        # integration whenever it loads
        for kind in record.runtime_kinds:
            coster(kind)
        self._runtime = bool(record.runtime_kinds)
        special = self._runtime or timer is not None
        # the same object, with the __call__ it needs (one that does more than read the
        # CPU clock for a special one)
        if boxed:
            # an instance attribute too: torch._dynamo.disable wraps a backward graph in a
            # function that copies the instance's __dict__, and AOTAutograd reads it there
            self._boxed_call = True
            self.__class__ = _BoxedSpecialGraph if special else _BoxedGraph
        elif special:
            self.__class__ = _SpecialGraph

    # --- the hot path -----------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        try:
            row = self._rows[self._key(args)]
        except Exception:  # a new size (KeyError), or something no longer readable
            return self._call_special(args)
        t0 = _now()
        out = self.inner(*args)
        ns = _now() - t0
        # SizeStats.add, inlined: this is the whole per-call bookkeeping (the sample in
        # place before the call is counted)
        n = row.count
        row.window[n % row.cap] = ns
        row.total_ns += ns
        row.count = n + 1
        return out

    def _call_special(self, args: Sequence[Any]) -> Any:
        """First call at a size, run-time costs, a GPU: the one place sympy runs (once per
        new size) and run-time costers are asked. ``args``: the graph's arguments (a boxed
        graph's one list)."""
        try:
            key = self._key(args)
            row = self._rows.get(key) or self.record.new_row(key)
            if self._runtime and row.runtime_terms:
                charge_runtime(row)
        except Exception as e:
            return self._give_up(e, args)
        call_args = (args,) if self.boxed else args
        if self._timer is not None:
            return self._timer.time_call(self.inner, call_args, row)
        t0 = _now()
        out = self.inner(*call_args)
        row.add(_now() - t0)
        return out

    def _give_up(self, error: Exception, args: Sequence[Any]) -> Any:
        self.__class__ = _UninstrumentedBoxedGraph if self.boxed else _UninstrumentedGraph
        warn_once(f"broken:{id(self.record)}", "fxflops: instrumentation of graph %s failed "
                  "(%s: %s); it runs uninstrumented from now on", self.record.name,
                  type(error).__name__, error)
        return self.inner(args) if self.boxed else self.inner(*args)

    def finalize_loading(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this on an AOT artifact it loads; pass it on where the inner one has it
        (Inductor's bundled callable has none: there is nothing to finish then)."""
        finish = getattr(self.inner, "finalize_loading", None)
        if finish is not None:
            finish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Inductor's and AOTAutograd's callables carry attributes callers may read.
        # ``serialize`` must not leak through: torch would then bundle the inner artifact
        # alone and drop the instrumentation (we are a SerializableCallable ourselves)
        if name in ("inner", "record", "plan", "serialize", "_boxed_call") \
                or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # --- SerializableCallable: the plan travels with the inner artifact ---------------

    @classmethod
    def serialize_compile_artifacts(cls, fn: InstrumentedGraph) -> bytes:
        inner = fn.inner
        if not isinstance(inner, SerializableCallable):
            if getattr(inner, "serialize", None) is not None:
                from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable

                inner = BundledAOTAutogradSerializableCallable(inner)
            elif isinstance(inner, torch.fx.GraphModule):
                from torch._dynamo.aot_compile_types import GraphModuleSerializableCallable

                inner = GraphModuleSerializableCallable(inner)
            else:
                raise RuntimeError(f"fxflops: inner callable {type(inner)} is not serialisable")
        state = {
            "inner_cls": _qualname(inner),
            "inner": type(inner).serialize_compile_artifacts(inner),
            "name": fn.record.name, "meta": fn.record.meta, "plan": fn.plan,
        }
        return pickle.dumps(state)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> InstrumentedGraph:
        state = pickle.loads(data)
        inner = _resolve_class(state["inner_cls"]).deserialize_compile_artifacts(state["inner"])
        if state["plan"].analysed_by != analysis_version():
            warn_once("stale-artifact", "fxflops: graph %s was loaded from a compiled artifact "
                      "that other fxflops code analysed; its FLOPs and bytes may be stale "
                      "(clear the compile cache, e.g. vLLM's VLLM_CACHE_ROOT, to redo them)",
                      state["name"])
        return instrument(inner, state["plan"], state["name"], {**state["meta"], "loaded": True})


class _SpecialGraph(InstrumentedGraph):
    """An instrumented graph with run-time costs (vLLM attention) or on a GPU."""

    def __call__(self, *args: Any) -> Any:
        return self._call_special(args)


class _UninstrumentedGraph(InstrumentedGraph):
    """A graph whose instrumentation failed: the inner callable, and nothing else."""

    def __call__(self, *args: Any) -> Any:
        return self.inner(*args)


class _BoxedGraph(InstrumentedGraph):
    """AOTAutograd's boxed calling convention (``torch._functorch``'s ``_boxed_call``): the
    arguments come as one list, which the inner callable may clear; the size is read
    before it runs. (A forward or backward of a training step: milliseconds, so
    ``SizeStats.add`` is called rather than inlined.)"""

    boxed = True
    _boxed_call = True

    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        try:
            row = self._rows[self._key(args)]
        except Exception:
            return self._call_special(args)
        t0 = _now()
        out = self.inner(args)
        row.add(_now() - t0)
        return out


class _BoxedSpecialGraph(_BoxedGraph):
    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        return self._call_special(args)


class _UninstrumentedBoxedGraph(_BoxedGraph):
    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        return self.inner(args)


# inner backends whose AOTAutograd graphs (forward and backward) fxflops instruments
PHASED_INNERS = ("inductor", "eager", "aot_eager")


def needs_grad(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will make a backward for this Dynamo graph."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs) or \
        any(p.requires_grad for p in gm.parameters())


def resolve_inner(inner: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(inner):
        return inner
    from torch._dynamo.backends.registry import lookup_backend

    if inner == "fxflops":
        raise ValueError("fxflops cannot wrap itself")
    return lookup_backend(inner)


class FxflopsBackend:
    """A configured backend: ``fxflops.backend(inner="inductor")``."""

    def __init__(self, inner: str | Callable[..., Any] = "inductor", name: str | None = None,
                 **options: Any) -> None:
        self.inner = inner
        self.name = name
        self.options = options

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 **kwargs: Any) -> Callable[..., Any]:
        inner_backend = resolve_inner(self.inner)
        if needs_grad(gm, example_inputs):
            if self.inner in PHASED_INNERS:
                return self._compile_phases(gm, example_inputs, kwargs)
            warn_once(f"backward:{_inner_name(self.inner)}", "fxflops: inner backend %s: "
                      "only forward graphs are counted and timed (backward graphs are for "
                      "inductor, eager and aot_eager)", _inner_name(self.inner))
        graph_plan = None
        try:
            graph_plan = plan(gm)
            if graph_plan.cost.binder is None:
                raise ValueError("its size symbols appear in no input's shape")
        except Exception as e:
            graph_plan = None
            warn_once("analyze", "fxflops: analysis failed (%s: %s); compiling without "
                      "instrumentation", type(e).__name__, e)
        compiled = inner_backend(gm, example_inputs, **{**self.options, **kwargs})
        if graph_plan is None:
            return compiled
        try:
            return instrument(compiled, graph_plan, self.name or "graph{index}",
                              self._meta(), gm)
        except Exception as e:
            warn_once("wrap", "fxflops: could not instrument (%s: %s); running uninstrumented",
                      type(e).__name__, e)
            return compiled

    def _compile_phases(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                        kwargs: dict[str, Any]) -> Callable[..., Any]:
        """A graph that needs gradients: its forward and backward graphs, one level down."""
        from fxflops.autograd import compile_phases

        # not in a try: what the compile raises is the inner backend's (Dynamo's restarts
        # among it, which must reach Dynamo); fxflops' own failures are caught inside
        return compile_phases(gm, example_inputs, str(self.inner), self.name or "graph{index}",
                              self._meta(), {**self.options, **kwargs})

    def _meta(self) -> dict[str, Any]:
        """The inner backend, and the Python frame Dynamo compiled: graphs of one frame
        are its recompiles (another size, a failed guard), which a step runs one of."""
        meta: dict[str, Any] = {"inner": _inner_name(self.inner)}
        compile_id = torch._guards.CompileContext.current_compile_id()
        if compile_id is not None and getattr(compile_id, "frame_id", None) is not None:
            meta["frame"] = compile_id.frame_id
        return meta


def _inner_name(inner: Any) -> str:
    return inner if isinstance(inner, str) else getattr(inner, "__name__", type(inner).__name__)


def backend(inner: str | Callable[..., Any] = "inductor", name: str | None = None,
            **options: Any) -> FxflopsBackend:
    """A ``torch.compile`` backend that instruments ``inner`` ("inductor", "eager", a callable).

    ``name`` may use ``{index}``; extra ``options`` are passed to the inner backend.
    """
    return FxflopsBackend(inner, name, **options)


def fxflops_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    **kwargs: Any) -> Callable[..., Any]:
    """The registered ``backend="fxflops"``: Inductor inside."""
    return FxflopsBackend("inductor")(gm, example_inputs, **kwargs)
