"""The vLLM general plugin (entry point group ``vllm.general_plugins``).

vLLM loads it in every process, workers included, before compiling. Switched off (no
``FXFLOPS=1``, no backend named ``fxflops``) it changes nothing vLLM computes, hashes or
hands its workers: it only watches the compilation configs vLLM makes, for the backend
name. fxflops is switched on, in this process and every process it starts, by either:

- ``FXFLOPS=1``: everything vLLM compiles is instrumented, any mode, any backend; or
- ``backend="fxflops"`` in the compilation config (``-cc '{"backend": "fxflops"}'``,
  ``LLM(compilation_config={...})``), noticed as the config is made, before vLLM starts its
  engine and workers (``_notice_backend``). In modes 1 and 2 the name stays: torch's
  backend registry resolves it in the worker (the native path). Otherwise (mode 3, the
  piecewise compile; a mode vLLM has still to choose; mode 0, which compiles nothing) it
  becomes ``"inductor"``, vLLM's own backend, instrumented: vLLM accepts no other name in
  mode 3, and the compile-cache key is then the plain Inductor launch's.

Either way the same hooks attach (``switch_on``) before vLLM builds a model or a drafter,
and vLLM's op formulas (``fxflops.integrations.vllm.formulas``) are registered first: no
graph of a vLLM process is analysed, nor any artifact loaded from vLLM's cache, before.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from fxflops import config, placement

log = logging.getLogger(__name__)
_installed: set[str] = set()

BACKEND_NAME = "fxflops"


def enabled() -> bool:
    return config.ENABLED.get()


def register() -> None:
    """Entry point: vLLM calls this in every process."""
    try:
        _install_backend_name_watch()
        if enabled():
            switch_on()
    except Exception as e:  # the plugin must never stop vLLM from starting
        log.warning("fxflops: vLLM plugin not installed (%s: %s)", type(e).__name__, e)


def switch_on() -> None:
    """Instrument this process, and every process it starts from now on (idempotent):
    vLLM's op formulas registered, ``FXFLOPS=1`` for them, this run's id, fxflops' settings
    for Ray's workers, the metrics' collection, then every hook (``install``)."""
    register_formulas()
    if os.environ.get(config.ENABLED.name) != "1":
        previous = os.environ.get(config.ENABLED.name)
        _UNDO.append(lambda: os.environ.pop(config.ENABLED.name, None) if previous is None
                     else os.environ.__setitem__(config.ENABLED.name, previous))
        os.environ[config.ENABLED.name] = "1"  # vLLM's engine and workers inherit it
    placement.run_id()  # set before vLLM starts its engine and workers: they inherit it
    _collect_worker_metrics()
    install()


def install() -> None:
    """Instrument everything vLLM compiles in this process (idempotent): vLLM's op formulas
    registered first, then the compile backend on its own, then each runner-level feature
    where the installed vLLM has what it hooks (``features``: one that is not is off
    alone, named in the log and the report)."""
    register_formulas()
    from fxflops.integrations.vllm import features

    if "hooks" in _installed:
        return
    _installed.add("hooks")
    # vLLM may end a worker without running atexit: flush at its shutdown, and every few
    # seconds meanwhile (on the recorder's background thread, never in the hot path)
    os.environ.setdefault(config.FLUSH_S.name, "5")
    # the compile backend first; then the rest, among them the DP size (before the engine
    # exists: its DP engines forget their size as they start), the layer census, fxflops'
    # settings for Ray's workers, and vLLM's warm-up runs (memory profiling, warm-up
    # compiles and steps, CUDA-graph capture), attached to the worker's classes once a
    # worker is made
    features.install()
    if config.KERNELS.get() is not None:
        _allow_profiling_syncs()
        # vLLM's own Inductor compiles (mode 3): kernel maps and per-kernel profiler events
        from fxflops import torch_compat
        from fxflops.instrument.provenance import inductor_patches

        inductor_config = torch_compat.get("inductor_config")

        for key, value in inductor_patches().items():
            section, name = key.split(".")
            setattr(getattr(inductor_config, section), name, value)


def _allow_profiling_syncs() -> None:
    """``FXFLOPS_KERNELS``' profiled calls wait for the device (N per size): under vLLM's
    ``VLLM_GPU_SYNC_CHECK=error`` a sync raises unless allowed, so they are made in vLLM's
    own allow region (``gpu_sync_allowed``; a vLLM without it polices nothing)."""
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except Exception:
        return
    from fxflops.recording import kernel_profile

    kernel_profile.sync_allowed = gpu_sync_allowed


def register_formulas() -> None:
    """vLLM's op formulas in fxflops' registry (``fxflops.integrations.vllm.formulas``;
    idempotent: a module registers once), before any graph of this process is analysed or
    any artifact loaded: every path by which vLLM's graphs reach fxflops starts after
    ``switch_on`` (``FXFLOPS=1`` at ``register``, or the backend name noticed as vLLM makes
    its config, before it builds a model), and imports nothing of vLLM. A module that fails
    to load leaves the graphs uninstrumented, said once; vLLM runs as it would."""
    from fxflops.integrations import load_formulas

    load_formulas()


def uninstall() -> None:
    """Undo everything ``register``, ``switch_on`` and ``install`` changed: vLLM's classes,
    fxflops' prefix in vLLM's Ray prefixes, ``FXFLOPS`` where ``switch_on`` set it."""
    from fxflops.integrations.vllm import features, hooks, layers

    hooks.uninstall()
    layers.forget_models()
    features.forget()
    for undo in reversed(_UNDO):
        undo()
    _UNDO.clear()
    _installed.clear()


# what ``switch_on`` changed outside vLLM's classes, each undone by ``uninstall``
_UNDO: list[Any] = []


def _collect_worker_metrics() -> None:
    """``FXFLOPS_PROMETHEUS=1``: the counters the engine and worker processes write
    (``fxflops.outputs.prometheus``) appear in this process's ``/metrics`` (and with
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


