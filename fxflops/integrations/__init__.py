"""fxflops inside the serving engines that compile graphs for it: ``vllm`` (its plugin,
hooks, op formulas, forward and drafter clocks). Everything that knows an engine lives in
its folder here; the layers below know engine-neutral concepts only.

:func:`load_formulas` registers every integration's op formulas, importing none of the
engines (a formula names its ops by their qualified names): what the public API does
before it analyses, compiles or registers anything (``fxflops.analyze``,
``fxflops.backend``, ``fxflops.register_*``), so that a user's formula always comes after
the built-in ones. Inside an engine, its plugin registers them as it switches fxflops on.
"""

from __future__ import annotations

# every integration's module of op formulas
FORMULA_MODULES = ("fxflops.integrations.vllm.formulas",)


def load_formulas() -> None:
    """Register every integration's op formulas (idempotent: a module registers once;
    never raising: a module that fails leaves graphs uninstrumented, said once,
    ``cost.registry.load_formulas``)."""
    from fxflops.cost import formulas, registry

    registry.load_formulas(*formulas.BUILTIN, *FORMULA_MODULES)
