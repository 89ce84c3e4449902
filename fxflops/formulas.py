"""Cost formulas: ``op name -> FLOPs``, one small pure function per op family.

Modelled on ``torch/utils/flop_counter.py`` and built on its registry: every matmul,
convolution and attention formula torch has is imported as a *matmul-class* formula, so
fxflops' matmul FLOPs equal ``FlopCounterMode``'s by construction. What torch does not count
(vector work, CPU SDPA, vLLM's custom ops) is registered here in the same style: a formula
takes shapes (tensors are replaced by their shapes, the output by ``out_shape``) and returns
an int, or a SymInt when the shapes are symbolic.

Ops are keyed by their qualified name (``"aten::mm"``, ``"_C::onednn_mm"``) so that formulas
for libraries that are not imported (vLLM) can be registered without importing them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from math import prod
from typing import Any, Literal

import torch
from torch.utils.flop_counter import flop_registry as _torch_flop_registry
from torch.utils.flop_counter import sdpa_flop_count, shape_wrapper

FlopKind = Literal["matmul", "vector"]


@dataclasses.dataclass(frozen=True)
class Formula:
    """A registered formula: ``fn(*args, out_val=..., **kwargs) -> flops``."""

    fn: Callable[..., Any]
    kind: FlopKind
    # Ops whose FLOPs depend on run-time state (vLLM attention: KV lengths) are counted
    # per call by an integration; the static formula only counts what shapes tell.
    runtime: str | None = None


FORMULAS: dict[str, Formula] = {}
# Ops that move or reinterpret data but do no arithmetic. Not "uncounted": known to be 0.
ZERO_FLOP_OPS: set[str] = set()
# Ops whose bytes are not their tensor arguments' (a weight hidden in a handle, say).
BYTES_FORMULAS: dict[str, Callable[..., Any]] = {}


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
    module = getattr(target, "__module__", None)
    if name and module:
        return f"{module}.{name}"
    return repr(target)


def _names(targets: Any) -> list[str]:
    if isinstance(targets, (list, tuple, set)):
        return [op_name(t) for t in targets]
    return [op_name(targets)]


def register_formula(
    targets: Any, *, kind: FlopKind = "vector", get_raw: bool = False, runtime: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a FLOP formula for one or more ops (packets, overloads or ``"ns::name"``).

    Like ``torch.utils.flop_counter.register_flop_formula``: unless ``get_raw``, the formula
    receives shapes in place of tensors and ``out_shape=`` for the output. ``kind="matmul"``
    puts the FLOPs in the class MFU is measured on. A later registration replaces an
    earlier one, so users can override a built-in formula.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        wrapped = fn if get_raw else shape_wrapper(fn)
        for name in _names(targets):
            FORMULAS[name] = Formula(wrapped, kind, runtime)
            ZERO_FLOP_OPS.discard(name)
        return fn

    return decorator


def register_zero_flop(*targets: Any) -> None:
    """Declare ops as known zero-FLOP (views, copies, allocation, indexing)."""
    for t in targets:
        ZERO_FLOP_OPS.update(_names(t))


def register_bytes(targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(*args, **kwargs) -> bytes`` (raw args) for ops whose tensors lie."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in _names(targets):
            BYTES_FORMULAS[name] = fn
        return fn

    return decorator


def lookup(target: Any) -> Formula | None:
    return FORMULAS.get(op_name(target))


def is_zero_flop(target: Any) -> bool:
    if isinstance(target, torch._ops.OpOverload) and target.is_view:
        return True
    return op_name(target) in ZERO_FLOP_OPS


def is_pointwise(target: Any) -> bool:
    """torch tags its elementwise ops; each costs one FLOP per output element here."""
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags


# --- matmul class: torch's own registry, verbatim --------------------------------------

for _target, _fn in _torch_flop_registry.items():
    FORMULAS[op_name(_target)] = Formula(_fn, "matmul")

aten = torch.ops.aten


@register_formula(aten._scaled_dot_product_flash_attention_for_cpu, kind="matmul")
def sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """CPU SDPA: torch's registry misses it (FlopCounterMode counts 0); same formula as CUDA."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_formula(["transformers::grouped_mm_fallback"], kind="matmul")
def grouped_mm_fallback_flop(input_shape, weight_shape, offs_shape, *args, out_shape=None,
                             **kwargs) -> int:
    """MoE experts (transformers): every routed row meets one expert's [K, N] weight."""
    s, k = input_shape
    return 2 * s * k * weight_shape[2]


