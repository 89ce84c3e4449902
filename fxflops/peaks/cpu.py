"""A CPU's dense peak, derived from what the machine says, datasheet style.

    peak FLOP/s = cores used x clock x FLOPs per cycle per core (for the dtype and ISA)

- **FLOPs per cycle per core** (a fused multiply-add is 2 FLOPs), from the ISA flags, as
  the vendors' optimisation manuals give the FMA units' width and count:

  | dtype | what the flags say | FLOPs/cycle/core |
  |---|---|---|
  | fp32 | `avx512f` on Intel (2 x 512-bit FMA units) | 64 |
  | fp32 | `avx512f` on AMD family 25 (Zen 4: 512-bit ops on 256-bit datapaths) | 32 |
  | fp32 | `avx512f` on AMD family 26 and later (Zen 5: 512-bit datapaths) | 64 |
  | fp32 | `avx2` and `fma` (2 x 256-bit FMA units) | 32 |
  | fp32 | `asimd` (Arm NEON: 2 x 128-bit FMA units) | 16 |
  | fp32 | none of these (SSE2, or an ISA not named here: a 128-bit multiply and add) | 8 |
  | bf16 | `amx_bf16` (AMX: a 16x16x32 tile product per 16 cycles) | 1024 |
  | bf16 | `avx512_bf16` (VDPBF16PS: 2 products per fp32 lane) | 2 x fp32's |
  | fp16 | `amx_fp16` | 1024 |
  | fp16 | `avx512_fp16` (32 fp16 lanes per 512-bit register) | 2 x fp32's |
  | int8 | `amx_int8` | 2048 |
  | int8 | `avx512_vnni` or `avx_vnni` (VPDPBUSD: 4 products per 32-bit lane) | 4 x fp32's |
  | any other | computed in fp32 (converted on the way in) | fp32's |

- **Cores used**: the physical cores of the CPUs this process may run on
  (``sched_getaffinity``; each CPU's core by sysfs' ``topology``, the CPUs that share
  it, so that CPUs pinned on distinct cores count as such; else the CPUs divided by the
  threads per core), at most torch's threads.
- **Clock**: the base clock (``cpufreq/base_frequency``; else ACPI CPPC's nominal
  clock, ``acpi_cppc/nominal_freq``, which Arm and AMD servers give where cpufreq has no
  base; else the ``@ x.xxGHz`` of the model name), else the maximum
  (``cpuinfo_max_freq``, lscpu's ``CPU max MHz``), else the current (``cpu MHz``): the
  source says which.

The result is labelled ``derived`` in reports; ``fxflops peak --measure`` replaces it
with a measured peak, ``FXFLOPS_PEAK_TFLOPS`` with the user's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Sequence
from typing import Any

_FP32_RULES = (  # (test on facts, FLOPs per cycle per core, ISA label)
    (lambda f: "avx512f" in f.flags and f.vendor == "GenuineIntel", 64, "avx512"),
    (lambda f: "avx512f" in f.flags and f.vendor == "AuthenticAMD" and f.family <= 25, 32,
     "avx512 (256-bit datapath)"),
    (lambda f: "avx512f" in f.flags, 64, "avx512"),
    (lambda f: "avx2" in f.flags and "fma" in f.flags, 32, "avx2+fma"),
    (lambda f: "asimd" in f.flags, 16, "neon"),
)


@dataclasses.dataclass(frozen=True)
class CpuFacts:
    """What a CPU says of itself (lscpu's or /proc/cpuinfo's text), and what this process
    may use of it."""

    flags: frozenset[str]
    vendor: str = ""
    family: int = 0
    model_name: str = ""
    threads_per_core: int = 1
    clock_ghz: float | None = None
    clock_source: str = "none"
    cpus: int = 1  # logical CPUs this process may run on
    torch_threads: int | None = None
    physical_cores: int | None = None  # the distinct cores of those CPUs, where known

    @classmethod
    def parse(cls, text: str, cpus: int = 1, torch_threads: int | None = None,
              base_mhz: float | None = None, max_mhz: float | None = None,
              base_label: str = "base clock", physical_cores: int | None = None) -> CpuFacts:
        """From lscpu's output or /proc/cpuinfo (the first processor's fields);
        ``base_mhz`` (labelled ``base_label``) and ``max_mhz`` from files that say them,
        ``physical_cores`` from the CPUs' topology."""
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            key = key.strip().lower()
            if sep and key and key not in fields:
                fields[key] = value.strip()
        flags = frozenset((fields.get("flags") or fields.get("features") or "").split())
        family = fields.get("cpu family", "0")
        threads = fields.get("thread(s) per core")
        if threads is None and fields.get("siblings") and fields.get("cpu cores"):
            threads = str(max(1, int(fields["siblings"]) // max(1, int(fields["cpu cores"]))))
        name = fields.get("model name", "")
        clock, source = None, "none"
        in_name = re.search(r"@\s*([\d.]+)\s*GHz", name)
        max_mhz = max_mhz or _float(fields.get("cpu max mhz"))
        if base_mhz:
            clock, source = base_mhz / 1e3, base_label
        elif in_name:
            clock, source = float(in_name.group(1)), "base clock (model name)"
        elif max_mhz:
            clock, source = max_mhz / 1e3, "max clock"
        elif _float(fields.get("cpu mhz")):
            clock, source = _float(fields.get("cpu mhz")) / 1e3, "current clock"  # type: ignore[operator]
        return cls(flags, fields.get("vendor id") or fields.get("vendor_id", ""),
                   int(family) if family.isdigit() else 0, name,
                   int(threads) if threads and threads.isdigit() else 1, clock, source,
                   cpus, torch_threads, physical_cores)

    @property
    def cores(self) -> int:
        """Physical cores used: the allowed CPUs' distinct cores (else the CPUs over threads
        per core), at most torch's threads (each thread on a core of its own)."""
        cores = self.physical_cores or max(1, self.cpus // max(1, self.threads_per_core))
        return min(cores, self.torch_threads) if self.torch_threads else cores


def flops_per_cycle(facts: CpuFacts, dtype: str) -> tuple[int, str]:
    """(FLOPs per cycle per core, the ISA rule that gave it) for ``dtype`` (see the table)."""
    # no vector flag this table knows (SSE2 alone, or an ISA it does not name): one
    # 128-bit multiply and one add a cycle
    fp32, isa = 8, "sse2" if "sse2" in facts.flags else "128-bit vectors assumed"
    for test, per_cycle, label in _FP32_RULES:
        if test(facts):
            fp32, isa = per_cycle, label
            break
    flags = facts.flags
    if dtype == "bf16":
        if "amx_bf16" in flags:
            return 1024, "amx_bf16"
        if "avx512_bf16" in flags:
            return 2 * fp32, "avx512_bf16"
    if dtype == "fp16":
        if "amx_fp16" in flags:
            return 1024, "amx_fp16"
        if "avx512_fp16" in flags:
            return 2 * fp32, "avx512_fp16"
    if dtype == "int8":
        if "amx_int8" in flags:
            return 2048, "amx_int8"
        if "avx512_vnni" in flags or "avx_vnni" in flags:
            return 4 * fp32, "vnni"
    return fp32, isa if dtype in ("fp32", "tf32") else f"{isa}, {dtype} computed in fp32"


def derive(facts: CpuFacts, dtype: str) -> tuple[float | None, str]:
    """(dense TFLOP/s, how it was derived) for ``dtype``; None without a clock."""
    per_cycle, isa = flops_per_cycle(facts, dtype)
    if not facts.clock_ghz:
        return None, f"derived: no clock known ({isa})"
    tflops = facts.cores * facts.clock_ghz * 1e9 * per_cycle / 1e12
    return tflops, (f"derived: {facts.cores} core(s) x {facts.clock_ghz:.2f} GHz "
                    f"({facts.clock_source}) x {per_cycle} FLOP/cycle ({isa})")


@functools.lru_cache(maxsize=1)
def this_host() -> CpuFacts | None:
    """This host's facts (/proc/cpuinfo, sysfs' clock and topology, this process's
    affinity and torch's threads); None where they cannot be read. Read once per process."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    threads: int | None = None
    try:
        import torch

        threads = torch.get_num_threads()
    except Exception:
        pass
    return read_facts("/proc/cpuinfo", "/sys/devices/system/cpu", allowed, threads)


def read_facts(cpuinfo: str, sysfs: str, allowed: Sequence[int], torch_threads: int | None
               ) -> CpuFacts | None:
    """The facts in the text of ``cpuinfo`` and, under ``sysfs`` (``/sys/devices/system/
    cpu``), the first allowed CPU's clock files and the allowed CPUs' cores; None where
    ``cpuinfo`` cannot be read. ``allowed``: the CPUs this process may run on."""
    try:
        with open(cpuinfo) as f:
            text = f.read(1 << 16)
    except OSError:
        return None
    first = f"{sysfs}/cpu{allowed[0] if allowed else 0}"
    base, label = _khz_file(f"{first}/cpufreq/base_frequency"), "base clock"
    if base is None:
        # CPPC's clocks are in MHz
        base, label = _int_file(f"{first}/acpi_cppc/nominal_freq"), "nominal clock (ACPI CPPC)"
    return CpuFacts.parse(text, max(1, len(allowed)), torch_threads, base_mhz=base,
                          base_label=label, max_mhz=_khz_file(f"{first}/cpufreq/cpuinfo_max_freq"),
                          physical_cores=_distinct_cores(sysfs, allowed))


def _distinct_cores(sysfs: str, allowed: Sequence[int]) -> int | None:
    """How many physical cores the ``allowed`` CPUs are on: each CPU's core named by the
    CPUs that share it (``topology/core_cpus_list``, ``thread_siblings_list`` on kernels
    before 5.7; a core id is not unique across a package's dies or clusters); None where
    any CPU's cannot be read."""
    cores = set()
    for cpu in allowed:
        topology = f"{sysfs}/cpu{cpu}/topology"
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                with open(f"{topology}/{name}") as f:
                    cores.add(f.read().strip())
                break
            except OSError:
                continue
        else:
            return None
    return len(cores) or None


def host_peak(dtype: str) -> tuple[float | None, str]:
    """This host's derived peak for ``dtype``: (TFLOP/s, source)."""
    facts = this_host()
    if facts is None:
        return None, "none"
    return derive(facts, dtype)


def _float(value: Any) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _khz_file(path: str) -> float | None:
    """A cpufreq file (kHz) in MHz."""
    khz = _int_file(path)
    return khz / 1e3 if khz is not None else None


def _int_file(path: str, least: int = 1) -> int | None:
    """A sysfs file holding one integer of at least ``least`` (a clock of 0 is a firmware
    that does not know); None where it cannot be read or is less."""
    try:
        with open(path) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= least else None
