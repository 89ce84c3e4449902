"""fxflops: FLOPs, bytes, per-size time and MFU of the FX graphs torch.compile really runs.

``import fxflops`` stays light: the backend, the recorder and the integrations are loaded on
first use, and vLLM, matplotlib and CUDA only where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# the public API, by the module that defines each name (loaded at first use)
_LAZY = {
    "analyze": "fxflops.cost.analysis",
    "GraphCost": "fxflops.cost.graph_cost",
    "NodeCost": "fxflops.cost.graph_cost",
    "CostAt": "fxflops.cost.graph_cost",
    # (these and ``backend`` load every built-in formula first, the integrations' included:
    # a user's registration then always comes after the built-in ones)
    "register_formula": "fxflops.cost.analysis",
    "register_zero_flop": "fxflops.cost.analysis",
    "register_bytes": "fxflops.cost.analysis",
    "register_io_bytes": "fxflops.cost.analysis",
    "backend": "fxflops.instrument.backend",
    "recorder": "fxflops.outputs.session",
    "reset_recorder": "fxflops.outputs.session",
    "load_report": "fxflops.report.files",
}

__all__ = [  # noqa: F822 (lazy: resolved by __getattr__)
    "CostAt", "GraphCost", "NodeCost", "analyze", "backend", "load_report", "recorder",
    "register_bytes", "register_formula", "register_io_bytes", "register_zero_flop",
    "reset_recorder",
]

if TYPE_CHECKING:
    from fxflops.cost.analysis import analyze
    from fxflops.cost.graph_cost import CostAt, GraphCost, NodeCost
    from fxflops.cost.registry import (
        register_bytes,
        register_formula,
        register_io_bytes,
        register_zero_flop,
    )
    from fxflops.instrument.backend import backend
    from fxflops.outputs.session import recorder, reset_recorder
    from fxflops.report.files import load_report


# the names that count with every built-in formula: the engine-neutral ones (``cost``) and
# every integration's (``integrations.load_formulas``, which imports no engine)
_WITH_EVERY_FORMULA = {"analyze", "backend", "register_formula", "register_zero_flop",
                       "register_bytes", "register_io_bytes"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fxflops' has no attribute {name!r}")
    import importlib

    if name in _WITH_EVERY_FORMULA:
        from fxflops.integrations import load_formulas

        load_formulas()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
