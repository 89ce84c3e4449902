"""The engine-neutral built-in cost formulas, registered by importing this package.

``aten`` (torch's own registry, and what it leaves out) registers its own through
``fxflops.cost.registry``; ``builders`` holds the shared pieces that table formulas are
made of (a GEMM, rotary embedding, a fused mixture of experts, an attention kernel). A
serving engine's own ops are formulated by its integration, which registers them itself
(vLLM's: ``fxflops.integrations.vllm.formulas``). Loading never raises
(``registry.load_formulas``): a failure is remembered, and the analysis refuses to cost
graphs with it (``registry.require_formulas``).
"""

from fxflops.cost.registry import load_formulas

BUILTIN = ("fxflops.cost.formulas.aten",)

load_formulas(*BUILTIN)
