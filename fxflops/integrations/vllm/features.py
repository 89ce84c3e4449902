"""fxflops' features in a vLLM process, installed one by one: the compile backend first and
on its own, then every runner-level feature, each only where its symbols resolve.

The compile backend (``symbols.COMPILE``: modes 2 and 3, vLLM's compilation interface) is
all fxflops needs to record every graph vLLM compiles, per size; everything else (the whole
forward, warm-up phases, drafters, acceptance, ...) hooks vLLM's runners, whose private
names move from release to release. So a feature is installed only where every symbol it
uses resolves in the installed vLLM (``symbols.missing``), and a feature whose installer
still fails is off alone: either way it is named once in the log and listed in the
report (``process.features_off``: feature -> "vllm VERSION: why"), which ``fxflops
report`` prints. Where the compile backend itself cannot be found, fxflops says so as an
error naming the version and what it looked for: it never records nothing in silence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fxflops.integrations.vllm.symbols import COMPILE, FEATURES, missing
from fxflops.recording.recorder import recorder

log = logging.getLogger(__name__)

# feature -> why it is off in this process ("vllm VERSION: why"); the features installed
OFF: dict[str, str] = {}
INSTALLED: set[str] = set()


def _installers() -> dict[str, Callable[[], None]]:
    """Feature -> its installer, in the order they are installed (the compile backend
    first). A feature without an installer of its own is read where it is used (vLLM's
    estimate, the ranks, the drafter's tag, the dump folder, the KV-cache dtype): its
    symbols are checked, and it is listed off where they do not resolve."""
    from fxflops.integrations.vllm import drafter, engine_stats, forward, hooks, layers, uncompiled

    def compile_backend() -> None:
        hooks.install_mode2_backend()
        hooks.install_piecewise_compiler()

    return {
        COMPILE: compile_backend,
        "warm start (AOT artifact)": hooks.install_warm_start,
        "layer census": layers.install_census,
        "DP size": hooks.install_dp_size_note,
        "Ray workers' settings": hooks.settings_reach_ray_workers,
        "flush at worker shutdown": hooks.install_flush_at_shutdown,
        "attention from KV lengths": forward.install_attention_coster,
        "whole forward (V1 runner)": forward.install_forward_timing_v1,
        "whole forward (V2 runner)": forward.install_forward_timing_v2,
        "uncompiled forwards counted": uncompiled.install_counting_uncompiled,
        "draft acceptance (V1 runner)": engine_stats.install_v1,
        "draft acceptance (V2 runner)": engine_stats.install_v2,
        "drafter passes (V1 proposers)": drafter.install_v1,
        "drafter passes (V2 speculators)": drafter.install_v2,
        "warm-up phases": hooks.install_warmup_phases_per_worker,
    }


def vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "?"


def install(*names: str) -> None:
    """Install the features ``names`` (all, in order, where none is given), each where its
    symbols resolve; note the ones that are off (idempotent: every installer patches once,
    by its tags, and an off feature is not tried again)."""
    installers = _installers()
    version = vllm_version()
    for feature in names or tuple(installers) + tuple(f for f in FEATURES
                                                       if f not in installers):
        if feature in OFF:
            continue
        why = missing(feature)
        if why is None and feature in installers:
            try:
                installers[feature]()
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
        if why is None:
            INSTALLED.add(feature)
            continue
        OFF[feature] = f"vllm {version}: {why}"
        _say_off(feature, version, why)
    _note_in_report()


def _say_off(feature: str, version: str, why: str) -> None:
    if feature == COMPILE:
        log.error("fxflops: vllm %s: vLLM's compilation interface was not found (%s): "
                  "fxflops cannot record the graphs vLLM compiles in this process",
                  version, why)
        return
    release = ".".join(version.split(".")[:2])
    expected = FEATURES[feature].absent.get(release)
    if expected:  # by design in this release: nothing is lost that it has
        log.info("fxflops: %s off (vllm %s: %s; %s)", feature, version, why, expected)
    else:
        log.warning("fxflops: %s off (vllm %s: %s); every other feature is on",
                    feature, version, why)


def _note_in_report() -> None:
    if OFF:
        recorder().info["features_off"] = dict(OFF)


def forget() -> None:
    """Forget what was installed and what is off (``plugin.uninstall``)."""
    OFF.clear()
    INSTALLED.clear()
