"""The instrumented callables, and the one way any graph gets one (:func:`wrap_graph`).

Every path that instruments a graph (the backend, a training step's forward and backward
graphs, vLLM's mode-2 and piecewise graphs, compiled or loaded from vLLM's cache, an AOT
artifact loaded from disk) goes through :func:`wrap_graph`: plan (``instrument.plan``),
register and dump, compile, wrap; and when fxflops fails, the inner callable runs as
compiled, and the report names the graph, says why, and counts its calls.

The classes here are the hot path: an :class:`InstrumentedGraph` per graph, whose class is
chosen at construction for what its calls need (the CPU clock alone, run-time costs or a
GPU, AOTAutograd's boxed convention, a backward pass to note). They are
``SerializableCallable``: the plan travels with the inner artifact.
"""

from __future__ import annotations

import importlib
import pickle
import time
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fxflops import config, torch_compat
from fxflops.cost import kernels as kernel_costs
from fxflops.cost.analysis import analysis_version
from fxflops.instrument import provenance
from fxflops.instrument.inline import Bookkeeping, inline_forward, wrapper
from fxflops.instrument.plan import (
    GraphPlan,
    NotInstrumentable,
    kernels_setting,
    make_timer,
    map_kernels,
    plan,
    register_graph,
    register_uninstrumented,
)
from fxflops.recording import kernel_profile
from fxflops.recording.recorder import recorder
from fxflops.recording.runtime_costs import charge_runtime, coster
from fxflops.recording.size_stats import SizeStats
from fxflops.recording.store import GraphRecord, UninstrumentedGraph
from fxflops.util import host_raised, warn_once

if TYPE_CHECKING:
    from fxflops.cost.kernels import Shape
    from fxflops.recording.cuda_events import CudaEventTimer


def wrap_graph(compile_inner: Callable[[], Any], name: str, meta: dict[str, Any], *,
               gm: torch.fx.GraphModule | None = None,
               example_inputs: Sequence[Any] | None = None,
               graph_plan: GraphPlan | None = None, backward: bool = False,
               static_size: int | str | None = None, boxed: bool = False,
               dynamo: bool = False, kernels: int | None = None,
               kernel_maps: tuple[Shape, list[dict[str, Any]]] | None = None) -> Any:
    """The one way a graph is instrumented.

    Analyse ``gm`` (unless ``graph_plan`` is given: an artifact loaded from a cache),
    register the graph and dump it before ``compile_inner()`` runs (Inductor's passes may
    rewrite ``gm``), then wrap what it returns. ``name`` may hold ``{index}``. ``boxed``:
    AOTAutograd's calling convention (one list of arguments); ``dynamo``: Dynamo calls the
    result through its own disable wrapper (the inner's is then not needed again).

    What ``compile_inner`` raises is the inner compile's and propagates (Dynamo's restarts
    among it). When fxflops itself fails, the inner callable runs as compiled, and the
    report names the graph, says why and counts its calls; warned once.

    ``kernels`` (``kernels_setting``): map the graph's nodes to the kernels Inductor makes
    of it (captured while ``compile_inner`` runs, or given in ``kernel_maps`` where the
    compile ran before: vLLM's pieces), and profile that many calls per size.
    """
    record: GraphRecord | None = None
    failure: BaseException | None = None
    shape = None
    try:
        graph_plan = graph_plan or plan(gm, example_inputs, backward=backward)  # type: ignore[arg-type]
        if static_size is not None:
            graph_plan.static_size = static_size
        if graph_plan.cost.binder is None:
            raise NotInstrumentable("its size symbols are in no input's shape (sizes read "
                                    "from tensor data, as .item() makes them)")
        record = register_graph(graph_plan, name, meta, gm)
        if kernels is not None and gm is not None and kernel_maps is None:
            shape = kernel_costs.snapshot(gm)  # before Inductor's passes rewrite it
    except Exception as e:
        if host_raised(e):
            raise
        failure = e
    try:
        if shape is not None:
            with provenance.capture() as captured, provenance.fresh_provenance(backward):
                compiled = compile_inner()
            kernel_maps = (shape, captured.maps())
        else:
            compiled = compile_inner()
    except BaseException:
        if record is not None:
            recorder().unregister(record)
        raise
    if record is not None and graph_plan is not None and kernel_maps is not None:
        map_kernels(graph_plan, record, kernel_maps, pre_grad=not boxed)
    if record is not None and graph_plan is not None:
        try:
            if record.kernels is None and graph_plan.kernels is not None:
                record.kernels = graph_plan.kernels  # an artifact's, loaded with its plan
            return InstrumentedGraph(compiled, record, graph_plan,
                                     make_timer(graph_plan.device), boxed=boxed, dynamo=dynamo,
                                     kernels=kernels_setting(kernels) if graph_plan.kernels
                                     else None)
        except Exception as e:
            if host_raised(e):
                raise
            recorder().unregister(record)
            failure = e
    return uninstrumented(compiled, name, failure, boxed=boxed)


