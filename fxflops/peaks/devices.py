"""Device peaks: dense (non-sparse) TFLOP/s per dtype and memory GB/s.

Figures are the vendors' datasheet numbers for dense math (the sparse figures are twice
these). A CPU has no table entry: its FLOP/s peak is derived from its ISA, cores and clock
(``cpu_peak``) and its memory bandwidth measured once per host (``cpu_bandwidth``), source
``derived: ...``; or both are measured (``fxflops peak --measure``, source ``measured``),
which then replaces them. ``FXFLOPS_PEAK_TFLOPS`` / ``FXFLOPS_PEAK_GBPS`` override either.
``peak()`` (``fxflops.peak``) is the public way to the figures a report uses; a report
keeps them (its ``peak``), and whatever reads the report reads them from there
(``run_peak``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fxflops import config
from fxflops.peaks import cache as peak_cache
from fxflops.peaks.cpu import host_peak
from fxflops.peaks.cpu_bandwidth import host_bandwidth
from fxflops.recording.recorder import current
from fxflops.report.schema import PeakFigures


@dataclasses.dataclass(frozen=True)
class Peak:
    name: str
    tflops: dict[str, float]  # dtype -> dense TFLOP/s
    gbps: float

    def tflops_for(self, dtype: str) -> float | None:
        # int8 tensor cores run at the fp8 rate on Hopper (dense TOPS); else bf16's
        return (self.tflops.get(dtype) or (self.tflops.get("fp8") if dtype == "int8" else None)
                or self.tflops.get("bf16"))


# name fragments are matched, longest first, against torch.cuda.get_device_name()
DEVICES: dict[str, Peak] = {
    # NVIDIA H100 datasheet (SXM5: 989 TF bf16/fp16 dense, 1979 fp8, 67 fp32 (non-tensor),
    # 494 tf32; 3.35 TB/s HBM3). PCIe: 756 bf16, 1513 fp8, 51 fp32, 378 tf32; 2.0 TB/s.
    "H100 SXM": Peak("H100 SXM", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7,
                                  "fp32": 66.9}, 3350.0),
    "H100 80GB HBM3": Peak("H100 SXM", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
                                        "tf32": 494.7, "fp32": 66.9}, 3350.0),
    "H100 PCIe": Peak("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0,
                                    "fp32": 51.2}, 2000.0),
    # NVIDIA H200 datasheet: same SXM compute as H100 SXM, 4.8 TB/s HBM3e.
    "H200": Peak("H200", {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7,
                          "fp32": 66.9}, 4800.0),
    # NVIDIA A100 datasheet: 312 TF bf16/fp16 dense, 624 TOPS int8, 156 tf32, 19.5 fp32;
    # 40GB: 1555 GB/s, 80GB SXM: 2039 GB/s.
    "A100-SXM4-40GB": Peak("A100 40GB", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0,
                                         "fp32": 19.5}, 1555.0),
    "A100-PCIE-40GB": Peak("A100 40GB", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0,
                                         "fp32": 19.5}, 1555.0),
    "A100 80GB": Peak("A100 80GB", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0,
                                    "fp32": 19.5}, 2039.0),
    "A100-SXM4-80GB": Peak("A100 80GB", {"bf16": 312.0, "fp16": 312.0, "int8": 624.0, "tf32": 156.0,
                                         "fp32": 19.5}, 2039.0),
    # NVIDIA L4 datasheet: 121 TF bf16/fp16 dense (242 sparse), 242.5 fp8, 30.3 fp32; 300 GB/s.
    "L4": Peak("L4", {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "tf32": 60.0,
                      "fp32": 30.3}, 300.0),
    # NVIDIA L40S datasheet: 362 TF bf16/fp16 dense, 733 fp8, 91.6 fp32; 864 GB/s.
    "L40S": Peak("L40S", {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "tf32": 183.0,
                          "fp32": 91.6}, 864.0),
    # NVIDIA B200 (DGX B200 per GPU): 2.25 PF bf16 dense, 4.5 PF fp8, 8 TB/s HBM3e.
    "B200": Peak("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "tf32": 1100.0,
                          "fp32": 75.0}, 8000.0),
    # AMD Instinct MI300X datasheet: 1307.4 TF bf16/fp16 dense, 2614.9 fp8, 163.4 fp32
    # (matrix); 5.3 TB/s HBM3.
    "MI300X": Peak("MI300X", {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7,
                              "fp32": 163.4}, 5300.0),
}

DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
               "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8",
               "torch.float8_e4m3fnuz": "fp8", "torch.float8_e5m2fnuz": "fp8",
               "torch.int8": "int8"}


def match_device(name: str) -> Peak | None:
    for key in sorted(DEVICES, key=len, reverse=True):
        if key.lower() in name.lower():
            return DEVICES[key]
    return None


def save_measured(device_name: str, tflops: dict[str, float], gbps: float) -> str:
    """Keep a measured peak (matmul TFLOP/s per dtype, copy GB/s) for this device, in this
    host's peak cache (``peak_cache``), as the device's whole entry."""
    import time

    return peak_cache.update_device(
        device_name, {"tflops": tflops, "gbps": gbps, "measured_at": time.time()}, replace=True)


def load_measured(device_name: str) -> dict[str, Any] | None:
    """The peak measured for this device on this host (``fxflops peak --measure``)."""
    entry = peak_cache.device_entry(device_name)
    if entry is None or not isinstance(entry.get("tflops"), dict):
        return None
    return entry


def process_peak(info: dict[str, Any]) -> PeakFigures:
    """The peak of the device and dtype a process noted (``Recorder.info``)."""
    return current_peak(info.get("device"), info.get("dtype", "bf16"))


def current_peak(device_name: str | None = None, dtype: str = "bf16") -> PeakFigures:
    """``{"tflops", "gbps", "source"}`` for this device and dtype: the table's (a known
    device), else what ``fxflops peak --measure`` measured here (source ``measured``),
    else, for a CPU, its derived FLOP/s and its measured memory bandwidth (source
    ``derived: <how>; <how>``); the environment overrides each figure it gives (source
    ``env``, or ``env+<source>`` / ``<source>+env`` where it gives one of the two)."""
    env_t, env_g = config.PEAK_TFLOPS.get(), config.PEAK_GBPS.get()
    tflops = gbps = None
    source = "none"
    peak = match_device(device_name) if device_name else None
    if peak is not None:
        tflops, gbps, source = peak.tflops_for(dtype), peak.gbps, f"table:{peak.name}:{dtype}"
    elif device_name:
        measured = load_measured(device_name)
        if measured is not None and measured["tflops"].get(dtype):
            tflops, gbps, source = measured["tflops"][dtype], measured.get("gbps"), "measured"
        elif device_name.startswith("cpu"):  # this host's, from its ISA, cores and clock
            tflops, source = host_peak(dtype)
            # (measured only where the environment does not give it: a quarter second)
            bandwidth = host_bandwidth(device_name) if env_g is None else None
            if bandwidth is not None:
                gbps = bandwidth.gbps
                source = f"{source}; {bandwidth.how}" if tflops is not None \
                    else f"derived: {bandwidth.how}"
    if env_t and env_g:
        return {"tflops": env_t, "gbps": env_g, "source": "env"}
    if env_t:
        tflops, source = env_t, "env" if source == "none" or gbps is None else f"env+{source}"
    if env_g:
        gbps, source = env_g, "env" if source == "none" or tflops is None else f"{source}+env"
    return {"tflops": tflops, "gbps": gbps, "source": source}


def device_name(device: Any = "cpu") -> str:
    """A device's name as reports give it (what its peak is looked up by):
    ``torch.cuda.get_device_name()`` for a CUDA device (``"cuda"``, ``"cuda:1"``, a
    ``torch.device``), ``cpu:<processor>`` for the CPU."""
    import torch

    where = torch.device(device)
    if where.type == "cuda":
        return torch.cuda.get_device_name(where.index)
    import platform

    return f"cpu:{platform.processor() or platform.machine()}"


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """A device's peak as the report uses it (its ``peak``: MFU, HFU, rooflines)."""

    device: str  # its name (``device_name``)
    dtype: str  # what the FLOP/s are for: bf16, fp16, fp32, tf32, fp8, int8
    flops_per_s: float | None  # dense FLOP/s (None: unknown)
    bytes_per_s: float | None  # memory bandwidth, bytes/s (None: unknown)
    source: str  # table:<device>:<dtype>, measured, derived: ..., env, or none

    @property
    def tflops(self) -> float | None:
        return self.flops_per_s / 1e12 if self.flops_per_s is not None else None

    @property
    def gbps(self) -> float | None:
        return self.bytes_per_s / 1e9 if self.bytes_per_s is not None else None


