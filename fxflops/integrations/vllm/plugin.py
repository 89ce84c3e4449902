"""The vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process, workers included, before compiling. Unless asked, it does
nothing but let ``-cc '{"mode": 3, "backend": "fxflops"}'`` through vLLM's validation:

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

from fxflops import config, placement

log = logging.getLogger(__name__)
_installed: set[str] = set()


def enabled() -> bool:
    return config.ENABLED.get()


def register() -> None:
    """Entry point: vLLM calls this in every process."""
    try:
        placement.run_id()  # set before vLLM starts its engine and workers: they inherit it
        _settings_reach_ray_workers()
        _collect_worker_metrics()
        _install_dp_size_note()
        _install_backend_name_shim()
        _install_census()
        if enabled():
            install()
    except Exception as e:  # the plugin must never stop vLLM from starting
        log.warning("fxflops: vLLM plugin not installed (%s: %s)", type(e).__name__, e)


def install() -> None:
    """Instrument everything vLLM compiles in this process (idempotent)."""
    from fxflops.integrations.vllm import drafter, engine_stats, forward, hooks

    if "hooks" in _installed:
        return
    _installed.add("hooks")
    # vLLM may end a worker without running atexit: flush at its shutdown, and every few
    # seconds meanwhile (on the recorder's background thread, never in the hot path)
    os.environ.setdefault(config.FLUSH_S.name, "5")
    hooks.install_flush_at_shutdown()
    forward.install_forward_timing()
    forward.install_attention_coster()
    engine_stats.install_engine_stats()
    drafter.install_drafter_hooks()
    hooks.install_mode2_backend()
    hooks.install_piecewise_compiler()
    if config.KERNELS.get() is not None:
        # vLLM's own Inductor compiles (mode 3): kernel maps and per-kernel profiler events
        from fxflops import torch_compat
        from fxflops.instrument.provenance import inductor_patches

        inductor_config = torch_compat.get("inductor_config")

        for key, value in inductor_patches().items():
            section, name = key.split(".")
            setattr(getattr(inductor_config, section), name, value)


def uninstall() -> None:
    """Undo everything ``register`` and ``install`` changed in vLLM's classes."""
    from fxflops.integrations.vllm import hooks, layers

    hooks.uninstall()
    layers.forget_models()
    _installed.clear()


def _collect_worker_metrics() -> None:
    """``FXFLOPS_PROMETHEUS=1``: the counters the engine and worker processes write
    (``fxflops.metrics``) appear in this process's ``/metrics`` (and with
    ``FXFLOPS_PROMETHEUS_PORT``, on that port, from every node).

    With ``PROMETHEUS_MULTIPROC_DIR`` set (vLLM sets it for several API servers) vLLM's own
    multi-process registry collects the files written there: nothing to do. Without it,
    vLLM serves prometheus_client's global registry from this process (the first vLLM
    process, loading its plugins while it parses the command line, before it starts the
    engine): a folder for the workers' files is made here, handed down to them in
    ``FXFLOPS_PROMETHEUS_DIR``, and collected into that registry.
    """
    if "metrics" in _installed or not config.PROMETHEUS.get():
        return
    _installed.add("metrics")
    if config.PROMETHEUS_PORT.get() is not None:
        # this node's exporter (a node without the API server: ``--headless``; under
        # Ray, each worker node): its workers write to the node's folder for the port, and
        # the first vLLM process of the node, this one, serves it
        from fxflops.outputs import prometheus as metrics

        metrics.serve_node()
        return  # the counters are on that port, not in vLLM's /metrics
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    directory = config.PROMETHEUS_DIR.get()
    if directory is None:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="fxflops-prometheus-")
        os.environ[config.PROMETHEUS_DIR.name] = directory
        atexit.register(shutil.rmtree, directory, True)  # only the process that made it
    from prometheus_client import REGISTRY
    from prometheus_client.multiprocess import MultiProcessCollector

    MultiProcessCollector(REGISTRY, path=directory)


def _settings_reach_ray_workers() -> None:
    """Under Ray, vLLM copies to its workers only the environment variables whose prefixes
    it lists (``vllm.ray.ray_env``): add fxflops' (``FXFLOPS``, ``FXFLOPS_*``) to
    ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY``, the engine's own mechanism, before it
    starts them."""
    name = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
    prefixes = [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]
    if "FXFLOPS" not in prefixes:
        os.environ[name] = ",".join([*prefixes, "FXFLOPS"])


def _install_dp_size_note() -> None:
    """Before the engine exists (its DP engines forget their size as they start)."""
    if "dp-size" in _installed:
        return
    from fxflops.integrations.vllm import hooks

    hooks.install_dp_size_note()
    _installed.add("dp-size")


def _install_census() -> None:
    """Note each model vLLM compiles, for the layer safety net (``layers``): installed
    before it is known whether fxflops will instrument (the native mode-2 path decides
    while the model is being compiled); it keeps a weak reference per model, nothing more."""
    if "census" in _installed:
        return
    from fxflops.integrations.vllm.layers import install_census

    install_census()
    _installed.add("census")


def _install_backend_name_shim() -> None:
    """Accept ``backend="fxflops"`` with mode 3: vLLM validates mode-3 backend names
    ("", "eager", "inductor") in ``CompilationConfig.__post_init__``; we rewrite the name to
    "inductor" and switch the piecewise instrumentation on (inherited by the workers)."""
    if "shim" in _installed:
        return
    from vllm.config import compilation

    from fxflops.integrations.vllm import hooks

    def mode3_name(named: dict[str, Any]) -> None:
        cc = named["self"]
        if cc.backend == "fxflops" and cc.mode == compilation.CompilationMode.VLLM_COMPILE:
            os.environ[config.ENABLED.name] = "1"
            cc.backend = "inductor"
            log.info("fxflops: mode 3 with backend 'fxflops' runs vLLM's Inductor "
                     "backend, instrumented (FXFLOPS=1)")
            install()

    def native_mode2(named: dict[str, Any]) -> None:
        # the native mode-2 path: the worker is about to compile with backend="fxflops"
        if named["self"].backend == "fxflops":
            install()
            hooks.note_vllm_config(named["vllm_config"])

    cls = compilation.CompilationConfig
    hooks._patch(cls, "__post_init__", "name-shim", lambda original: hooks.passthrough(
        original, before=mode3_name, what="mode-3 backend name"))
    hooks._patch(cls, "init_backend", "name-shim", lambda original: hooks.passthrough(
        original, before=native_mode2, what="mode-2 backend"))
    _installed.add("shim")
