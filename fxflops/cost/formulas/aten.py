"""Built-in cost formulas for aten ops, one small pure function per op family.

Built on torch's own registry: every matmul, convolution and attention formula
``torch.utils.flop_counter`` has is imported as a *matmul-class* formula, so fxflops'
matmul FLOPs equal ``FlopCounterMode``'s by construction. What the installed torch does not
count is registered here in the same style: matmul ops its registry lacks (CPU SDPA before
torch 2.15, grouped mm; ``TORCH_EXTRAS``, only where it lacks them) and vector work: a formula takes shapes
(tensors are replaced by their shapes, the output by ``out_shape``) and returns an int, or
a SymInt when the shapes are symbolic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from math import prod
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry as _torch_flop_registry
from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count, shape_wrapper

from fxflops.cost.registry import (
    FORMULAS,
    Formula,
    PartialRead,
    op_name,
    register_formula,
    register_io_bytes,
    register_zero_flop,
)

# --- matmul class: torch's own registry, and what the installed torch lacks -------------
# torch's registry grows (2.15 counts CPU SDPA): fxflops' own formula for an op is used only
# where the installed torch has none, so that FlopCounterMode's count is fxflops' wherever
# torch makes one. ``TORCH_EXTRAS``: op -> fxflops' formula, for an op torch may lack.

aten = torch.ops.aten
TORCH_EXTRAS: dict[str, Formula] = {}


def torch_extra(targets: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare fxflops' matmul formula for ops torch's registry may lack (shapes in, as
    ``register_formula``): registered by :func:`load_torch_formulas` only where it does."""

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for target in targets if isinstance(targets, (list, tuple)) else [targets]:
            TORCH_EXTRAS[op_name(target)] = Formula(shape_wrapper(fn), "matmul")
        return fn

    return decorator


@torch_extra(aten._scaled_dot_product_flash_attention_for_cpu)
def sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """CPU SDPA: torch's registry lacks it before 2.15 (FlopCounterMode counts 0); the same
    formula as CUDA's."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@torch_extra(aten._scaled_dot_product_flash_attention_for_cpu_backward)
def sdpa_cpu_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                           out_shape=None, **kwargs) -> int:
    """CPU SDPA's backward (training), where torch's registry lacks it; its CUDA formula."""
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


@torch_extra(["transformers::grouped_mm_fallback"])
def grouped_mm_fallback_flop(input_shape, weight_shape, offs_shape, *args, out_shape=None,
                             **kwargs) -> int:
    """MoE experts (transformers): every routed row meets one expert's [K, N] weight."""
    s, k = input_shape
    return 2 * s * k * weight_shape[2]


@torch_extra([aten._grouped_mm])
def grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's grouped mm (2D x 3D with offsets, or batched 3D x 3D), where torch lacks it."""
    if len(a_shape) == 2 and len(b_shape) == 2:  # 2D x 2D: K split into groups
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * prod(out_shape) * a_shape[-1]


def torch_lacks() -> tuple[str, ...]:
    """The ops fxflops counts as matmul FLOPs that the installed torch's registry has no
    formula for (``FlopCounterMode`` counts them 0): what fxflops' count adds to its."""
    have = {op_name(target) for target in _torch_flop_registry}
    return tuple(name for name in TORCH_EXTRAS if name not in have)


# the names ``load_torch_formulas`` put in the table (torch's and the extras), replaced
# whole at a reload
_FROM_TORCH: set[str] = set()


def load_torch_formulas() -> None:
    """Fill the matmul class from torch's registry as it is now, and fxflops' extras where
    it has none, each SDPA formula counting grouped-query attention (below). Run at
    import; again only where torch's registry was changed (tests)."""
    for name in _FROM_TORCH:
        FORMULAS.pop(name, None)
    _FROM_TORCH.clear()
    for target, fn in _torch_flop_registry.items():
        FORMULAS[op_name(target)] = Formula(fn, "matmul")
        _FROM_TORCH.add(op_name(target))
    for name in torch_lacks():
        FORMULAS[name] = TORCH_EXTRAS[name]
        _FROM_TORCH.add(name)
    for name, where in _ATTENTION_HEADS.items():
        if name in FORMULAS:  # (torch's registry may lack an op: cudnn's on an old torch)
            FORMULAS[name] = dataclasses.replace(FORMULAS[name],
                                                 fn=_gqa_counted(FORMULAS[name].fn, where))


# --- attention: grouped-query attention counted on every torch -------------------------
# Key and value with fewer heads than the query (GQA) are broadcast to the query's heads by
# the kernels, and torch's SDPA formulas count them so from torch 2.13 on; earlier releases
# (2.11, the GPU machine's) assert equal heads and the op could not be costed. Every SDPA
# formula (torch's and fxflops' extras) is called with the shapes broadcast first: the
# count of torch >= 2.13 on every torch, FlopCounterMode's wherever it can count GQA at all.

_SDPA_KINDS = ("efficient_attention", "flash_attention", "cudnn_attention",
               "flash_attention_for_cpu")
# op -> (position of the query, of the key and value, the head dimension). (The kernels'
# own ops, ``_flash_attention_forward`` and the like, nested tensors among their inputs,
# are left to torch's formula as they are.)
_ATTENTION_HEADS: dict[str, tuple[int, tuple[int, int], int]] = {
    **{f"aten::_scaled_dot_product_{kind}": (0, (1, 2), 1) for kind in _SDPA_KINDS},
    **{f"aten::_scaled_dot_product_{kind}_backward": (1, (2, 3), 1) for kind in _SDPA_KINDS},
}


