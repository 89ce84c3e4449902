"""The peak a run's reports are read against, and how a reader names it.

A report keeps the peak its process found when it was written (``peaks.current_peak``:
the environment, a GPU's table entry, a measured or a CPU's derived peak), and every reader
of the report uses that one: ``fxflops report``'s peak line with its MFU and bound columns,
``fxflops plot``'s roofs. ``run_peak`` is that peak for a run's reports; ``source_label``
the short name of where it came from, for a title (``derived``, ``env``, ``measured``, the
GPU's name in the table); ``no_roofline`` why a roofline cannot be drawn, and how to give
it one. Reading a report's peak needs no torch: a reader starts in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fxflops.report.schema import PeakFigures

# what the variables are read by: the recording process (a report keeps its peak)
SET_PEAK = "set {} for the run (a report keeps the peak it was recorded with), or run " \
           "`fxflops peak --measure` on its host"


def run_peak(reports: Sequence[Mapping[str, Any]]) -> PeakFigures:
    """The peak a run's reports are read against: the first report's (a run's processes
    run on one kind of device); none where it kept none (a report written before peaks)."""
    kept = reports[0].get("peak") if reports else None
    if not isinstance(kept, Mapping):
        return {"tflops": None, "gbps": None, "source": "none"}
    return {"tflops": kept.get("tflops") or None, "gbps": kept.get("gbps") or None,
            "source": str(kept.get("source") or "none")}


def run_device(reports: Sequence[Mapping[str, Any]]) -> str | None:
    """The device the run's first process ran its graphs on, as its report names it."""
    process = reports[0].get("process") if reports else None
    device = process.get("device") if isinstance(process, Mapping) else None
    return str(device) if device else None


def source_label(source: str | None) -> str:
    """A peak's source in a word, for a title: ``derived``, ``measured``, ``env``, ``none``,
    the table's device name (``H100 SXM``), and where the environment gives one of the two
    figures, ``env+derived`` or ``H100 SXM+env``."""
    if not source:
        return "none"
    if source.startswith("env+"):
        return "env+" + source_label(source[len("env+"):])
    if source.endswith("+env"):  # (a derived source's ISA may hold a "+": avx2+fma)
        return source_label(source[: -len("+env")]) + "+env"
    if source.startswith("table:"):
        return source.split(":")[1]
    return source.partition(":")[0].strip() or "none"


def no_roofline(peak: Mapping[str, Any], device: str | None = None) -> str | None:
    """Why ``peak`` draws no roofline (it needs both roofs), and how to give it one; None
    where it draws one."""
    tflops, gbps = peak.get("tflops"), peak.get("gbps")
    if tflops and gbps:
        return None
    if not tflops and not gbps:
        where = f" for {device}" if device else ""
        return (f"no peak known{where} (no table entry, nothing measured): "
                + SET_PEAK.format("FXFLOPS_PEAK_TFLOPS and FXFLOPS_PEAK_GBPS"))
    if not gbps:
        return "no memory-bandwidth peak known: " + SET_PEAK.format("FXFLOPS_PEAK_GBPS")
    return "no FLOP/s peak known: " + SET_PEAK.format("FXFLOPS_PEAK_TFLOPS")
