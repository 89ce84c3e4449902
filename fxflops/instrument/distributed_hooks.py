"""What fxflops reads of a torch.distributed training job besides its ranks
(``fxflops.placement``):

- **FSDP2's collectives.** With per-block compile, FSDP2 all-gathers each block's
  parameters (before its forward, and again before its backward when it reshards after
  the forward) and reduce-scatters its gradients, in its hooks, outside the compiled
  graphs: their bytes are in no graph's. They are counted where FSDP2 makes them, at its
  own collective objects (``AllGather``, ``ReduceScatter``: what ``set_custom_all_gather``
  takes), per call: the bytes of the unsharded buffer (an all-gather's output, a
  reduce-scatter's input; what nccl-tests calls the size), and reported apart: the
  report's ``collectives``, and per step in its step rows (``collective_bytes``).
- **A DDP-wrapped model that compiled nothing.** ``torch.compile(DDP(model))`` compiles
  the model's own ``forward``; a model that is a ``torch.nn`` container (``nn.Sequential``)
  has none that Dynamo compiles from DDP (torch's own frames are skipped there), so the
  model runs eagerly and nothing is recorded. Said once, at exit, with what works:
  ``DDP(torch.compile(model))``.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from typing import Any

from fxflops import torch_compat
from fxflops.patching import Patch, patch_method, subclasses

log = logging.getLogger(__name__)

_FSDP_COLLECTIVES = torch_compat.PRIVATES["fsdp_collectives"].module
_FSDP_API = torch_compat.PRIVATES["fsdp_api"].module
# FSDP2's collective kinds, and the argument holding the unsharded buffer
_KINDS = (("AllGather", "all_gather", "output_tensor"),
          ("ReduceScatter", "reduce_scatter", "input_tensor"))
PATCHES: list[Patch] = []


def install_fsdp_counting() -> bool:
    """Count FSDP2's collectives in this process from now on, if FSDP2 is loaded (at the
    first compile with fxflops: before the first step's); idempotent. Returns whether they
    are counted."""
    api = sys.modules.get(_FSDP_API)
    if api is None or _FSDP_COLLECTIVES not in sys.modules:
        return False
    for base_name, kind, argument in _KINDS:
        base = getattr(api, base_name, None)
        if not isinstance(base, type):
            continue
        for cls in subclasses(base):
            call = cls.__dict__.get("__call__")
            if callable(call):
                patch = patch_method(cls, "__call__", "collectives",
                                     _counting(kind, argument))
                if patch.applied:
                    PATCHES.append(patch)
    return bool(PATCHES)


def _counting(kind: str, argument: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                tensor = signature.bind(*args, **kwargs).arguments[argument]
                count(kind, tensor.numel() * tensor.element_size())
            except Exception as e:  # FSDP changed: its collective runs, uncounted
                from fxflops.util import warn_once

                warn_once(f"collectives:{kind}", "fxflops: FSDP %s not counted (%s: %s)",
                          kind, type(e).__name__, e)
            return original(*args, **kwargs)

        return wrapper

    return wrap


def count(kind: str, nbytes: int) -> None:
    """One collective of ``kind`` over a buffer of ``nbytes``, in this process's recorder."""
    from fxflops.recording.recorder import recorder

    calls_bytes = recorder().collectives.setdefault(kind, [0, 0])
    calls_bytes[0] += 1
    calls_bytes[1] += nbytes


def uninstall() -> None:
    while PATCHES:
        PATCHES.pop().undo()


# --- torch.compile(DDP(model)) that compiled nothing -------------------------------------

_DDP_SKIP = "_inside_ddp_forward"


def ddp_compiled_nothing() -> bool:
    """Whether Dynamo stopped at DDP's forward (the graph break at its
    ``_inside_ddp_forward``) and fxflops recorded no graph in this process."""
    from fxflops.recording.recorder import current

    utils = sys.modules.get(torch_compat.PRIVATES["dynamo_utils"].module)
    if utils is None:
        return False
    breaks = utils.counters.get("graph_break") or {}
    if not any(_DDP_SKIP in str(reason) for reason in breaks):
        return False
    rec = current()
    return rec is None or not (rec.graphs or rec.uninstrumented)


def check_ddp_compiled() -> None:
    """(At exit.) Say so when a DDP-wrapped model compiled nothing."""
    try:
        if ddp_compiled_nothing():
            log.warning(
                "fxflops: torch.compile(DDP(model)) compiled no graph: Dynamo does not "
                "compile a torch.nn container's forward (nn.Sequential, ...) from inside "
                "DDP, so the model ran eagerly and nothing was counted. Compile the model "
                "before wrapping it: DDP(torch.compile(model, backend='fxflops')) (DDP's "
                "optimizer still splits it at its buckets), or give it a forward of its "
                "own (docs/many-devices.md)")
    except Exception:  # at exit: never a traceback of fxflops' own
        pass