def kv_heads_broadcast(args: tuple[Any, ...], query: int, kv: tuple[int, ...], dim: int
                       ) -> tuple[Any, ...]:
    """A formula's arguments (tensors, as the analysis passes them, or their shapes) with
    the key's and value's (at ``kv``) replaced by their shapes given the query's (at
    ``query``) head count on ``dim``, where they are 4-D and have fewer heads, a divisor of
    the query's (GQA); else ``args`` as they are."""
    if max(query, *kv) >= len(args):
        return args
    shapes: list[Any] = [getattr(args[i], "shape", args[i]) for i in (query, *kv)]
    if not all(isinstance(s, (tuple, list, torch.Size)) and len(s) == 4 for s in shapes):
        return args
    heads = shapes[0][dim]
    out = list(args)
    for i, shape in zip(kv, shapes[1:]):
        h = shape[dim]
        # plain ints only: a symbolic head count is not compared (no guard on it)
        if type(heads) is int and type(h) is int and 0 < h < heads and heads % h == 0:
            out[i] = (*shape[:dim], heads, *shape[dim + 1:])
    return tuple(out)


def _gqa_counted(fn: Callable[..., Any], where: tuple[int, tuple[int, int], int]
                 ) -> Callable[..., Any]:
    query, kv, dim = where

    def formula(*args: Any, **kwargs: Any) -> Any:
        return fn(*kv_heads_broadcast(args, query, kv, dim), **kwargs)

    formula.__name__ = formula.__qualname__ = getattr(fn, "__name__", "formula")
    formula.__doc__ = fn.__doc__
    return formula



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
register_formula(["prims::_low_memory_max_pool_with_offsets"])(per_element(1))

# --- backward ops (training graphs) ----------------------------------------------------
# Elementwise backward ops are tagged pointwise (one FLOP per element, as forward ones);
# these are not. Counts follow the forward's convention: one per element per step of the
# formula.

# softmax backward: grad - exp(out) * sum(grad) (log) or out * (grad - sum(grad * out)):
# a product, a reduction, a subtraction and a product per element
register_formula([aten._softmax_backward_data, aten._log_softmax_backward_data])(
    per_element(4))
# norm backward: x-hat again (2), two reductions (2), the combination (4)
register_formula([aten.native_layer_norm_backward, aten.native_batch_norm_backward,
                  aten.native_group_norm_backward, aten._fused_rms_norm_backward])(
    per_element(8))


@register_formula([aten.max_pool2d_with_indices_backward, aten.max_pool3d_with_indices_backward,
                   aten.embedding_dense_backward, aten.avg_pool2d_backward,
                   aten._adaptive_avg_pool2d_backward])
def grad_scatter_flop(grad_shape, *args, out_shape=None, **kwargs) -> Any:
    """Gradients summed into their sources: one add per element of the incoming gradient."""
    return _numel(grad_shape)


@register_formula([aten.scatter_add, aten.index_add, aten._unsafe_masked_index_put_accumulate])
def accumulate_flop(self_shape, *args, out_shape=None, **kwargs) -> Any:
    """Accumulating scatters: one add per element added (the last tensor argument)."""
    added = [a for a in args if isinstance(a, torch.Size)]
    return _numel(added[-1]) if added else 0


@register_formula([aten.nll_loss_forward, aten.nll_loss2d_forward])
def nll_loss_flop(input_shape, target_shape, *args, out_shape=None, **kwargs) -> Any:
    """Picks one log-probability per target and sums them: one FLOP per target."""
    return _numel(target_shape)


@register_formula([aten.nll_loss_backward, aten.nll_loss2d_backward])
def nll_loss_backward_flop(grad_shape, input_shape, target_shape, *args, out_shape=None,
                           **kwargs) -> Any:
    """Writes -grad (scaled) at one place per target."""
    return _numel(target_shape)


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
    # backward of views and index arithmetic: the gradient copied into place
    aten.slice_backward, aten.select_backward, aten.as_strided_scatter,
    "prims::iota", "prims::_low_memory_max_pool_offsets_to_indices",
)
# Python-level helpers Dynamo leaves in graphs.
register_zero_flop("_operator.getitem", "torch._C._log_api_usage_once", "builtins.getattr",
                   "torch._C._set_grad_enabled", "torch._C._autograd._get_data_attr",
                   "higher_order::with_effects", "torch.autograd.grad_mode._enter_inference_mode",
                   "torch.autograd.grad_mode._exit_inference_mode", "_operator.setitem")


def _unread_rows(table: Any, rows_read: Any) -> Any:
    """Bytes of a table's rows not read when ``rows_read`` rows (at most all) are."""
    rows = table.shape[0]
    unread = rows - torch.sym_min(rows_read, rows)
    return unread * (table.numel() // rows) * table.element_size()


# An embedding reads its tokens' rows of the table, not the table.
@register_io_bytes([aten.embedding])
def embedding_io_bytes(weight, indices, *args, **kwargs) -> Any:
    return PartialRead(0, _unread_rows(weight, indices.numel()))


@register_io_bytes(["torch.nn.functional.embedding"])
def functional_embedding_io_bytes(indices, weight, *args, **kwargs) -> Any:
    return PartialRead(1, _unread_rows(weight, indices.numel()))


# torch's functional collectives (tensor parallelism under torch.compile, vLLM's included):
# communication, not compute
register_zero_flop(*[f"{ns}::{op}" for ns in ("_c10d_functional", "c10d_functional")
                     for op in ("all_reduce", "all_reduce_", "all_reduce_coalesced",
                                "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
                                "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
                                "all_to_all_single", "broadcast", "broadcast_", "wait_tensor")])

# last: where torch's registry has a formula for an op, torch's is the one used (an op it
# starts to count with a later release among them)
load_torch_formulas()
