"""The formula registry: ``op name -> Formula``, the zero-FLOP set, byte overrides.

Modelled on ``torch/utils/flop_counter.py``'s ``register_flop_formula``. Ops are keyed by
their qualified name (``"aten::mm"``, ``"mylib::gemm"``) so that formulas for libraries
that are not imported can be registered without importing them. The engine-neutral
built-in formulas live in ``fxflops.cost.formulas``, registered by importing that package;
an integration registers its engine's ops' formulas itself, the same way (vLLM's:
``fxflops.integrations.vllm.formulas``). As torch's registry does, a second registration of an op fails
(``override=True`` replaces on purpose: a user's formula for an op fxflops already costs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
from torch.utils.flop_counter import shape_wrapper

FlopKind = Literal["matmul", "vector"]


@dataclasses.dataclass(frozen=True)
class Formula:
    """A registered formula: ``fn(*args, out_val=..., **kwargs) -> flops``, or with
    ``named``: ``fn(arguments)``, the op's arguments by their schema names (and its return
    value as ``"out"``). A formula may return a :class:`Split` to give both classes."""

    fn: Callable[..., Any]
    kind: FlopKind
    # Ops whose FLOPs depend on run-time state (a serving engine's attention: KV lengths)
    # are counted per call by an integration; the static formula only counts what shapes tell.
    runtime: str | None = None
    named: bool = False


class Split(NamedTuple):
    """FLOPs of an op that does both kinds of work (a fused MoE's GEMMs and activation, a
    state-space scan's products and decay): ``matmul`` and ``vector`` apart."""

    matmul: Any
    vector: Any

    def plus(self, other: Split) -> Split:
        return Split(self.matmul + other.matmul, self.vector + other.vector)

    def times(self, n: Any) -> Split:
        return Split(self.matmul * n, self.vector * n)


FORMULAS: dict[str, Formula] = {}
# Ops that move or reinterpret data but do no arithmetic. Not "uncounted": known to be 0.
ZERO_FLOP_OPS: set[str] = set()
# Ops that are no compute of a model's forward at all: set-up at load time (weight packing,
# kernel handles), capability queries, memory and process management, the sampler's and
# speculative decoding's helpers. Zero FLOPs should one ever appear in a graph.
NOT_COMPUTE_OPS: set[str] = set()
# Kernels that run only inside another op a graph holds (an attention backend's kernels
# inside a serving engine's attention op, a MoE backend's inside its MoE op): counted by
# that op's formula. kernel -> the op that calls it.
INSIDE_OPS: dict[str, str] = {}
# Ops known and not costable from what a graph holds: op -> why. Their nodes stay
# "uncounted" (and the layer safety net may count their layer from its sizes); the audit
# lists them as known gaps rather than as ops never looked at.
UNCOSTABLE_OPS: dict[str, str] = {}
# Ops whose bytes are not their tensor arguments' (a weight hidden in a handle, say).
BYTES_FORMULAS: dict[str, Callable[..., Any]] = {}
# Ops whose reads the graph's inputs misstate: ``fn(*args) ->`` bytes to add to the graph's
# ``bytes_io`` (weights an op reads that are no graph input: held in a layer, or hidden in a
# kernel's handle), or a :class:`PartialRead` (a list of them) for an input read in part (an
# embedding reads its tokens' rows, a MoE its routed experts).
IO_BYTES: dict[str, Callable[..., Any]] = {}


class PartialRead(NamedTuple):
    """Argument ``arg`` (its position) is read in part: ``unread`` of its bytes are not.
    A tensor several ops read in part (one rotary cache for every layer) is taken off once."""

    arg: int
    unread: Any


def op_name(target: Any) -> str:
    """Qualified name of an op target: ``"aten::mm"`` for ``aten.mm`` and ``aten.mm.default``."""
    if isinstance(target, torch._ops.OpOverload):
        return target._overloadpacket._qualified_op_name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    if isinstance(target, str):
        return target
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if type(getattr(target, "__self__", None)).__module__ == "pybind11_builtins":
        # a pybind11 free function (``torch._C._log_api_usage_once``): newer pybind11 (torch
        # 2.11's) prefixes its qualname with its function record's type; its name is its own
        name = target.__name__
    module = getattr(target, "__module__", None)
    if name and module:
        return f"{module}.{name}"
    return repr(target)


class DuplicateRegistration(ValueError):
    """An op registered twice in one table without ``override=True``."""


class FormulasUnavailable(RuntimeError):
    """A module of built-in formulas failed to load: no graph is costed (a cost that
    silently misses a family of ops would read as exact)."""


# module -> why it failed to load (``load_formulas``)
FAILED_FORMULA_MODULES: dict[str, str] = {}
_LOADED_FORMULA_MODULES: set[str] = set()


def load_formulas(*modules: str) -> None:
    """Import modules of formulas (each registers its own), once each, never raising:
    fxflops' own set-up must not reach a user's call. A module that fails is remembered
    (not retried) and every analysis refuses to cost a graph until then
    (:func:`require_formulas`): the graph runs uninstrumented, said once, on the inner
    backend (``instrument.wrap``)."""
    import importlib

    for module in modules:
        if module in _LOADED_FORMULA_MODULES:
            continue
        _LOADED_FORMULA_MODULES.add(module)
        try:
            importlib.import_module(module)
        except Exception as e:
            FAILED_FORMULA_MODULES[module] = f"{type(e).__name__}: {e}"


def require_formulas() -> None:
    """Raise :class:`FormulasUnavailable` if a module of formulas failed to load."""
    if FAILED_FORMULA_MODULES:
        module, why = next(iter(FAILED_FORMULA_MODULES.items()))
        raise FormulasUnavailable(f"fxflops' formulas in {module} failed to load ({why})")


def _add(table: dict[str, Any], name: str, value: Any, override: bool, what: str) -> None:
    if name in table and not override:
        raise DuplicateRegistration(f"fxflops: duplicate registrations of the {what} of "
                                    f"{name} (pass override=True to replace it)")
    table[name] = value


def _names(targets: Any) -> list[str]:
    if isinstance(targets, (list, tuple, set)):
        return [op_name(t) for t in targets]
    return [op_name(targets)]


def register_formula(
    targets: Any, *, kind: FlopKind = "vector", get_raw: bool = False, runtime: str | None = None,
    named: bool = False, override: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a FLOP formula for one or more ops (packets, overloads or ``"ns::name"``).

    Like ``torch.utils.flop_counter.register_flop_formula``: unless ``get_raw``, the formula
    receives shapes in place of tensors and ``out_shape=`` for the output. ``named``: it
    receives one dict, the op's arguments by their schema names (tensors as they are) and
    ``"out"``, what the op returned. ``kind="matmul"`` puts the FLOPs in the class MFU is
    measured on (a :class:`Split` result gives both classes). An op that already has a
    formula is refused (``DuplicateRegistration``) unless ``override=True``: how a user
    replaces a built-in formula.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = fn if (get_raw or named) else shape_wrapper(fn)
        for name in _names(targets):
            _add(FORMULAS, name, Formula(wrapped, kind, runtime, named), override, "formula")
            ZERO_FLOP_OPS.discard(name)
            NOT_COMPUTE_OPS.discard(name)
        return fn

    return decorator


def bind_arguments(op: Any, args: Any, kwargs: dict[str, Any], out: Any) -> dict[str, Any]:
    """An op's arguments by their schema names, defaults filled in, and ``"out"``: what a
    ``named`` formula receives."""
    named: dict[str, Any] = {}
    schema = getattr(op, "_schema", None)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if i < len(args):
                named[a.name] = args[i]
            elif a.name in kwargs:
                named[a.name] = kwargs[a.name]
            elif a.has_default_value():
                named[a.name] = a.default_value
    named.update({k: v for k, v in kwargs.items() if k not in named})
    # what the op returned; an out-variant op's own "out" argument keeps its name
    named.setdefault("out", out)
    return named


def register_zero_flop(*targets: Any) -> None:
    """Declare ops as known zero-FLOP (views, copies, allocation, indexing)."""
    for t in targets:
        ZERO_FLOP_OPS.update(_names(t))


def register_not_compute(*targets: Any) -> None:
    """Declare ops that are no compute of a model's forward (see ``NOT_COMPUTE_OPS``)."""
    for t in targets:
        NOT_COMPUTE_OPS.update(_names(t))


def register_inside(caller: str, *kernels: str) -> None:
    """Declare ``kernels`` as run only inside ``caller`` (see ``INSIDE_OPS``)."""
    for kernel in kernels:
        _add(INSIDE_OPS, kernel, caller, False, "calling op")


def register_uncostable(op: str, why: str) -> None:
    """Declare ``op`` known and not costable (see ``UNCOSTABLE_OPS``)."""
    _add(UNCOSTABLE_OPS, op, why, False, "uncostable reason")


def classify(name: str) -> str | None:
    """How fxflops counts the op ``name``: "costed" (a formula), "inside" (counted by the op
    that calls it), "zero" (known zero-FLOP), "not_compute" (no compute of a forward),
    "uncostable" (known, not costable: a listed gap), or None (never looked at)."""
    if formula_for(name) is not None:
        return "costed"
    if name in INSIDE_OPS:
        return "inside"
    if name in ZERO_FLOP_OPS or out_of_place(name) in ZERO_FLOP_OPS:
        return "zero"
    if name in NOT_COMPUTE_OPS:
        return "not_compute"
    if name in UNCOSTABLE_OPS:
        return "uncostable"
    return None


def register_io_bytes(targets: Any, *, override: bool = False
                      ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(*args, **kwargs) -> bytes`` (raw args) added to the graph's
    ``bytes_io`` for each node of the op (negative: inputs it reads only in part)."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in _names(targets):
            _add(IO_BYTES, name, fn, override, "graph-input bytes")
        return fn

    return decorator


def register_bytes(targets: Any, *, override: bool = False
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(*args, **kwargs) -> bytes`` (raw args) for ops whose tensors lie."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in _names(targets):
            _add(BYTES_FORMULAS, name, fn, override, "bytes")
        return fn

    return decorator


def out_of_place(name: str) -> str:
    """``aten::masked_fill_`` -> ``aten::masked_fill``: an in-place op costs what its
    out-of-place twin costs."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def formula_for(name: str) -> Formula | None:
    return FORMULAS.get(name) or FORMULAS.get(out_of_place(name))


def formula_modules() -> tuple[str, ...]:
    """The modules whose functions the tables hold (a formula, a bytes or graph-input
    bytes function; a table formula made by a builder is the builder's module's, and a
    table module with any function of its own is named by it), sorted: the code the costs
    of a graph analysed now come from, beside the analysis's own."""
    functions = [*(f.fn for f in FORMULAS.values()), *BYTES_FORMULAS.values(),
                 *IO_BYTES.values()]
    return tuple(sorted({m for m in (getattr(fn, "__module__", None) for fn in functions)
                         if isinstance(m, str)}))


def is_zero_flop(target: Any) -> bool:
    if isinstance(target, torch._ops.OpOverload) and target.is_view:
        return True
    name = op_name(target)
    return name in ZERO_FLOP_OPS or out_of_place(name) in ZERO_FLOP_OPS or \
        name in NOT_COMPUTE_OPS


def is_pointwise(target: Any) -> bool:
    """torch tags its elementwise ops; each costs one FLOP per output element here."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
