"""What other programs load by name: the ``torch_dynamo_backends`` entry point.

``torch.compile(m, backend="fxflops")`` makes Dynamo load ``fxflops_backend`` from here
when the backend is looked up (at ``torch.compile``, before the first call). Getting it is
fxflops' first use: the hooks that must precede a training job's first step are installed
then (``backend.first_use``), and importing this module installs nothing.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "fxflops_backend":
        from fxflops.instrument.backend import first_use, fxflops_backend

        first_use()
        return fxflops_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
