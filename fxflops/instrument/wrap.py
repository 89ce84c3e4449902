"""The instrumented callables, and the one way any graph gets one (:func:`wrap_graph`).

Every path that instruments a graph (the backend, a training step's forward and backward
graphs, vLLM's mode-2 and piecewise graphs, compiled or loaded from vLLM's cache, an AOT
artifact loaded from disk) goes through :func:`wrap_graph`: plan (``instrument.plan``),
register and dump, compile, wrap; and when fxflops fails, the inner callable runs as
compiled, and the report names the graph, says why, and counts its calls.

The hot path is :class:`InstrumentedGraph`'s ``__call__``: plain code, one class for
every graph, with what differs between graphs held as strategies (its clock, run-time
costs, a backward pass to note, kernel profiling). It and :class:`CountedGraph` (a graph
fxflops could not instrument) are ``SerializableCallable``: the plan travels with the
inner artifact.
"""

from __future__ import annotations

import importlib
import pickle
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fxflops import config, torch_compat
from fxflops.cost import kernels as kernel_costs
from fxflops.cost.analysis import analysis_version
from fxflops.instrument import provenance
from fxflops.instrument.kernel_maps import KernelSetting, kernels_setting, map_kernels
from fxflops.instrument.plan import GraphPlan, NotInstrumentable, plan
from fxflops.instrument.registration import register_graph, register_uninstrumented
from fxflops.recording import kernel_profile
from fxflops.recording.clocks import CPU_CLOCK, Clock, clock_for, now
from fxflops.recording.phases import IN_PROGRESS as _WARMUPS
from fxflops.recording.recorder import recorder
from fxflops.recording.runtime_costs import charge_runtime, coster
from fxflops.recording.size_stats import SizeStats
from fxflops.recording.store import GraphRecord, UninstrumentedGraph
from fxflops.util import host_raised, warn_once

if TYPE_CHECKING:
    from fxflops.cost.kernels import Shape


