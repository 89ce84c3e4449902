"""vLLM's layers described by their own sizes, for fxflops' layer safety net.

Every model vLLM compiles passes through ``TorchCompileWithNoGuardsWrapper.__init__`` once
it is built (``vllm/compilation/wrapper.py``; mode 2 and mode 3 alike): the plugin keeps a
weak reference to it there (``note_model``, kept in ``models``), and when a graph of it is
analysed the census describes its layers (``fxflops.cost.layer_check.LayerSpec``), keyed by
module path as the graph's ``nn_module_stack`` names them:

- linear layers (``LinearBase``: column/row-parallel, QKV, merged, replicated; quantised
  or not): this rank's ``input_size_per_partition`` x ``output_size_per_partition``;
- mixtures of experts (``MoERunner``, or an older ``FusedMoE``): top-k, experts on this
  rank and in all, hidden size, intermediate size per partition, gated or not;
- attention layers (standard and MLA): FLOPs per (query, key) pair and KV-cache bytes per
  context token (``formulas.ops``' arithmetic, the one place it lives).

The census never imports anything vLLM does not already have loaded, and is made once per
model (the sizes do not change after construction).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from fxflops.cost.layer_check import LayerSpec, type_name
from fxflops.instrument.plan import register_layer_source, unregister_layer_source
from fxflops.integrations.vllm import models
from fxflops.integrations.vllm.formulas.ops import attention_costs, moe_dims
from fxflops.integrations.vllm.hooks import COMPILING_TAG

# each noted model's census, once made
_CENSUS: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, LayerSpec]] = \
    weakref.WeakKeyDictionary()


def note_model(model: torch.nn.Module, tag: str | None = None) -> None:
    """A model vLLM is about to compile (its layers are built; weights may load later),
    built under model tag ``tag``: its layers are described for every graph of it from now
    on (``census_of_models``, a layer source of ``fxflops.instrument.plan``), and its
    modules found by the names vLLM's ops call them (``models.find_layer``)."""
    models.note(model, tag)
    register_layer_source(census_of_models)


def forget_models() -> None:
    """Forget every model noted (a process that uninstalls the plugin; tests)."""
    models.forget()
    unregister_layer_source(census_of_models)


def census_of_models(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None
                     ) -> list[dict[str, LayerSpec]]:
    """The census of the model ``gm`` is a graph of (a layer source of
    ``fxflops.instrument.plan``): the noted model whose weights the graph holds (its
    constants, as vLLM's graphs hold them, or the parameters among its example inputs). A speculative
    decoder's drafter has the target's module paths, often narrower layers: a graph is
    checked against its own model's layers, never another's. Where the weights tell no
    model (a piecewise graph, analysed from fake inputs), the model noted under the model
    tag the graph is compiled under (``hooks.COMPILING_TAG``); else the one model noted,
    else none."""
    live = models.live()
    if len(live) > 1:
        # the model most of the graph's weights are of (an EAGLE drafter's graph holds the
        # target's embedding too, which the two share); a tie tells none
        held = _tensors_held(gm, example_inputs)
        score = {id(m): sum(id(t) in held for t in (*m.parameters(), *m.buffers()))
                 for m in live}
        best = max(score.values())
        tag = COMPILING_TAG.get()
        if best:
            live = [m for m in live if score[id(m)] == best]
        elif tag is not None:
            live = [m for m in live if models.tag_of(m) == tag]
    if len(live) != 1:
        return []
    (model,) = live
    census = _CENSUS.get(model)
    if census is None:
        census = _CENSUS[model] = census_of(model)
    return [census]


def _tensors_held(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None
                  ) -> set[int]:
    """The ids of the tensors ``gm`` holds as constants (``get_attr``) or is given."""
    held = {id(x) for x in example_inputs or () if isinstance(x, torch.Tensor)}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor):
            held.add(id(value))
    return held


def census_of(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, LayerSpec]:
    """{module path: spec} of every layer of ``model`` fxflops can describe. ``dtype``: of
    the values in an attention layer's KV cache where its own spec cannot say (the model's
    dtype by default, which is vLLM's "auto")."""
    config = _model_config(model)
    if dtype is None:
        dtype = _model_dtype(config)
    out: dict[str, LayerSpec] = {}
    for path, module in model.named_modules():
        spec = layer_spec(module, dtype, config)
        if spec is not None:
            out[path] = spec
    return out


def layer_spec(module: torch.nn.Module, dtype: torch.dtype,
               vllm_config: Any = None) -> LayerSpec | None:
    """The spec of one vLLM layer, or None for anything else (read by duck typing: the
    attribute names are vLLM's, their classes move between releases)."""
    name = type_name(type(module))
    if _is_linear(module):
        k: Any = getattr(module, "input_size_per_partition", None) or module.input_size
        n: Any = getattr(module, "output_size_per_partition", None) or module.output_size
        return LayerSpec("linear", name, in_features=int(k), out_features=int(n))
    dims = moe_dims(module) if _is_moe(module) else None
    if dims is not None:
        return LayerSpec("moe", name, hidden=dims.hidden, intermediate=dims.intermediate,
                         top_k=dims.top_k, experts=dims.local_experts,
                         global_experts=dims.global_experts, gated=dims.gated)
    costs = attention_costs(module, torch.empty((), dtype=dtype).element_size(), vllm_config)
    if costs is not None:
        per_pair, per_token = costs
        return LayerSpec("attention", name, flops_per_pair=per_pair,
                         bytes_per_context_token=per_token,
                         layer_name=getattr(module, "layer_name", None))
    return None


def _is_linear(module: torch.nn.Module) -> bool:
    try:
        from vllm.model_executor.layers.linear import LinearBase
    except Exception:  # vLLM moved it: no linear layers described
        return False
    return isinstance(module, LinearBase) and hasattr(module, "input_size")


def _is_moe(module: torch.nn.Module) -> bool:
    return hasattr(module, "moe_config") or (
        hasattr(module, "top_k") and hasattr(module, "intermediate_size_per_partition"))


def _model_config(model: torch.nn.Module) -> Any:
    """The vLLM config a model was built with (None: none to be found)."""
    config = getattr(model, "vllm_config", None)
    if getattr(config, "model_config", None) is not None:
        return config
    try:
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
    except Exception:
        return None
    return config if getattr(config, "model_config", None) is not None else None


def _model_dtype(config: Any) -> torch.dtype:
    dtype = getattr(getattr(config, "model_config", None), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()


def install_census() -> Any:
    """Note every model vLLM compiles (``TorchCompileWithNoGuardsWrapper.__init__``, called
    once the model's layers are built)."""
    from vllm.compilation import backends, wrapper

    from fxflops.integrations.vllm import hooks

    def before(named: dict[str, Any]) -> None:
        model = named["self"]
        if isinstance(model, torch.nn.Module):
            note_model(model, getattr(backends, "model_tag", None))
        # the model is built: the worker's classes are imported, and its memory profiling
        # and warm-up are still to come
        hooks.install_warmup_phases()

    hooks._patch(wrapper.TorchCompileWithNoGuardsWrapper, "__init__", "census",
                 lambda original: hooks.passthrough(original, before=before,
                                                    what="layer census"))
