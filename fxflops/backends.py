"""The ``fxflops`` torch.compile backend: analyse, delegate, wrap.

``torch.compile(m, backend="fxflops")`` (registered through the ``torch_dynamo_backends``
entry point) analyses each graph Dynamo hands over, lets the inner backend (Inductor by
default) compile it, and returns an :class:`InstrumentedGraph` that times every call per
runtime size. A failure inside fxflops is logged once and the inner callable is used as is.
"""

from __future__ import annotations

import importlib
import logging
import pickle
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from fxflops.analysis import analyze, warn_once
from fxflops.binder import SizeBinder, static_size
from fxflops.recording import GraphRecord, recorder

log = logging.getLogger("fxflops")
_now = time.perf_counter_ns


def _qualname(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_class(name: str) -> type:
    module, _, qual = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


_OFF_KEY = ("fxflops-off",)
_OFF = object()  # the row of a graph whose instrumentation gave up


def _off_key(args: Sequence[Any]) -> tuple[str]:
    return _OFF_KEY


class InstrumentedGraph(SerializableCallable):
    """A compiled graph that records, per call, its size and how long it took.

    Per call: read the size symbols (one tuple expression), one dict lookup, two clock
    reads, one ring-buffer slot. Sympy is evaluated once per new size, never per call.
    """

    def __init__(self, inner: Callable[..., Any], record: GraphRecord,
                 timer: Any = None) -> None:
        self.inner = inner
        self.record = record
        self._rows = record.rows
        self._read = record.binder.read
        self._timer = timer  # None: CPU clock; else a CUDA-event timer
        # run-time costers (vLLM attention) of this graph's kinds, looked up once
        self._costers = tuple(recorder().coster(k) for k in record.runtime_kinds)
        self._plain = not self._costers and timer is None  # CPU, nothing per call but time

    # --- the hot path -----------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        try:
            row = self._rows.get(self._read(args)) or self._first_call_at_size(args)
        except Exception as e:
            return self._give_up(e, args)
        if not self._plain:
            return self._call_special(row, args)
        t0 = _now()
        out = self.inner(*args)
        ns = _now() - t0
        # SizeStats.add, inlined: this is the whole per-call bookkeeping
        n = row.count
        row.count = n + 1
        row.total_ns += ns
        row.window[n % row.cap] = ns
        return out

    def _call_special(self, row: Any, args: Sequence[Any]) -> Any:
        """Calls that count run-time FLOPs, run on a GPU, or are no longer instrumented."""
        if row is _OFF:
            return self.inner(*args)
        try:
            if self._costers:
                self._count_runtime(row)
        except Exception as e:
            return self._give_up(e, args)
        if self._timer is not None:
            return self._timer.time_call(self.inner, args, row)
        t0 = _now()
        out = self.inner(*args)
        row.add(_now() - t0)
        return out

    def _first_call_at_size(self, args: Sequence[Any]) -> Any:
        # the one place sympy runs: once per new size
        return self.record.new_row(self._read(args))

    def _count_runtime(self, row: Any) -> None:
        for coster in self._costers:
            pairs = coster.pairs()
            if pairs is not None:
                row.runtime_flops += row.runtime_coeff * pairs
                row.runtime_calls += 1

    def _give_up(self, error: Exception, args: Sequence[Any]) -> Any:
        # from now on every call finds the "off" row: two cheap steps, then the inner call
        self._read, self._rows, self._costers = _off_key, {_OFF_KEY: _OFF}, ()
        self._plain = False
        warn_once(f"broken:{self.record.id}", "fxflops: instrumentation of graph %s failed "
                  "(%s: %s); it runs uninstrumented from now on", self.record.name,
                  type(error).__name__, error)
        return self.inner(*args)

    def finalize_loading(self, *args: Any, **kwargs: Any) -> None:
        """vLLM calls this on an AOT artifact it loads; pass it on where the inner one has it
        (Inductor's bundled callable has none: there is nothing to finish then)."""
        finish = getattr(self.inner, "finalize_loading", None)
        if finish is not None:
            finish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Inductor's and AOTAutograd's callables carry attributes callers may read
        # ``serialize`` must not leak through: torch would then bundle the inner artifact
        # alone and drop the instrumentation (we are a SerializableCallable ourselves)
        if name in ("inner", "record", "serialize") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # --- SerializableCallable: cost and binder travel with the inner artifact ---------

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
        r = fn.record
        state = {
            "inner_cls": _qualname(inner),
            "inner": type(inner).serialize_compile_artifacts(inner),
            "name": r.name, "cost": r.cost, "binder": r.binder,
            "static_size": r.static_size, "meta": r.meta,
            "cuda": fn._timer is not None,
        }
        return pickle.dumps(state)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> InstrumentedGraph:
        state = pickle.loads(data)
        inner = _resolve_class(state["inner_cls"]).deserialize_compile_artifacts(state["inner"])
        record = recorder().register(state["name"], state["cost"], state["binder"],
                                     state["static_size"], {**state["meta"], "loaded": True})
        timer = _make_timer() if state["cuda"] else None
        return cls(inner, record, timer)


def _make_timer() -> Any:
    from fxflops.timing import CudaEventTimer

    return CudaEventTimer()


def _uses_cuda(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


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
        prepared = None
        try:
            cost = analyze(gm)
            binder = SizeBinder.from_graph(gm, cost.symbols)
            prepared = (cost, binder, static_size(gm))
        except Exception as e:
            warn_once("analyze", "fxflops: analysis failed (%s: %s); compiling without "
                      "instrumentation", type(e).__name__, e)
        compiled = inner_backend(gm, example_inputs, **{**self.options, **kwargs})
        if prepared is None:
            return compiled
        try:
            cost, binder, size = prepared
            rec = recorder()
            index = len(rec.graphs)
            name = self.name.format(index=index) if self.name else f"graph{index}"
            record = rec.register(name, cost, binder, size, {"inner": _inner_name(self.inner)})
            self._describe_process(example_inputs, cost)
            self._dump(gm, record)
            timer = _make_timer() if _uses_cuda(example_inputs) else None
            return InstrumentedGraph(compiled, record, timer)
        except Exception as e:
            warn_once("wrap", "fxflops: could not instrument (%s: %s); running uninstrumented",
                      type(e).__name__, e)
            return compiled

    @staticmethod
    def _describe_process(example_inputs: Sequence[Any], cost: Any) -> None:
        from fxflops.peaks import DTYPE_NAMES

        info = recorder().info
        if "device" not in info:
            info["device"] = _device_name(example_inputs)
        # MFU's peak is the one of the dtype the matmuls ran in
        dtype = DTYPE_NAMES.get(cost.matmul_dtype or "")
        if dtype and "dtype" not in info:
            info["dtype"] = dtype

    @staticmethod
    def _dump(gm: torch.fx.GraphModule, record: GraphRecord) -> None:
        try:
            from fxflops.dump import dump_graph

            dump_graph(gm, record)
        except Exception as e:
            warn_once("dump", "fxflops: could not dump graph %s: %s", record.name, e)


def _inner_name(inner: Any) -> str:
    return inner if isinstance(inner, str) else getattr(inner, "__name__", type(inner).__name__)


def _device_name(example_inputs: Sequence[Any]) -> str:
    if _uses_cuda(example_inputs):
        return torch.cuda.get_device_name()
    import platform

    return f"cpu:{platform.processor() or platform.machine()}"


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
