"""A speculator of vLLM's V2 model runner, as its speculator modules are written
(``vllm/v1/worker/gpu/spec_decode/*/speculator.py``), for the tests: a subclass of vLLM's
real ``DraftModelSpeculator`` in a module of its own that imports ``set_forward_context``,
whose ``propose`` runs an EAGLE-like drafter, ``K`` passes a step:

- pass 0 over the target's tokens, with the target's attention metadata (EAGLE's and MTP's
  first pass builds none of its own);
- passes 1 .. K-1, one token per request, each with metadata built by vLLM's own
  ``_build_uniform_attn_metadata`` (``_build_attn_metadata``: query lengths, and sequence
  lengths as the target's host upper bound plus the pass's step, at most the model's).

vLLM's real ``__init__`` needs a GPU runner's state: the stand-in is made with
``object.__new__`` and given the attributes ``_build_attn_metadata`` reads (block tables,
input buffers, KV-cache config), CPU tensors all.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from vllm.forward_context import set_forward_context
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator


class StandInSpeculator(DraftModelSpeculator):
    # (what a speculator does with CUDA graphs and its model's loading: not here)
    def capture(self) -> None:
        raise NotImplementedError

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        raise NotImplementedError

    def load_draft_model(self, target_model: Any) -> Any:
        raise NotImplementedError

    def propose(self, input_batch: Any, attn_metadata: Any, *args: Any,
                num_speculative_tokens: int = 2, dummy_run: bool = False,
                **kwargs: Any) -> torch.Tensor:
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

        n = int(input_batch.num_reqs)
        with set_forward_context(attn_metadata, self.vllm_config,
                                 num_tokens=int(input_batch.num_tokens)):
            self.passes.append("target's metadata")
        for step in range(1, num_speculative_tokens):
            desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=n,
                                            num_reqs=None)
            metadata = self._build_uniform_attn_metadata(
                desc, n, 1, input_batch.seq_lens_cpu_upper_bound, step)
            with set_forward_context(metadata, self.vllm_config, num_tokens=n):
                self.passes.append(f"step {step}")
        return torch.zeros(n, num_speculative_tokens, dtype=torch.int64)


def stand_in(vllm_config: Any, model: torch.nn.Module, max_reqs: int = 8,
             max_tokens: int = 64) -> StandInSpeculator:
    """A ``StandInSpeculator`` with what vLLM's ``_build_attn_metadata`` reads."""
    spec = object.__new__(StandInSpeculator)
    spec.vllm_config = vllm_config
    spec.device = torch.device("cpu")
    spec.model = model
    spec.passes = []
    spec.dcp_size = 1
    if not isinstance(getattr(StandInSpeculator, "max_model_len", None), property):
        spec.max_model_len = vllm_config.model_config.max_model_len  # (0.32: an attribute)
    spec.draft_max_seq_len = vllm_config.model_config.max_model_len
    spec.arange_np = np.arange(max_reqs + 1, dtype=np.int32)
    spec.attn_groups = []
    spec.kv_cache_config = SimpleNamespace(kv_cache_groups=[])
    spec.block_tables = SimpleNamespace(
        input_block_tables=[torch.zeros(max_reqs, 4, dtype=torch.int32)],
        slot_mappings=torch.zeros(1, max_tokens, dtype=torch.int64))
    spec.input_buffers = SimpleNamespace(
        query_start_loc=torch.zeros(max_reqs + 1, dtype=torch.int32),
        seq_lens=torch.zeros(max_reqs, dtype=torch.int32),
        positions=torch.zeros(max_tokens, dtype=torch.int64))
    spec.draft_is_prefilling = torch.zeros(max_reqs, dtype=torch.bool)
    return spec
