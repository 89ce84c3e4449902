"""A tiny vLLM run (in one process) whose steps are padded as under CUDA graphs.

    python tests/vllm_padded_run.py OUT

CUDA graphs cannot run on CPU, so vLLM's CPU runner never pads. This stands in for the one
thing CUDA-graph capture changes for padding: ``CudagraphDispatcher.dispatch`` returns a
batch descriptor padded up to the next multiple of 8 (as capture sizes 8, 16, 24, ...
would), and vLLM's own runner then pads the step (inputs, positions, slot mapping) and runs
it at that size. Everything else is the real engine. tests/test_serving.py reads the report.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAD_TO = 8

if __name__ == "__main__":
    out = sys.argv[1]
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "FXFLOPS": "1",
                       "FXFLOPS_OUT": out, "VLLM_CPU_KVCACHE_SPACE": "1",
                       "VLLM_CACHE_ROOT": os.path.join(out, "cache")})
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import vllm_tiny
    from vllm import LLM, SamplingParams
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.plugins import load_general_plugins
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    def dispatch(self, num_tokens, *args, **kwargs):
        return CUDAGraphMode.NONE, BatchDescriptor(-(-num_tokens // PAD_TO) * PAD_TO)

    CudagraphDispatcher.dispatch = dispatch
    load_general_plugins()
    model = vllm_tiny.tiny_llama(os.path.join(out, "model"))
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=512, gpu_memory_utilization=0.3, max_num_seqs=8, seed=0,
              compilation_config={"mode": 2, "backend": "eager"})
    # one request: a prefill of 13 tokens (padded to 16), then decodes of 1 (padded to 8)
    llm.generate([{"prompt_token_ids": list(range(10, 23))}],
                 SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False))
