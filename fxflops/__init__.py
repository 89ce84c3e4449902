"""fxflops: FLOPs, bytes, per-size time and MFU of the FX graphs torch.compile really runs.

``import fxflops`` stays light: the backend, the recorder and the integrations are loaded on
first use, and vLLM, matplotlib and CUDA only where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# the public API: each name, the module that defines it (and its name there, where that
# differs), loaded at first use
_LAZY: dict[str, str | tuple[str, str]] = {
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
    "eager": "fxflops.instrument.eager",
    # the process's recorder (``recording.recorder``) with its outputs attached
    "recorder": ("fxflops.outputs.session", "session"),
    "reset_recorder": ("fxflops.outputs.session", "reset_session"),
    "scope": "fxflops.report.scope",
    "peak": "fxflops.peaks.devices",
    "load_report": "fxflops.report.files",
}

__all__ = [  # noqa: F822 (lazy: resolved by __getattr__)
    "CostAt", "GraphCost", "NodeCost", "analyze", "backend", "eager", "load_report", "peak", "recorder",
    "register_bytes", "register_formula", "register_io_bytes", "register_zero_flop",
    "reset_recorder", "scope",
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
    from fxflops.instrument.eager import eager
    from fxflops.outputs.session import reset_session as reset_recorder
    from fxflops.outputs.session import session as recorder
    from fxflops.peaks.devices import peak
    from fxflops.report.files import load_report
    from fxflops.report.scope import scope


# the names that count with every built-in formula: the engine-neutral ones (``cost``) and
# every integration's (``integrations.load_formulas``, which imports no engine)
_WITH_EVERY_FORMULA = {"analyze", "backend", "eager", "register_formula", "register_zero_flop",
                       "register_bytes", "register_io_bytes"}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'fxflops' has no attribute {name!r}")
    import importlib

    if name in _WITH_EVERY_FORMULA:
        from fxflops.integrations import load_formulas

        load_formulas()
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
