"""The vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process, workers included, before compiling. Unless asked, it does
nothing but let ``-O '{"mode": 3, "backend": "fxflops"}'`` through vLLM's validation:

- ``backend="fxflops"`` in mode 2 (DYNAMO_TRACE_ONCE) is the native path: vLLM resolves the
  name through torch's backend registry; this plugin then adds the whole-forward timing and
  the attention FLOPs.
- ``FXFLOPS=1`` instruments whatever vLLM compiles: mode 2 with any backend, and mode 3's
  piecewise graphs through vLLM's compiler manager (compile and cache-load paths).
- ``backend="fxflops"`` in mode 3 means ``FXFLOPS=1`` with vLLM's own Inductor backend.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("fxflops")
_installed: set[str] = set()


def enabled() -> bool:
    return os.environ.get("FXFLOPS", "") not in ("", "0", "false", "False")


def register() -> None:
    """Entry point: vLLM calls this in every process."""
    try:
        _install_backend_name_shim()
        if enabled():
            install()
    except Exception as e:  # the plugin must never stop vLLM from starting
        log.warning("fxflops: vLLM plugin not installed (%s: %s)", type(e).__name__, e)


def install() -> None:
    """Instrument everything vLLM compiles in this process (idempotent)."""
    from fxflops.integrations.vllm import hooks

    if "hooks" in _installed:
        return
    _installed.add("hooks")
    # vLLM may end a worker without running atexit: flush at its shutdown, and every few
    # seconds meanwhile (on the recorder's background thread, never in the hot path)
    os.environ.setdefault("FXFLOPS_FLUSH_S", "5")
    hooks.install_flush_at_shutdown()
    hooks.install_forward_timing()
    hooks.install_attention_coster()
    hooks.install_mode2_backend()
    hooks.install_piecewise_compiler()


def _install_backend_name_shim() -> None:
    """Accept ``backend="fxflops"`` with mode 3: vLLM validates mode-3 backend names
    ("", "eager", "inductor") in ``CompilationConfig.__post_init__``; we rewrite the name to
    "inductor" and switch the piecewise instrumentation on (inherited by the workers)."""
    if "shim" in _installed:
        return
    from vllm.config import compilation

    from fxflops.patching import patch_method

    def wrap_post_init(original: Any) -> Any:
        def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if self.backend == "fxflops" and \
                    self.mode == compilation.CompilationMode.VLLM_COMPILE:
                os.environ["FXFLOPS"] = "1"
                self.backend = "inductor"
                log.info("fxflops: mode 3 with backend 'fxflops' runs vLLM's Inductor "
                         "backend, instrumented (FXFLOPS=1)")
                install()
            original(self, *args, **kwargs)

        return __post_init__

    def wrap_init_backend(original: Any) -> Any:
        def init_backend(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
            # the native mode-2 path: the worker is about to compile with backend="fxflops"
            if self.backend == "fxflops":
                install()
                from fxflops.integrations.vllm.hooks import note_vllm_config

                note_vllm_config(vllm_config)
            return original(self, vllm_config, *args, **kwargs)

        return init_backend

    cls = compilation.CompilationConfig
    patch_method(cls, "__post_init__", "name-shim", wrap_post_init)
    patch_method(cls, "init_backend", "name-shim", wrap_init_backend)
    _installed.add("shim")
