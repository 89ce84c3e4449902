"""The engine-neutral built-in cost formulas, registered by importing this package.

``aten`` (what torch's flop counter leaves out) registers its own through
``fxflops.cost.registry``; ``builders`` holds the shared pieces that table formulas are
made of (a GEMM, rotary embedding, a fused mixture of experts, an attention kernel). A
serving engine's own ops are formulated by its integration, which registers them itself
(vLLM's: ``fxflops.integrations.vllm.formulas``).
"""

from fxflops.cost.formulas import aten  # noqa: F401 (imported for its registrations)