def peak(device: Any = None, dtype: Any = None) -> DevicePeak:
    """The peak FLOP/s and bytes/s of ``device`` for ``dtype``, as the report uses them
    (``fxflops.peak``). ``device``: ``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``
    or a device's name; None: the device this process's graphs ran on (the report's own
    peak), else the current CUDA device, else the CPU. ``dtype``: ``"bf16"``, ``"fp16"``,
    ``"fp32"``, ``"tf32"``, ``"fp8"``, ``"int8"`` or a ``torch.dtype``; None: the dtype of
    the process's matmuls where ``device`` is theirs, else bf16. The table's figure for a
    known device, what ``fxflops peak --measure`` measured here, or a CPU's derived one;
    ``FXFLOPS_PEAK_TFLOPS`` / ``FXFLOPS_PEAK_GBPS`` override them."""
    rec = current()
    info = rec.info if rec is not None else {}
    if device is None and info.get("device"):
        name = info["device"]
    elif device is None:
        import torch

        name = device_name("cuda" if torch.cuda.is_available() else "cpu")
    else:
        import torch

        try:
            torch.device(device)
        except (RuntimeError, ValueError, TypeError):  # not a device: a device's name
            name = str(device)
        else:
            name = device_name(device)
    if dtype is None:
        dtype = info.get("dtype", "bf16") if name == info.get("device") else "bf16"
    dtype = DTYPE_NAMES.get(str(dtype), str(dtype))
    figures = current_peak(name, dtype)
    tflops, gbps = figures["tflops"], figures["gbps"]
    return DevicePeak(name, dtype, tflops * 1e12 if tflops else None,
                      gbps * 1e9 if gbps else None, figures["source"])