def _notice_backend(cc: Any) -> None:
    """A compilation config naming fxflops' backend switches fxflops on; outside modes 1
    and 2 (where torch's registry resolves the name in the worker) the name becomes
    ``"inductor"``, instrumented (see the module's docstring)."""
    if getattr(cc, "backend", None) != BACKEND_NAME:
        return
    from vllm.config import compilation

    native = (compilation.CompilationMode.STOCK_TORCH_COMPILE,
              compilation.CompilationMode.DYNAMO_TRACE_ONCE)
    if cc.mode not in native:
        cc.backend = "inductor"
        log.info("fxflops: backend 'fxflops' in compilation mode %s runs vLLM's Inductor "
                 "backend, instrumented", cc.mode)
    switch_on()


def _install_backend_name_watch() -> None:
    """Watch every compilation config vLLM makes for fxflops' backend name: where it is
    made (``CompilationConfig.__post_init__``: ``-cc``, parsed once the plugins are
    loaded; its validation refuses the name in mode 3, so it is read first), and where
    the engine's config is made of it (``VllmConfig.__post_init__``: a
    ``LLM(compilation_config=...)`` is made before vLLM loads its plugins). A passthrough
    that reads one attribute: it changes nothing where the name is not fxflops'."""
    if "watch" in _installed:
        return
    from vllm.config import compilation, vllm

    from fxflops.integrations.vllm import hooks

    hooks._patch(compilation.CompilationConfig, "__post_init__", "backend-name",
                 lambda original: hooks.passthrough(
                     original, before=lambda named: _notice_backend(named["self"]),
                     what="backend name"))
    hooks._patch(vllm.VllmConfig, "__post_init__", "backend-name",
                 lambda original: hooks.passthrough(
                     original, before=lambda named: _notice_backend(
                         named["self"].compilation_config), what="backend name"))
    _installed.add("watch")
