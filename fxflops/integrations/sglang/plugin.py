"""The SGLang general plugin (entry point group ``sglang.srt.plugins``).

SGLang (0.5.23) loads its general plugins in every process it starts (engine, scheduler,
detokenizer, data-parallel controller: ``sglang.srt.plugins.load_plugins``), calls each
one's entry point, then applies the hooks they registered in its ``HookRegistry``
(before, after, around or in place of a function, by dotted name). ``SGLANG_PLUGINS``
restricts which plugins load; fxflops' is named ``fxflops``.

Switched off (no ``FXFLOPS=1``) ``register`` registers nothing: SGLang runs as without
fxflops installed. Switched on, it registers:

- around each of SGLang's two ``patch_model`` (the decode CUDA-graph runner's, the CPU
  graph runner's): the compile of each batch size under fxflops' backend, Inductor inside,
  SGLang's ``mode=`` and Inductor settings kept (``fxflops.integrations.sglang.compiles``);
- after SGLang's own estimate of a step (``--enable-mfu-metrics``): the estimate, kept
  beside the measured rows (``fxflops.integrations.sglang.estimate``);
- after ``ModelRunner.load_model``: a server without ``--enable-torch-compile`` compiles
  nothing, and fxflops counts nothing there: said once, not left to a report with no rows
  (docs/sglang.md says why it is not covered).

A failure inside fxflops is logged once and SGLang's own compile goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from fxflops import config

log = logging.getLogger(__name__)

# the hooks ``register`` adds to SGLang's registry while on: (target, hook type, hook)
ESTIMATES = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
_UNDO: list[Any] = []


def enabled() -> bool:
    return config.ENABLED.get()


def register() -> None:
    """Entry point: SGLang calls this in every process, then applies the hooks."""
    if not enabled():
        return
    try:
        switch_on()
    except Exception as e:  # the plugin must never stop SGLang from starting
        log.warning("fxflops: SGLang plugin not installed (%s: %s)", type(e).__name__, e)


def hooks() -> list[tuple[str, str, Any]]:
    """What the plugin hooks in SGLang: (dotted target, ``HookType`` name, hook)."""
    from fxflops.integrations.sglang import compiles, estimate

    out: list[tuple[str, str, Any]] = [(target, "AROUND", compiles.wrap_patch_model(runner))
                                       for target, runner in compiles.SITES.items()]
    out.append((f"{ESTIMATES}._estimate_decode_perf", "AFTER",
                _never_in_the_way(estimate.after_decode_estimate)))
    out.append((f"{ESTIMATES}._estimate_prefill_perf", "AFTER",
                _never_in_the_way(estimate.after_prefill_estimate)))
    out.append((f"{MODEL_RUNNER}.load_model", "AFTER", _never_in_the_way(said_if_uncompiled)))
    return out


def said_if_uncompiled(_result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """(After a model runner loads its model.) Without ``--enable-torch-compile`` SGLang
    compiles nothing, so fxflops has nothing to count: said once."""
    from fxflops.util import warn_once

    if not getattr(runner.server_args, "enable_torch_compile", False):
        warn_once("sglang-uncompiled", "fxflops: SGLang compiles nothing without "
                  "--enable-torch-compile, and fxflops counts only what it compiles: this "
                  "server's forwards are not counted (docs/sglang.md, \"Without "
                  "--enable-torch-compile\")")


def switch_on() -> None:
    """Register the hooks in SGLang's ``HookRegistry`` (applied by SGLang's
    ``load_plugins`` right after, or by ``apply``) and the ``torch.compile`` gate the
    compile sites open (idempotent)."""
    if _UNDO:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from fxflops.integrations.sglang import compiles

    _UNDO.append(compiles.install_compile_gate())
    for target, kind, hook in hooks():
        HookRegistry.register(target, hook, HookType[kind])


def apply() -> None:
    """Apply the registered hooks now: where SGLang's ``load_plugins`` has already run in
    this process (a script that switches fxflops on itself)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()


def uninstall() -> None:
    """Undo the ``torch.compile`` gate (SGLang's registry has no undo: tests restore the
    functions it patched themselves)."""
    while _UNDO:
        _UNDO.pop().undo()


def _never_in_the_way(hook: Any) -> Any:
    """An AFTER hook that returns None (SGLang keeps its own result) and never raises into
    SGLang: a failure is warned once."""
    import functools

    from fxflops.util import warn_once

    @functools.wraps(hook)
    def after(result: Any, *args: Any, **kwargs: Any) -> None:
        try:
            hook(result, *args, **kwargs)
        except Exception as e:
            warn_once(f"sglang-hook:{hook.__name__}", "fxflops: SGLang's %s not read "
                      "(%s: %s)", hook.__name__, type(e).__name__, e)

    return after
