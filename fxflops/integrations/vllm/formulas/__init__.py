"""vLLM's ops, formulated: every formula and op class the vLLM integration registers.

Importing this package (or any module of it: Python imports the package first) registers
them all in ``fxflops.cost.registry``, once per process: a module runs once, and the
registry refuses a second registration of an op. Nothing here imports vLLM: the formulas
name ops by their qualified names, and resolve the layer an opaque op names
(``fxflops.integrations.vllm.models.find_layer``) only while a graph is analysed. The
plugin imports it as fxflops is switched on in a vLLM process (``plugin.switch_on``,
``plugin.install``), before anything is compiled or loaded; so does the public API
(``fxflops.analyze``, ``fxflops.backend``, ``fxflops.register_*``).

One module per source of ops: ``ops`` (vLLM's graph ops: GEMMs, attention, MoE, rotary;
the attention, KV-cache and MoE arithmetic the forward rows and the layer census share),
``kernels`` (vLLM's and zentorch's kernels, one table line per op), ``gpu`` (the GPU
build's ops), ``ssm`` (Mamba and gated-delta-rule layers), ``mhc`` (DeepSeek-V4's
hyper-connections), ``op_classes`` (the ops that are zero-FLOP or not compute, by design).
The tables are made of ``fxflops.cost.formulas.builders``' pieces.
"""

from fxflops.integrations.vllm.formulas import (  # noqa: F401 (imported for their registrations)
    gpu,
    kernels,
    mhc,
    op_classes,
    ops,
    ssm,
)