@register_formula([aten._grouped_mm], kind="matmul")
def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's grouped mm (2D x 3D with offsets, or batched 3D x 3D); its registry misses it."""
    if len(a_shape) == 2 and len(b_shape) == 2:  # 2D x 2D: K split into groups
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * prod(out_shape) * a_shape[-1]


# --- vector class ----------------------------------------------------------------------


def _numel(shape: Iterable[Any]) -> Any:
    return prod(shape) if shape is not None else 0


def per_element(n: int) -> Callable[..., Any]:
    """A formula costing ``n`` FLOPs per element of the first input."""

    def formula(input_shape, *args, out_shape=None, **kwargs):
        return n * _numel(input_shape)

    return formula


# Reductions: one FLOP per input element.
register_formula(
    [aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.prod, aten.argmax,
     aten.argmin, aten.any, aten.all, aten.cumsum, aten.logsumexp, aten.norm,
     aten.linalg_vector_norm, aten.var, aten.std]
)(per_element(1))
register_formula([aten.var_mean])(per_element(2))
# softmax: max, subtract, exp, sum, divide.
register_formula([aten._softmax, aten._log_softmax, aten._safe_softmax])(per_element(5))
# layer norm: mean, subtract, square, mean, normalise, scale, shift.
register_formula([aten.native_layer_norm])(per_element(7))
# group/batch norm inference: same per-element work as layer norm.
register_formula([aten.native_group_norm, aten.native_batch_norm,
                  aten._native_batch_norm_legit_no_training,
                  aten._native_batch_norm_legit_functional])(per_element(7))
# RMS norm: square, mean, multiply by rsqrt, multiply by weight.
register_formula([aten._fused_rms_norm])(per_element(4))
# pooling: one FLOP per input element (compare or add)
register_formula([aten.max_pool2d_with_indices, aten.max_pool1d, aten.max_pool2d,
                  aten.max_pool3d_with_indices, aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d,
                  aten._adaptive_avg_pool2d, aten._adaptive_avg_pool3d, aten.adaptive_max_pool2d,
                  aten.upsample_nearest2d])(per_element(1))
register_formula([aten.topk, aten.sort, aten.histc, aten.floor_divide, aten.remainder,
                  aten.bucketize])(per_element(1))

register_zero_flop(
    aten.clone, aten.copy, aten.copy_, aten._to_copy, aten.contiguous, aten.empty,
    aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.zeros,
    aten.zeros_like, aten.new_zeros, aten.ones, aten.ones_like, aten.new_ones, aten.full,
    aten.full_like, aten.new_full, aten.fill, aten.fill_, aten.zero_, aten.arange,
    aten.scalar_tensor, aten.cat, aten.stack, aten.embedding, aten.index, aten.index_select,
    aten.gather, aten.scatter, aten.index_put, aten.index_put_, aten.slice_scatter,
    aten.select_scatter, aten.constant_pad_nd, aten.repeat, aten._unsafe_view,
    aten.lift_fresh_copy, aten.lift_fresh, aten.detach, aten.alias, aten.view, aten.reshape,
    aten.expand, aten.permute, aten.transpose, aten.t, aten.unsqueeze, aten.squeeze,
    aten.slice, aten.select, aten.split, aten.split_with_sizes, aten.unbind, aten.chunk,
    aten.flatten, aten.unflatten, aten.as_strided, aten.view_as_real, aten.view_as_complex,
    aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset,
    aten._assert_async, aten._assert_scalar, aten.sym_constrain_range_for_size,
    aten._local_scalar_dense, aten.item, aten.masked_fill, aten.tril, aten.triu,
    aten.roll, aten.flip, aten.narrow, aten.unfold, aten.pad, aten.empty_permuted,
    aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.bernoulli, aten.dropout,
    aten.native_dropout, aten.one_hot, aten.tensor_split, aten.resize_, aten.set_,
    aten.split_with_sizes_copy, aten.unbind_copy, aten.view_copy, aten.expand_copy,
    aten.permute_copy, aten.slice_copy, aten.select_copy, aten.t_copy, aten.squeeze_copy,
    aten.unsqueeze_copy, aten.transpose_copy,
)
# Python-level helpers Dynamo leaves in graphs.
register_zero_flop("_operator.getitem", "torch._C._log_api_usage_once", "builtins.getattr", "torch._C._set_grad_enabled",
                   "higher_order::with_effects", "torch.autograd.grad_mode._enter_inference_mode",
                   "torch.autograd.grad_mode._exit_inference_mode", "_operator.setitem")


# vLLM's custom ops: registered by name, so nothing of vLLM is imported here.
from fxflops import formulas_vllm  # noqa: E402,F401
