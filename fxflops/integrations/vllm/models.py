"""The models vLLM compiles in this process, and a vLLM layer found by the name its ops
call it.

vLLM's opaque graph ops (a MoE's ``vllm::moe_forward``, a state-space layer's
``vllm::mamba_mixer2``) name their layer rather than pass its weights and sizes:
:func:`find_layer` resolves that name, from vLLM's forward context (a step running), the
vLLM config being compiled under (its ``static_forward_context``), or the models noted
here (on CPU, mode 2 compiles outside any vLLM config or forward context). The notes are
weak references, one per model (several: a speculative decoder's drafter, an encoder),
with the model tag each was built under; ``layers`` describes their layers for the safety
net. Nothing here imports vLLM at import: only inside a lookup, once vLLM is running.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

# the models vLLM compiles in this process, oldest first
_MODELS: list[weakref.ref[torch.nn.Module]] = []
# per model: the model tag vLLM built it under (``set_model_tag``: "backbone", a drafter's)
_TAGS: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
# per model: the modules by the name vLLM's ops call them
_NAMES: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.nn.Module]] = \
    weakref.WeakKeyDictionary()


def note(model: torch.nn.Module, tag: str | None = None) -> bool:
    """Note a model vLLM is about to compile, built under model tag ``tag``; False: it was
    noted before (its tag updated)."""
    if tag is not None:
        _TAGS[model] = tag
    if any(ref() is model for ref in _MODELS):
        return False
    _MODELS[:] = [ref for ref in _MODELS if ref() is not None]
    _MODELS.append(weakref.ref(model))
    return True


def forget() -> None:
    """Forget every model noted (a process that uninstalls the plugin; tests)."""
    _MODELS.clear()


def live() -> list[torch.nn.Module]:
    """The models noted that still exist, oldest first."""
    return [model for model in (ref() for ref in list(_MODELS)) if model is not None]


def tag_of(model: torch.nn.Module) -> str | None:
    """The model tag ``model`` was built under (None: not known)."""
    return _TAGS.get(model)


def noted_layer(name: str) -> torch.nn.Module | None:
    """The module of a noted model that vLLM knows by ``name`` (its ``layer_name`` or
    ``prefix``)."""
    for model in live():
        names = _NAMES.get(model)
        if names is None:
            names = _NAMES[model] = {
                str(key): module for module in model.modules()
                for key in (getattr(module, "layer_name", None), getattr(module, "prefix", None))
                if isinstance(key, str) and key}
        if name in names:
            return names[name]
    return None


def _from_forward_context(name: str) -> Any:
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    return get_forward_context().no_compile_layers.get(name)


def _from_current_config(name: str) -> Any:
    from vllm.config import get_current_vllm_config

    return get_current_vllm_config().compilation_config.static_forward_context.get(name)


_LOOKUPS = (_from_forward_context, _from_current_config, noted_layer)


def find_layer(name: str) -> Any:
    """The vLLM module called ``name`` (MoE and state-space layers keep their weights and
    sizes there, not in their op's arguments): from vLLM's forward context, the config vLLM
    compiles under, or the models noted here, whichever has it. Raises ``LookupError``
    where none has it (the formula asking fails; the analysis says which op)."""
    for lookup in _LOOKUPS:
        try:
            layer = lookup(name)
        except Exception:  # that source is not there now (no vLLM, context or config)
            layer = None
        if layer is not None:
            return layer
    raise LookupError(f"vLLM layer {name!r} not found (no forward context, vLLM config or "
                      "model that has it)")
