"""A CPU's memory-bandwidth peak: the other roof of its roofline, measured once per host.

A CPU's FLOP/s peak is derived from what it says of itself (``cpu_peak``); nothing it says
gives its memory bandwidth (channels and transfer rates are the DIMMs', and this process's
share of them depends on the cores it runs on), so that roof is measured, STREAM style:

- **copy** ``a = b`` (8 bytes per fp32 element: one read, one write) and **triad**
  ``a = b + s * c`` (12 bytes), on torch's threads (those the graphs run on), over arrays
  of ``ARRAY_BYTES`` (32 MiB) each: past the cache a few cores get on most servers (a
  host whose cache holds 96 MiB for this process measures its cache instead);
- each kernel run once untimed (the pages touched, the threads woken), then timed
  ``MIN_REPEATS`` times, and again while ``BUDGET_S`` lasts; the best run of the faster
  kernel is the peak (a roof is what the memory can do, not what it usually does).

About a quarter of a second, once: the figure is kept in this host's peak cache
(``peak_cache``, where ``fxflops peak --measure`` keeps its figures), under the CPU's
device name and the facts it depends on (``facts_key``): the CPU's model, the cores used
and their clock, the same facts its FLOP/s peak is derived from. A run with other facts
(other cores, another torch thread count, another machine under the same host name)
measures again and keeps its own figure beside; every run reads it once per process.
``FXFLOPS_PEAK_GBPS`` and ``fxflops peak --measure``'s copy come first
(``peaks.current_peak``): with either, nothing is measured here.

A host busy with other work when the figure is first measured keeps a low one: ``fxflops
peak --measure`` on a quiet host replaces it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from fxflops.peaks import cache as peak_cache
from fxflops.peaks.cpu import CpuFacts, this_host
from fxflops.util import warn_once

ARRAY_BYTES = 32 << 20  # each of the three fp32 arrays
MIN_REPEATS = 3  # timed runs of each kernel, at least
BUDGET_S = 0.15  # timed runs go on while this lasts (at most MAX_REPEATS)
MAX_REPEATS = 10


@dataclasses.dataclass(frozen=True)
class Bandwidth:
    """A measured memory bandwidth: the best rate, the kernel that reached it, and the
    threads it ran on."""

    gbps: float
    kernel: str  # copy or triad
    threads: int

    @property
    def how(self) -> str:
        """How it was found, as a peak's source says it."""
        return f"{self.gbps:.3g} GB/s measured ({self.kernel}, {self.threads} thread(s))"


def measure(array_bytes: int = ARRAY_BYTES, budget_s: float = BUDGET_S) -> Bandwidth:
    """The best copy or triad rate over arrays of ``array_bytes`` on torch's threads (see
    the module's doc), in GB/s to three significant figures (the run-to-run spread is
    wider than that)."""
    import torch

    n = max(1, array_bytes // 4)
    a = torch.empty(n, dtype=torch.float32)
    b = torch.full((n,), 1.0, dtype=torch.float32)
    c = torch.full((n,), 2.0, dtype=torch.float32)
    kernels: dict[str, tuple[Callable[[], Any], int]] = {
        "copy": (lambda: a.copy_(b), 2 * 4 * n),
        "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3 * 4 * n),
    }
    best = dict.fromkeys(kernels, math.inf)
    for run, _ in kernels.values():
        run()
    deadline = time.perf_counter() + budget_s
    for repeat in range(MAX_REPEATS):
        if repeat >= MIN_REPEATS and time.perf_counter() > deadline:
            break
        for name, (run, _) in kernels.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    rates = {name: moved / max(best[name], 1e-9) / 1e9 for name, (_, moved) in kernels.items()}
    kernel = max(rates, key=lambda name: rates[name])
    return Bandwidth(float(f"{rates[kernel]:.3g}"), kernel, torch.get_num_threads())


def facts_key(facts: CpuFacts | None, threads: int) -> str:
    """What a measured bandwidth depends on, as the cache keys it: the CPU's model, the
    cores this process uses and their clock (the FLOP/s peak's facts), else the threads."""
    if facts is None:
        return f"unknown CPU, {threads} thread(s)"
    clock = f" x {facts.clock_ghz:.2f} GHz" if facts.clock_ghz else ""
    return f"{facts.model_name or 'unnamed CPU'}, {facts.cores} core(s){clock}"


def _kept(entry: dict[str, Any] | None, key: str) -> Bandwidth | None:
    """The bandwidth kept for ``key`` in a device's cache entry; None where there is none,
    or what is there is not one (warned about once: it is measured again)."""
    kept = (entry or {}).get("bandwidth", {})
    if isinstance(kept, dict) and key not in kept:
        return None
    try:
        if not isinstance(kept, dict):
            raise ValueError(f"'bandwidth' is {type(kept).__name__}, not an object")
        figure = kept[key]
        gbps, kernel, threads = figure["gbps"], figure["kernel"], figure["threads"]
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) \
                or not math.isfinite(gbps) or gbps <= 0:
            raise ValueError(f"gbps {gbps!r}")
        return Bandwidth(float(gbps), str(kernel), int(threads))
    except (TypeError, KeyError, ValueError) as e:
        warn_once(f"peak-cache-bandwidth:{key}", "fxflops: the memory bandwidth kept for %s "
                  "is not one (%s); measuring it again", key, e)
        return None


# Whether this process may measure the bandwidth: only a process a person started to read
# or make figures (the ``fxflops`` command: demo, report, plot, peak), never one that is
# recording a model (a server, a training job): a third of a second of full memory traffic
# there would slow what fxflops measures. Those read the figure kept for the host.
_MAY_MEASURE: list[bool] = []


def allow_measuring() -> None:
    """Let this process measure the bandwidth where none is kept (the CLI calls it)."""
    if not _MAY_MEASURE:
        _MAY_MEASURE.append(True)
        host_bandwidth.cache_clear()  # (a figure not measured before is measured now)


@functools.lru_cache(maxsize=8)
def host_bandwidth(device: str) -> Bandwidth | None:
    """This host's memory-bandwidth peak as the CPU ``device`` (``peaks.device_name``): the
    figure kept for its facts, else (where this process may measure: ``allow_measuring``)
    measured now and kept. None where none is kept and none may be measured, or it cannot
    be (warned about once)."""
    import torch

    key = facts_key(this_host(), torch.get_num_threads())
    found = _kept(peak_cache.device_entry(device), key)
    if found is not None or not _MAY_MEASURE:
        return found
    with peak_cache.locked():  # another process measuring now: wait, then read its figure
        entry = peak_cache.device_entry(device)
        found = _kept(entry, key)
        if found is not None:
            return found
        try:
            found = measure()
        except Exception as e:  # a roof the less, never a run the less
            warn_once("cpu-bandwidth", "fxflops: the memory bandwidth could not be measured "
                      "(%s: %s); no memory roof (set FXFLOPS_PEAK_GBPS)", type(e).__name__, e)
            return None
        kept = (entry or {}).get("bandwidth")
        kept = {**(kept if isinstance(kept, dict) else {}),
                key: {**dataclasses.asdict(found), "measured_at": time.time()}}
        try:
            peak_cache.update_device(device, {"bandwidth": kept})
        except OSError as e:
            warn_once("cpu-bandwidth-keep", "fxflops: the measured memory bandwidth cannot "
                      "be kept in %s (%s); each process measures it again",
                      peak_cache.cache_path(), e)
    return found
