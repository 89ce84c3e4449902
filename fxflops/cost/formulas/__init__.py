"""Every built-in cost formula, registered by importing this package.

One module per source of ops, each registering its own through ``fxflops.cost.registry``:
``aten`` (what torch's flop counter leaves out), ``vllm`` (vLLM's graph ops: GEMMs,
attention, MoE, rotary), ``vllm_kernels`` (vLLM's and zentorch's kernels, one table line
per op), ``vllm_gpu`` (the GPU build's ops), ``ssm`` (Mamba and gated-delta-rule layers), ``mhc`` (DeepSeek-V4's hyper-connections),
``vllm_op_classes`` (the ops that are zero-FLOP or not compute, by design). ``builders``
holds the shared pieces the table formulas are made of.
"""

from fxflops.cost.formulas import (  # noqa: F401 (imported for their registrations)
    aten,
    mhc,
    ssm,
    vllm,
    vllm_gpu,
    vllm_kernels,
    vllm_op_classes,
)