def uninstrumented(compiled: Any, name: str, failure: BaseException | None, *,
                   boxed: bool = False) -> Any:
    """``compiled`` running as it is, its calls counted, the graph and the reason in the
    report (``Recorder.uninstrumented``)."""
    reason = f"{type(failure).__name__}: {failure}" if failure is not None else "unknown"
    entry = register_uninstrumented(name, reason)
    warn_once(f"uninstrumented:{reason}", "fxflops: graph %s is not instrumented (%s); it "
              "runs as compiled, its calls counted", entry.name, reason)
    return (_CountedBoxedGraph if boxed else CountedGraph)(compiled, entry)






_now = time.perf_counter_ns


# set on an exception a host's signal handler raised (``session``): never fxflops' to catch
_HOST = "_fxflops_host_raised"


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_class(name: str) -> Any:
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _callable_of(inner: Any, dynamo: bool) -> Any:
    """What the hot path calls. Under Dynamo's own disable wrapper (the backend's path),
    an inner that is itself only a disable wrapper (Inductor's) is called unwrapped: one
    eval-frame round trip per call, as Dynamo makes for a plain backend."""
    if dynamo and getattr(inner, "_torchdynamo_disable", False) and \
            getattr(inner, "_torchdynamo_disable_recursive", True):
        return torch_compat.get("innermost_fn")(inner)
    return inner


# vLLM's AOT cache keeps callables of this class (their state travels with the artifact)
SerializableCallable = torch_compat.get("serializable_callable")


