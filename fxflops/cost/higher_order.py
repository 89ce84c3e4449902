"""Higher-order ops: the cost of the subgraphs they run, counted as torch runs them.

A higher-order op (HOP) node calls subgraphs the graph holds as ``get_attr`` modules:
``invoke_subgraph`` (``torch.compiler.nested_compile_region``), ``cond``, ``while_loop``,
``scan``, ``map_impl``, ``associative_scan``, ``tag_activation_checkpoint``, ``wrap``.
What each runs, and how often, is the HOP's semantics: a table here, one entry per HOP,
each returning :class:`Runs` (which subgraph, on which operands, how many times). The
analysis (``cost.analysis``) costs each subgraph with the same pass as the graph around
it, symbolic where the sizes are, and adds them up; this module knows no analysis.

HOPs with a FLOP formula of their own in torch's registry (``flex_attention`` and its
backward) are not here: the registry's formula counts them, as ``FlopCounterMode`` does.

Conventions (docs/conventions.md, "Higher-order ops"):

- ``cond``: the branch that runs where the predicate is known when the graph is bound: a
  constant, or an expression of the size symbols (a ``sympy.Piecewise`` of the two
  branches' costs, chosen per size). A predicate computed from tensor data is not known
  without a device sync: the larger branch is counted per class (matmul and vector FLOPs
  apart), as ``FlopCounterMode`` does, and the node says so.
- ``scan``, ``map_impl``: the body once per slice of the scanned dimension (trip count
  from the shapes, a symbol where the size is one); ``associative_scan``: ``n - 1``
  combines of one element each (the sequential work; Inductor lowers it to a scan kernel).
- ``while_loop``: the trip count is data, not shape: one iteration (condition and body)
  is counted per call, and the node says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

# a subgraph run: the module, the operands it is called with
Call = tuple[torch.fx.GraphModule, Sequence[Any]]


class Runs(NamedTuple):
    """What one HOP node runs: ``calls`` each ``times`` (a count, possibly symbolic).
    ``branches``: a ``cond``'s (true, false) calls and its predicate (``pred``) instead."""

    calls: tuple[Call, ...] = ()
    times: Any = 1
    branches: tuple[Call, Call] | None = None
    pred: Any = None
    # why the count is not the exact work of every call (one loop iteration, say)
    note: str | None = None


HANDLERS: dict[str, Callable[[Sequence[Any], dict[str, Any]], Runs]] = {}


def register_higher_order(*names: str) -> Callable[[Callable[..., Runs]], Callable[..., Runs]]:
    """Register what the HOPs ``names`` (``"higher_order::cond"``) run."""

    def decorator(fn: Callable[..., Runs]) -> Callable[..., Runs]:
        for name in names:
            HANDLERS[name] = fn
        return fn

    return decorator


def _first_slices(xs: Sequence[Any]) -> list[Any]:
    """One slice of each scanned tensor along dim 0: what the body is called with."""
    return [x.select(0, 0) if isinstance(x, torch.Tensor) else x for x in xs]


def _trip(xs: Sequence[Any]) -> Any:
    first = next((x for x in xs if isinstance(x, torch.Tensor)), None)
    return first.shape[0] if first is not None else 0


@register_higher_order("higher_order::invoke_subgraph")
def _invoke_subgraph(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (subgraph, identifier, *operands)
    return Runs(calls=((args[0], tuple(args[2:])),))


@register_higher_order("higher_order::wrap", "higher_order::tag_activation_checkpoint")
def _wrapped_body(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (body, *operands): the body runs once (a checkpointed region's recomputation is the
    # backward graph's, where AOTAutograd's partitioner has inlined it: ``recomputed``)
    return Runs(calls=((args[0], tuple(args[1:])),))


@register_higher_order("higher_order::wrap_with_set_grad_enabled")
def _grad_enabled_body(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (enabled, body, *operands)
    return Runs(calls=((args[1], tuple(args[2:])),))


@register_higher_order("higher_order::wrap_with_autocast")
def _autocast_body(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (device_type, dtype, enabled, cache_enabled, body, *operands)
    return Runs(calls=((args[4], tuple(args[5:])),))


@register_higher_order("higher_order::cond")
def _cond(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (pred, true_fn, false_fn, operands)
    pred, true_fn, false_fn, operands = args[:4]
    operands = tuple(operands)
    return Runs(branches=((true_fn, operands), (false_fn, operands)), pred=pred)


@register_higher_order("higher_order::scan")
def _scan(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (combine_fn, init, xs, additional_inputs): combine_fn(*carry, *x_slices, *additional)
    combine_fn, init, xs, additional = args[:4]
    operands = (*init, *_first_slices(xs), *additional)
    return Runs(calls=((combine_fn, operands),), times=_trip(xs))


@register_higher_order("higher_order::map_impl")
def _map(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (body, xs, pos_args): body(*x_slices, *pos_args)
    body, xs, pos_args = args[:3]
    return Runs(calls=((body, (*_first_slices(xs), *pos_args)),), times=_trip(xs))


@register_higher_order("higher_order::associative_scan")
def _associative_scan(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (combine_fn, xs, additional_inputs): combine_fn(*a_slices, *b_slices, *additional)
    combine_fn, xs, additional = args[:3]
    one = _first_slices(xs)
    return Runs(calls=((combine_fn, (*one, *one, *additional)),), times=_trip(xs) - 1)


@register_higher_order("higher_order::while_loop")
def _while_loop(args: Sequence[Any], kwargs: dict[str, Any]) -> Runs:
    # (cond_fn, body_fn, carried_inputs, additional_inputs)
    cond_fn, body_fn, carried, additional = args[:4]
    operands = (*carried, *additional)
    return Runs(calls=((cond_fn, operands), (body_fn, operands)),
                note="while_loop: one iteration counted per call (its trip count is data)")


def handler_for(name: str) -> Callable[[Sequence[Any], dict[str, Any]], Runs] | None:
    return HANDLERS.get(name)