def wrap_graph(compile_inner: Callable[[], Any], name: str, meta: dict[str, Any], *,
               gm: torch.fx.GraphModule | None = None,
               example_inputs: Sequence[Any] | None = None,
               graph_plan: GraphPlan | None = None, backward: bool = False,
               static_size: int | str | None = None, boxed: bool = False,
               dynamo: bool = False, kernels: KernelSetting | None = None,
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

    ``kernels`` (``kernels_setting``; None: off): map the graph's nodes to the kernels
    Inductor makes of it (captured while ``compile_inner`` runs, or given in
    ``kernel_maps`` where the compile ran before: vLLM's pieces), and profile its calls
    per size.
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
            clock = clock_for(graph_plan.device)
            if record.binder.after:  # sizes from tensor data: read from the outputs
                if clock is not CPU_CLOCK or record.runtime_kinds:
                    raise NotInstrumentable("its sizes come from tensor data, read from its "
                                            "outputs only on the CPU clock")
                return OutputBoundGraph(compiled, record, graph_plan, clock, boxed=boxed,
                                        dynamo=dynamo)
            return InstrumentedGraph(compiled, record, graph_plan, clock, boxed=boxed,
                                     dynamo=dynamo,
                                     kernels=kernels if graph_plan.kernels else None)
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
    return CountedGraph(compiled, entry, boxed=boxed)






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

    Per call (``__call__``): the size key read from the arguments (``SizeBinder.key``), one
    dict lookup, the call numbered (``next(row.calls)``: counted, exactly under threads)
    and one int comparison with the row's next sample; a sampled call (a size's first
    calls, then one in ``FXFLOPS_SAMPLE_EVERY``) adds two clock reads and one ring-buffer
    slot (``SizeStats.note``). Sympy runs once per new size (``_call_timed``), never per
    call. A graph whose calls each need more than a count is not sampled (``_samples``):
    run-time costs (vLLM attention), a clock other than the CPU's (CUDA events,
    ``recording/clocks.py``), a backward pass to note, kernels to profile; its clock
    counts and times every call.

    A graph fxflops gives up on (``_give_up``) reads no row again: each call misses and is
    counted in its ``uninstrumented`` entry. ``boxed``: AOTAutograd's calling convention,
    one list of arguments (which the inner may clear: the size is read before it runs).
    """

    def __init__(self, inner: Callable[..., Any], record: GraphRecord, graph_plan: GraphPlan,
                 clock: Clock = CPU_CLOCK, boxed: bool = False, dynamo: bool = False,
                 kernels: KernelSetting | None = None) -> None:
        self.inner = inner
        self._run = _bound_call(_callable_of(inner, dynamo))
        self.record = record
        self.plan = graph_plan
        self.__name__ = self.__qualname__ = f"fxflops_{record.name}"
        self.clock = clock
        self.boxed = boxed
        if boxed:
            # read by AOTAutograd; an instance attribute: torch._dynamo.disable wraps a
            # backward graph in a function that copies the instance's __dict__
            self._boxed_call = True
        self._key = record.binder.key
        self._every = config.SAMPLE_EVERY.get()
        self._first = config.timed_first(self._every)
        # run-time costs (vLLM attention): their costers exist from now on, wired by an
        # integration whenever it loads
        for kind in record.runtime_kinds:
            coster(kind)
        self._runtime = bool(record.runtime_kinds)
        # a backward graph notes the backward pass it runs in (steps are counted so)
        self._passes = record.passes if record.meta.get("phase") == "backward" else None
        # kernel profiling (a mapped graph, N calls per size profiled): they go through
        # torch.profiler; None: none
        self._kernels_n = kernels.profiled_calls if kernels and kernels.profiled_calls \
            and record.kernels else None
        self._sampled = self._samples()
        self.entry: UninstrumentedGraph | None = None  # set when it gives up
        # the serving rows, at hand on the hot path (a warm-up call's row is chosen by its
        # phase: ``GraphRecord.row``); the same dict for the graph's life
        self._rows = record.rows

    def _samples(self) -> bool:
        """Whether a size's calls are sampled (the CPU clock, past a size's first calls),
        or each timed: one that needs each call (run-time costs, a pass to note, kernels
        to profile) or another clock (CUDA events time every call on the device)."""
        return self.clock is CPU_CLOCK and not (self._runtime or self._passes is not None
                                                or self._kernels_n is not None)

    # --- the hot path -----------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        key = None
        try:
            key = self._key(args[0] if self.boxed else args)
            row = self._rows[key]
        except Exception as e:  # a new size, or a key that cannot be read
            if host_raised(e):
                raise
            return self._call_timed(args, None, key)
        if self._sampled and not _WARMUPS:
            # this call's number at its size: counted now, exactly under threads
            # (``SizeStats.calls``), and timed only when a sample is due
            n = next(row.calls)
            if n < row.due:
                return self._run(*args)
            return self._call_sampled(args, row, n)
        return self._call_timed(args, row, key)

    def _call_sampled(self, args: tuple[Any, ...], row: SizeStats, n: int) -> Any:
        """Call ``n`` of ``row`` (counted), timed on the CPU clock: a sample."""
        t0 = now()
        out = self._run(*args)
        row.note(now() - t0, n, self._first, self._every)
        return out

    def _call_timed(self, args: tuple[Any, ...], row: SizeStats | None, key: Any) -> Any:
        """A call the hot path does not only count: a new size (``row`` None), a call made
        during a warm-up phase (its row the phase's), a call that needs more than a count
        (run-time costs, a pass, a profile, CUDA events: its clock counts and times it), or
        a graph that gave up. ``args``: as ``__call__`` was given them; ``key``: their size
        key (None: not read)."""
        if self.entry is not None:
            self.entry.count()
            return self._run(*args)
        try:
            if key is None:  # raises what reading it raised
                key = self._key(args[0] if self.boxed else args)
            if row is None or _WARMUPS:  # a new size, or a warm-up's call: its phase's
                row = self.record.row(key)
            if self._runtime and row.runtime is not None:
                charge_runtime(row)
            if self._passes is not None:
                self._passes.note(row.size)
        except Exception as e:
            if host_raised(e):
                raise
            return self._give_up(e, args)
        if self._sampled:  # a new size's first call, or a warm-up's: sampled as any
            n = next(row.calls)
            if n < row.due:
                return self._run(*args)
            return self._call_sampled(args, row, n)
        if self._kernels_n is not None and self._profiles(row):
            # one of the N calls per size under torch.profiler (``kernels=N``)
            timed_row = row
            out, profiled = kernel_profile.profile(
                lambda: self.clock.time_call(self._run, args, timed_row, self.record, key),
                row, self.record.kernels or [], self.plan.device)
            if not profiled:  # the calls run on as before, timed
                self._kernels_n = None
                self._sampled = self._samples()
            return out
        return self.clock.time_call(self._run, args, row, self.record, key)

    def _profiles(self, row: SizeStats) -> bool:
        """Whether this call is one of the N profiled per size: serving calls only (not
        vLLM's warm-up phases), never while any CUDA-graph capture is in progress (the
        profiler waits for the device, which a capture forbids: a replay's kernels are the
        graph's, not profiled)."""
        if row is self.record.overflow or _WARMUPS:
            return False
        if row.kernel_profile is not None and row.kernel_profile.calls >= (self._kernels_n or 0):
            return False
        return not self.clock.is_capturing()

    def _give_up(self, error: Exception, args: tuple[Any, ...]) -> Any:
        """fxflops failed on this graph: it runs on as compiled, its calls counted from
        now on, and the report names it and says why (``uninstrumented``)."""
        self._stop(error)
        return self._run(*args)

    def _stop(self, error: Exception) -> None:
        """(``_give_up``, for a call that ran already: counted in the entry.)"""
        reason = f"{type(error).__name__}: {error}"
        entry = recorder().register_uninstrumented(self.record.name, reason)
        # no row is read again: every call misses, and is counted in the entry
        self._rows = {}
        self.entry = entry
        warn_once(f"broken:{id(self.record)}", "fxflops: instrumentation of graph %s failed "
                  "(%s); it runs uninstrumented from now on, its calls counted", self.record.name,
                  reason)
        entry.count()

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
        return wrap_graph(lambda: inner, name, meta, graph_plan=graph_plan,
                          kernels=kernels_setting())


class OutputBoundGraph(InstrumentedGraph):
    """A compiled graph whose size symbols come from tensor data (unbacked: ``.item()``,
    ``nonzero``, a MoE's routing): its size is read from what the call returns
    (``SizeBinder.key_after``), so its row is known only after the call. Every call reads
    the CPU clock (two reads), is counted in its row and noted when a sample is due,
    as ``InstrumentedGraph`` samples."""

    def __call__(self, *args: Any) -> Any:
        if self.entry is not None:
            self.entry.count()
            return self._run(*args)
        # (boxed: the inner may clear the one list of arguments; a shallow copy is read)
        inputs = list(args[0]) if self.boxed else args
        t0 = now()
        out = self._run(*args)
        ns = now() - t0
        try:
            key = self.record.binder.key_after(inputs, out)
            row = None if _WARMUPS else self._rows.get(key)
            if row is None:
                row = self.record.row(key)
            n = next(row.calls)
            if n >= row.due:
                row.note(ns, n, self._first, self._every)
        except Exception as e:
            if host_raised(e):
                raise
            self._stop(e)
        return out


def _bound_call(run: Any) -> Any:
    """``run``'s own ``__call__`` method, bound, where it is an object whose class defines
    one as a plain function (Inductor's ``CompiledFxGraph``, a ``GraphModule``): calling
    the bound method skips the slot call's lookup of ``__call__`` on every call. The
    class's ``__call__`` is the one a call uses, as the slot call looks it up (an instance
    attribute of that name is not); a static or class method, a function, a builtin or a
    method is called as it is. Bound when the graph is made: a class ``__call__`` patched
    later is not seen here."""
    for klass in type(run).__mro__:  # the raw attribute: a staticmethod stays one
        method = vars(klass).get("__call__")
        if method is not None:
            return types.MethodType(method, run) if isinstance(method, types.FunctionType) \
                else run
    return run


class CountedGraph(_Serializable):
    """A graph fxflops could not instrument: the inner callable, its calls counted.
    ``boxed``: AOTAutograd's convention (the one list is passed on as it is)."""

    def __init__(self, inner: Callable[..., Any], entry: UninstrumentedGraph,
                 boxed: bool = False) -> None:
        self.inner = inner
        self.entry = entry
        self.__name__ = self.__qualname__ = f"fxflops_{entry.name}"
        if boxed:
            self._boxed_call = True  # (see InstrumentedGraph: disable copies the __dict__)

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