class _Serializable(SerializableCallable):  # type: ignore[misc,valid-type]
    """A wrapper whose state travels with its inner artifact (vLLM's AOT cache)."""

    inner: Any

    @staticmethod
    def _inner_state(inner: Any) -> dict[str, Any]:
        if not isinstance(inner, SerializableCallable):
            if getattr(inner, "serialize", None) is not None:
                inner = torch_compat.get("bundled_aot_callable")(inner)
            elif isinstance(inner, torch.fx.GraphModule):
                inner = torch_compat.get("graph_module_callable")(inner)
            else:
                raise RuntimeError(f"fxflops: inner callable {type(inner)} is not serialisable")
        return {"inner_cls": _qualname(inner),
                "inner": type(inner).serialize_compile_artifacts(inner)}

    @staticmethod
    def _load_inner(state: dict[str, Any]) -> Any:
        return _resolve_class(state["inner_cls"]).deserialize_compile_artifacts(state["inner"])

    def finalize_loading(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this on an AOT artifact it loads; pass it on where the inner one has it
        (Inductor's bundled callable has none: there is nothing to finish then)."""
        finish = getattr(self.inner, "finalize_loading", None)
        if finish is not None:
            finish(*args, **kwargs)


class InstrumentedGraph(_Serializable):
    """A compiled graph that records, per call, its size and how long it took.

    Per call on the CPU clock (``hot_function``): the size key (an expression over the
    arguments), one dict lookup, one int comparison, the count; one call in
    ``FXFLOPS_SAMPLE_EVERY`` also two clock reads and one ring-buffer slot. Sympy runs once
    per new size, never per call. Graphs with run-time costs (vLLM attention), on a GPU, or
    whose instrumentation gave up take ``_call_special``. Every attribute the call path
    reads is bound here (no ``__getattr__``: Dynamo's wrapper reads ``__name__`` per call).
    """

    boxed = False
    _rows: dict[Any, SizeStats]

    def __init__(self, inner: Callable[..., Any], record: GraphRecord, graph_plan: GraphPlan,
                 timer: CudaEventTimer | None = None, boxed: bool = False,
                 dynamo: bool = False, kernels: int | None = None) -> None:
        self.inner = inner
        self._run = _callable_of(inner, dynamo)
        self.record = record
        self.plan = graph_plan
        self.__name__ = self.__qualname__ = f"fxflops_{record.name}"
        self._timer = timer
        # the CPU-clock path as a plain function (``hot_function``), and its rows' rebinder
        self.hot: Callable[..., Any] | None = None
        self._rebind_hot: Callable[[dict[Any, SizeStats]], None] | None = None
        record.read_by(self)  # sets self._rows: the rows its calls go to (of this phase)
        self._key = record.binder.key
        # run-time costs (vLLM attention): their costers exist from now on, wired by an
        # integration whenever it loads
        for kind in record.runtime_kinds:
            coster(kind)
        self._runtime = bool(record.runtime_kinds)
        # kernel profiling (``kernels=N``, a mapped graph): N calls per size go through
        # torch.profiler; every call takes the special path while it is on
        self._kernels_n = kernels if kernels and record.kernels else None
        special = self._runtime or timer is not None or self._kernels_n is not None
        # a backward graph notes the backward pass it runs in (steps are counted so)
        self._passes = record.passes if record.meta.get("phase") == "backward" else None
        # the same object, with the __call__ it needs (one that does more than read the
        # CPU clock for a special one)
        if boxed:
            # an instance attribute too: torch._dynamo.disable wraps a backward graph in a
            # function that copies the instance's __dict__, and AOTAutograd reads it there
            self._boxed_call = True
            self.__class__ = _BoxedSpecialGraph if special else (
                _BoxedGraph if self._passes is None else _BoxedBackwardGraph)
        elif special:
            self.__class__ = _SpecialGraph
        # the classes whose calls the hot function makes: what Dynamo calls in place of this
        # object, what AOTAutograd is given for a forward graph, what ``__call__`` runs
        if type(self) in (InstrumentedGraph, _BoxedGraph):
            self.hot, self._rebind_hot = hot_function(self)
            if dynamo:
                torch_compat.dynamo_calls(self, self.hot)

    def use_rows(self, rows: dict[Any, SizeStats]) -> None:
        """Send calls to ``rows`` (a phase's: ``GraphRecord.read_by``), on every path."""
        self._rows = rows
        if self._rebind_hot is not None:
            self._rebind_hot(rows)

    # --- the hot path -----------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """A caller that holds the object (vLLM's pieces, a loaded artifact): the hot
        function, one frame down (Dynamo calls that function itself)."""
        return self.hot(*args)  # type: ignore[misc]

    def _on_miss(self, args: Sequence[Any]) -> Any:
        """A call the hot function's rows do not serve (a new size, a key that cannot be
        read): the special path; a graph that gave up counts it instead."""
        return self._call_special(args)

    def _call_special(self, args: Sequence[Any]) -> Any:
        """First call at a size, run-time costs, a GPU: the one place sympy runs (once per
        new size) and run-time costers are asked. ``args``: the graph's arguments (a boxed
        graph's one list)."""
        try:
            key = self._key(args)
            row = self._rows.get(key) or self.record.new_row(key)
            if self._runtime and row.runtime_terms:
                charge_runtime(row)
            if self._passes is not None:
                self._passes.note(row.size)
        except Exception as e:
            if host_raised(e):
                raise
            return self._give_up(e, args)
        call_args = (args,) if self.boxed else args
        if self._kernels_n is not None and self._profiles(row):
            # one of the N calls per size under torch.profiler (``kernels=N``)
            out, profiled = kernel_profile.profile(lambda: self._timed(call_args, row, key),
                                                  row, self.record.kernels or [],
                                                  self.plan.device)
            if not profiled:  # the calls run on as before, timed
                self._kernels_n = None
            return out
        return self._timed(call_args, row, key)

    def _profiles(self, row: SizeStats) -> bool:
        """Whether this call is one of the N profiled per size: serving calls only (not
        vLLM's warm-up phases), never while any CUDA-graph capture is in progress (the
        profiler waits for the device, which a capture forbids: a replay's kernels are the
        graph's, not profiled)."""
        if row is self.record.overflow or self._rows is not self.record.rows:
            return False
        if row.kernel_profile is not None and row.kernel_profile.calls >= (self._kernels_n or 0):
            return False
        return self._timer is None or not self._timer.is_capturing()

    def _timed(self, call_args: Sequence[Any], row: SizeStats, key: Any) -> Any:
        if self._timer is not None:
            return self._timer.time_call(self._run, call_args, row, self.record, key)
        t0 = _now()
        out = self._run(*call_args)
        row.add(_now() - t0)
        return out

    def _give_up(self, error: Exception, args: Sequence[Any]) -> Any:
        """fxflops failed on this graph: it runs on as compiled, its calls counted from
        now on, and the report names it and says why (``uninstrumented``)."""
        reason = f"{type(error).__name__}: {error}"
        self.entry = recorder().register_uninstrumented(self.record.name, reason)
        self.__class__ = _UninstrumentedBoxedGraph if self.boxed else _UninstrumentedGraph
        # no row is read again: every call (the hot function's too) takes this class's path
        self.record.readers.discard(self)
        self.use_rows({})
        warn_once(f"broken:{id(self.record)}", "fxflops: instrumentation of graph %s failed "
                  "(%s); it runs uninstrumented from now on, its calls counted", self.record.name,
                  reason)
        self.entry.count()
        return self._run(args) if self.boxed else self._run(*args)

    # --- SerializableCallable: the plan travels with the inner artifact ---------------

    @classmethod
    def serialize_compile_artifacts(cls, fn: InstrumentedGraph) -> bytes:
        # the plan pickled apart: one this process cannot unpickle (a class fxflops moved
        # since) costs the instrumentation, never the inner artifact's load
        state = {**cls._inner_state(fn.inner), "name": fn.record.name, "meta": fn.record.meta,
                 "plan": pickle.dumps(fn.plan)}
        return pickle.dumps(state)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        """The inner artifact, instrumented with the plan it was saved with; if that plan
        cannot be used here (fxflops changed, a class moved), the inner runs as loaded and
        the report says so. Only an inner that cannot be loaded raises (the cache's own
        error)."""
        state = pickle.loads(data)
        inner = cls._load_inner(state)
        name, meta = state.get("name", "graph{index}"), {**state.get("meta", {}), "loaded": True}
        try:
            graph_plan = state["plan"]
            if isinstance(graph_plan, bytes):
                graph_plan = pickle.loads(graph_plan)
            if graph_plan.analysed_by != analysis_version():
                warn_once("stale-artifact", "fxflops: graph %s was loaded from a compiled "
                          "artifact that other fxflops code analysed; its FLOPs and bytes may "
                          "be stale (clear the compile cache, e.g. vLLM's VLLM_CACHE_ROOT, "
                          "to redo them)", name)
        except Exception as e:
            return uninstrumented(inner, name, e)
        return wrap_graph(lambda: inner, name, meta, graph_plan=graph_plan)


def hot_function(graph: InstrumentedGraph
                 ) -> tuple[Callable[..., Any], Callable[[dict[Any, SizeStats]], None]]:
    """The CPU-clock hot path of ``graph`` as a plain function, called in place of the
    object (by Dynamo: ``torch_compat.dynamo_calls``; by AOTAutograd, boxed), with the
    bookkeeping written into its own lines (``instrument/inline.py``): where the object's
    ``__call__`` pays a slot call, an instance-dict read per attribute and the size key's
    own call, this pays bytecodes (benchmarks/overhead.py).

    Per call: the size key (an expression over the arguments), one dict lookup, the row's
    next sample's due count (an int comparison) and the count, under the row's lock, as the
    call returns (one that raises is not counted, as on every path; calls from several
    threads at one size each count). A size's first calls
    (``config.timed_first``) are timed, then one in ``FXFLOPS_SAMPLE_EVERY`` (``every``):
    two clock reads and ``note``, the sample standing for itself and the calls until the
    next in the total. The others pay no clock: the clock and the sample are most of the
    bookkeeping's cost, and a median needs a sample, not every call. Anything
    else (a new size, a graph that gave up) goes to ``miss``: the object's ``_on_miss``,
    whose class says what to do.

    What the function calls is the inner as its convention asks: a boxed graph's list;
    AOTAutograd's unboxed forward (Inductor, no gradients) taken apart, its argument list
    built here and its compiled function called (``torch_compat.aot_forward_parts``: one
    frame fewer than calling it, which is what a wrapping backend's own frame costs); or,
    with an eager inner, no call at all: the function is a copy of the graph module's
    generated ``forward`` with the bookkeeping in it (``inline_forward``). Returns the
    function and its rows' rebinder (``graph.use_rows``)."""
    every = config.SAMPLE_EVERY.get()
    first = config.timed_first(every)

    def note(row: SizeStats, ns: int) -> None:
        """A timed call took ``ns``: it counts as the row's next call (``SizeStats.add``,
        with the sample standing in the total for itself and the calls until the next is
        due: the next call while a size's first calls are each timed, then the next
        multiple of ``every``). Called on timed calls only, outside their clock reads,
        under the row's lock (threads at one size: each call counted once)."""
        with row.lock:
            n, t = row.count, row.timed
            row.window[t % row.cap] = ns
            due = n + 1 if n + 1 < first else (n // every + 1) * every
            row.total_ns += ns * (due - n)
            row.due = due
            row.timed = t + 1
            row.count = n + 1

    def miss(error: BaseException, args: Any) -> Any:
        """A call the rows do not serve (a new size, a key no longer readable): the
        object's ``_on_miss``; a host's exception (a signal handler's) goes on up."""
        if getattr(error, _HOST, False):
            raise error
        return graph._on_miss(args)

    books = Bookkeeping(graph._rows, _now, note, miss)
    key = graph.record.binder.expression
    if graph.boxed:
        made, rebind = wrapper(_bound_call(graph._run), graph.__name__, key, books, boxed=True)
        made._boxed_call = True  # type: ignore[attr-defined]
        return made, rebind
    aot_forward = torch_compat.aot_forward_parts(graph._run)
    if aot_forward is not None:
        # AOTAutograd's forward (Inductor, no gradients) is a frame that only puts the
        # parameters before the arguments: made in the hot function, as it makes it
        boxed_run, params = aot_forward
        return wrapper(boxed_run, graph.__name__, key, books, params=params)
    # an eager graph's generated forward: the bookkeeping written into a copy of it, one
    # frame where a wrapping function would make two
    inlined = inline_forward(graph._run, graph.__name__, key, books)
    if inlined is not None:
        return inlined
    return wrapper(_bound_call(graph._run), graph.__name__, key, books)


def _bound_call(run: Any) -> Any:
    """``run``'s own ``__call__`` method, bound, where it is an object whose class defines
    one as a plain function (Inductor's ``CompiledFxGraph``, a ``GraphModule``): calling
    the bound method skips the slot call's lookup of ``__call__`` on every call (about
    600 instructions, docs/benchmarks.md). The class's ``__call__`` is the one a call
    uses, as the slot call looks it up (an instance attribute of that name is not); a
    static or class method, a function, a builtin or a method is called as it is. Bound
    when the graph is made: a class ``__call__`` patched later is not seen here."""
    for klass in type(run).__mro__:  # the raw attribute: a staticmethod stays one
        method = vars(klass).get("__call__")
        if method is not None:
            return types.MethodType(method, run) if isinstance(method, types.FunctionType) \
                else run
    return run


class _SpecialGraph(InstrumentedGraph):
    """An instrumented graph with run-time costs (vLLM attention) or on a GPU."""

    def __call__(self, *args: Any) -> Any:
        return self._call_special(args)


class _UninstrumentedGraph(InstrumentedGraph):
    """A graph whose instrumentation failed: the inner callable, its calls counted in its
    ``uninstrumented`` entry (``entry``, set when it gave up)."""

    entry: UninstrumentedGraph

    def __call__(self, *args: Any) -> Any:
        self.entry.count()
        return self._run(*args)

    def _on_miss(self, args: Sequence[Any]) -> Any:
        return self(*args)


class _BoxedGraph(InstrumentedGraph):
    """AOTAutograd's boxed calling convention (``torch._functorch``'s ``_boxed_call``): the
    arguments come as one list, which the inner callable may clear; the size is read
    before it runs. A forward's calls are the boxed hot function's (``hot_function``);
    a backward's, which also notes its pass, take ``_BoxedBackwardGraph``'s own path."""

    boxed = True
    _boxed_call = True

    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        return self.hot(args)  # type: ignore[misc]


class _BoxedBackwardGraph(_BoxedGraph):
    """A backward graph: also notes the backward pass it runs in (one autograd graph task
    per ``loss.backward()``; ``recording.BackwardPasses``)."""

    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        try:
            row = self._rows[self._key(args)]
        except Exception as e:
            if getattr(e, _HOST, False):
                raise
            return self._call_special(args)  # (which notes the pass too)
        self._passes.note(row.size)  # type: ignore[union-attr]
        t0 = _now()
        out = self._run(args)
        row.add(_now() - t0)
        return out


class _BoxedSpecialGraph(_BoxedGraph):
    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        return self._call_special(args)


class _UninstrumentedBoxedGraph(_BoxedGraph):
    entry: UninstrumentedGraph

    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        self.entry.count()
        return self._run(args)

    def _on_miss(self, args: Sequence[Any]) -> Any:
        # boxed: the list AOTAutograd passed, itself (its callee may clear it)
        return self(args)  # type: ignore[arg-type]


class CountedGraph(_Serializable):
    """A graph fxflops could not instrument: the inner callable, its calls counted."""

    def __init__(self, inner: Callable[..., Any], entry: UninstrumentedGraph) -> None:
        self.inner = inner
        self.entry = entry
        self.__name__ = self.__qualname__ = f"fxflops_{entry.name}"

    def __call__(self, *args: Any) -> Any:
        self.entry.count()
        return self.inner(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: CountedGraph) -> bytes:
        return pickle.dumps({**cls._inner_state(fn.inner), "name": fn.entry.name,
                             "reason": fn.entry.reason})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        state = pickle.loads(data)
        return uninstrumented(cls._load_inner(state), state["name"],
                              NotInstrumentable(state["reason"]))


class _CountedBoxedGraph(CountedGraph):
    _boxed_call = True

    def __init__(self, inner: Callable[..., Any], entry: UninstrumentedGraph) -> None:
        super().__init__(inner, entry)
        self._boxed_call = True  # (see InstrumentedGraph: disable copies the __dict__)

    def __call__(self, args: list[Any]) -> Any:  # type: ignore[override]
        self.entry.count()
        return self.inner(args)


