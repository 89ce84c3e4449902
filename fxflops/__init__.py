"""fxflops: FLOPs, bytes, per-size time and MFU of the FX graphs torch.compile really runs.

``import fxflops`` stays light: the backend, the recorder and the integrations are loaded on
first use, and vLLM, matplotlib and CUDA only where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "analyze": "fxflops.analysis",
    "GraphCost": "fxflops.cost",
    "NodeCost": "fxflops.cost",
    "CostAt": "fxflops.cost",
    # through analysis, which loads the built-in formulas first: a user's registration
    # then always replaces a built-in one, never the other way round
    "register_formula": "fxflops.analysis",
    "register_zero_flop": "fxflops.analysis",
    "register_bytes": "fxflops.analysis",
    "register_io_bytes": "fxflops.analysis",
    "backend": "fxflops.backends",
    "recorder": "fxflops.session",
    "reset_recorder": "fxflops.session",
    "load_report": "fxflops.report",
}

__all__ = [  # noqa: F822 (lazy: resolved by __getattr__)
    "CostAt", "GraphCost", "NodeCost", "analyze", "backend", "load_report", "recorder",
    "register_bytes", "register_formula", "register_io_bytes", "register_zero_flop",
    "reset_recorder",
]

if TYPE_CHECKING:
    from fxflops.analysis import analyze
    from fxflops.backends import backend
    from fxflops.cost import CostAt, GraphCost, NodeCost
    from fxflops.registry import (
        register_bytes,
        register_formula,
        register_io_bytes,
        register_zero_flop,
    )
    from fxflops.report import load_report
    from fxflops.session import recorder, reset_recorder


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fxflops' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
