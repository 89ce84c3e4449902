"""A vLLM general plugin for the tests: steps padded as under CUDA graphs, on CPU.

CUDA graphs cannot run on CPU, so vLLM's CPU runner never pads a step. This plugin stands in
for the one thing CUDA-graph capture changes for padding: ``CudagraphDispatcher.dispatch``
returns a batch descriptor padded up to the next multiple of 8 (as capture sizes 8, 16,
24, ... would), and vLLM's own runner then pads the step (inputs, positions, slot mapping)
and runs it at that size. Everything else is the real engine.

tests/outputs/test_serving.py puts this folder on ``PYTHONPATH`` of one ``vllm serve``; vLLM finds
the plugin through its entry point (``fxflops_test_padding-0.1.dist-info``) and loads it in
every process, as it loads fxflops'.
"""

PAD_TO = 8


def register() -> None:
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    if getattr(CudagraphDispatcher.dispatch, "_pads", False):
        return

    def dispatch(self, num_tokens, *args, **kwargs):
        return CUDAGraphMode.NONE, BatchDescriptor(-(-num_tokens // PAD_TO) * PAD_TO)

    dispatch._pads = True
    CudagraphDispatcher.dispatch = dispatch
