"""Device peaks: the table by device name and dtype, env overrides, MFU's dtype."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import pytest
import torch

import fxflops
from fxflops.peaks.devices import DEVICES, current_peak, match_device


@pytest.mark.parametrize("name,expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"),
    ("NVIDIA B200", "B200"), ("AMD Instinct MI300X", "MI300X")])
def test_device_table_matches_names(name, expected):
    assert match_device(name).name == expected


def test_peak_per_dtype_and_env_overrides(monkeypatch):
    monkeypatch.delenv("FXFLOPS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("FXFLOPS_PEAK_GBPS", raising=False)
    h200 = current_peak("NVIDIA H200", "bf16")
    assert h200 == {"tflops": 989.4, "gbps": 4800.0, "source": "table:H200:bf16"}
    assert current_peak("NVIDIA H200", "fp8")["tflops"] == 1978.9
    assert current_peak("NVIDIA H200", "fp32")["tflops"] < h200["tflops"]
    assert current_peak(None)["tflops"] is None  # a CPU: nothing unless told
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "123")
    assert current_peak("NVIDIA H200", "bf16")["tflops"] == 123.0
    assert all(p.gbps > 0 and p.tflops["bf16"] > 0 for p in DEVICES.values())


def test_mfu_dtype_is_the_matmuls_dtype():
    model = torch.nn.Linear(16, 16).to(torch.bfloat16)
    compiled = torch.compile(model, backend=fxflops.backend(inner="eager"))
    compiled(torch.randn(4, 16, dtype=torch.bfloat16))
    assert fxflops.recorder().graphs[0].cost.matmul_dtype == "torch.bfloat16"
    assert fxflops.recorder().info["dtype"] == "bf16"


# --- a CPU's derived peak: the rule by hand, on fake lscpu outputs --------------------------

SAPPHIRE_RAPIDS = """Architecture:            x86_64
Vendor ID:               GenuineIntel
Model name:              Intel(R) Xeon(R) Platinum 8480+
CPU family:              6
Thread(s) per core:      2
Core(s) per socket:      56
CPU max MHz:             3800.0000
Flags:                   fpu sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 \
amx_bf16 amx_int8 amx_tile avx512_fp16
"""
ICE_LAKE = """Vendor ID:               GenuineIntel
Model name:              Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz
CPU family:              6
Thread(s) per core:      2
Flags:                   fpu sse sse2 avx avx2 fma avx512f avx512dq avx512_vnni
"""
EPYC_AVX2 = """Vendor ID:               AuthenticAMD
Model name:              AMD EPYC
CPU family:              25
Thread(s) per core:      1
Flags:                   fpu sse sse2 avx fma avx2 f16c
"""
EPYC_ZEN4 = EPYC_AVX2.replace("f16c", "f16c avx512f avx512_bf16 avx512_vnni")
CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC\n" \
          "cpu MHz\t\t: 2445.406\nsiblings\t: 2\ncpu cores\t: 2\nflags\t\t: fma avx2\n"


@pytest.mark.parametrize("text,cpus,threads,base,dtype,tflops,isa", [
    # AMX: 56 cores (112 CPUs, 2 threads per core; torch's 56 threads) x 2.0 GHz base x
    # 1024 bf16 FLOP/cycle (a 16x16x32 tile product every 16 cycles)
    (SAPPHIRE_RAPIDS, 112, 56, 2000.0, "bf16", 56 * 2.0e9 * 1024 / 1e12, "amx_bf16"),
    (SAPPHIRE_RAPIDS, 112, 56, 2000.0, "int8", 56 * 2.0e9 * 2048 / 1e12, "amx_int8"),
    (SAPPHIRE_RAPIDS, 112, 56, 2000.0, "fp32", 56 * 2.0e9 * 64 / 1e12, "avx512"),
    # AVX-512, no bf16 unit: 32 cores (64 CPUs, SMT 2, 32 torch threads) x 2.0 GHz (the
    # model name's) x 64 fp32 FLOP/cycle (2 x 512-bit FMA); bf16 converted to fp32
    (ICE_LAKE, 64, 32, None, "fp32", 32 * 2.0e9 * 64 / 1e12, "avx512"),
    (ICE_LAKE, 64, 32, None, "bf16", 32 * 2.0e9 * 64 / 1e12, "bf16 computed in fp32"),
    (ICE_LAKE, 64, 32, None, "int8", 32 * 2.0e9 * 256 / 1e12, "vnni"),
    # AVX2 (this project's machines): 2 cores x 3.5 GHz (cpufreq) x 32 (2 x 256-bit FMA);
    # torch's 1 thread uses one core
    (EPYC_AVX2, 2, 2, 3500.0, "bf16", 2 * 3.5e9 * 32 / 1e12, "avx2+fma"),
    (EPYC_AVX2, 2, 1, 3500.0, "fp32", 1 * 3.5e9 * 32 / 1e12, "avx2+fma"),
    # Zen 4: AVX-512 on 256-bit datapaths (32 fp32), VDPBF16PS twice that
    (EPYC_ZEN4, 8, 8, 2400.0, "fp32", 8 * 2.4e9 * 32 / 1e12, "256-bit datapath"),
    (EPYC_ZEN4, 8, 8, 2400.0, "bf16", 8 * 2.4e9 * 64 / 1e12, "avx512_bf16"),
    # /proc/cpuinfo, no cpufreq: the current clock, labelled so
    (CPUINFO, 2, 2, None, "fp32", 2 * 2.445406e9 * 32 / 1e12, "current clock"),
])
def test_a_cpus_peak_is_derived_from_its_isa_cores_and_clock(text, cpus, threads, base, dtype,
                                                             tflops, isa):
    from fxflops.peaks.cpu import CpuFacts, derive

    facts = CpuFacts.parse(text, cpus=cpus, torch_threads=threads, base_mhz=base)
    got, source = derive(facts, dtype)
    assert got == pytest.approx(tflops, rel=1e-9), source
    assert source.startswith("derived:") and isa in source


# /proc/cpuinfo of an Arm server (Neoverse V1): its flags are "Features", it names no clock
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve bf16
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def _sysfs(root, files):
    """A fake ``/sys/devices/system/cpu``: ``files`` maps paths under it to their text."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


@pytest.mark.parametrize("files,clock_ghz,label", [
    # cpufreq's base clock (kHz) first, over CPPC's and the maximum
    ({"cpu0/cpufreq/base_frequency": "2000000\n", "cpu0/acpi_cppc/nominal_freq": "2600\n",
      "cpu0/cpufreq/cpuinfo_max_freq": "3500000\n"}, 2.0, "base clock"),
    # no cpufreq base (an Arm or AMD server): ACPI CPPC's nominal clock (MHz)
    ({"cpu0/acpi_cppc/nominal_freq": "2600\n", "cpu0/cpufreq/cpuinfo_max_freq": "3500000\n"},
     2.6, "nominal clock (ACPI CPPC)"),
    # a firmware that says 0 knows nothing: the maximum
    ({"cpu0/acpi_cppc/nominal_freq": "0\n", "cpu0/cpufreq/cpuinfo_max_freq": "3500000\n"},
     3.5, "max clock"),
    # nothing at all: no clock, no peak
    ({}, None, "no clock known"),
])
def test_an_arm_hosts_peak_reads_its_clock_from_sysfs(tmp_path, files, clock_ghz, label):
    from fxflops.peaks.cpu import derive, read_facts

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ARM_CPUINFO)
    facts = read_facts(str(cpuinfo), _sysfs(tmp_path / "cpu", files), [0, 1, 2, 3],
                       torch_threads=4)
    assert facts is not None and "asimd" in facts.flags and facts.cores == 4
    got, source = derive(facts, "fp32")
    # NEON: 2 x 128-bit FMA units, 16 fp32 FLOP/cycle per core
    assert got == (pytest.approx(4 * clock_ghz * 1e9 * 16 / 1e12, rel=1e-9)
                   if clock_ghz else None), source
    assert label in source and "neon" in source
    assert read_facts(str(tmp_path / "absent"), str(tmp_path), [0], None) is None


# an SMT-2 host of 4 cores as Linux numbers it: CPUs 0-3 are the cores' first threads,
# 4-7 their siblings (CPU n and n + 4 share core n); its core ids repeat across its two
# dies (cores 0-1 on one, 2-3 on the other), as on multi-die parts
SMT_TOPOLOGY = {f"cpu{n}/topology/{name}": f"{value}\n" for n in range(8)
                for name, value in (("core_cpus_list", f"{n % 4},{n % 4 + 4}"),
                                    ("core_id", n % 2), ("physical_package_id", 0))}
# a kernel before 5.7: the same cores named by the older file only
OLD_KERNEL = {name.replace("core_cpus_list", "thread_siblings_list"): text
              for name, text in SMT_TOPOLOGY.items()}


@pytest.mark.parametrize("allowed,files,cores", [
    ([0, 1, 2, 3], SMT_TOPOLOGY, 4),  # pinned to a thread of each core: four cores
    ([0, 4], SMT_TOPOLOGY, 1),  # both threads of one core: one
    ([0, 1, 4, 5], SMT_TOPOLOGY, 2),
    (list(range(8)), SMT_TOPOLOGY, 4),
    ([0, 1, 2, 3], OLD_KERNEL, 4),
    # no topology to read: the CPUs over /proc/cpuinfo's threads per core (siblings 8 /
    # cpu cores 4)
    ([0, 1, 2, 3], {}, 2),
])
def test_the_cores_are_those_the_allowed_cpus_are_on(tmp_path, allowed, files, cores):
    from fxflops.peaks.cpu import read_facts

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: avx2 fma\nsiblings\t: 8\ncpu cores\t: 4\n"
                       "cpu MHz\t\t: 3000.000\n")
    facts = read_facts(str(cpuinfo), _sysfs(tmp_path / "cpu", files), allowed,
                       torch_threads=8)
    assert facts is not None and facts.threads_per_core == 2
    assert facts.cores == cores
    # torch's threads bound it: one thread runs on one core
    assert read_facts(str(cpuinfo), _sysfs(tmp_path / "cpu", files), allowed,
                      torch_threads=1).cores == 1


def test_a_cpu_without_known_vector_flags_is_not_called_sse():
    from fxflops.peaks.cpu import CpuFacts, derive

    power = CpuFacts.parse("processor\t: 0\ncpu\t\t: POWER9\nclock\t\t: 3800.000000MHz\n",
                           cpus=2, base_mhz=3800.0)
    got, source = derive(power, "fp32")
    assert got == pytest.approx(2 * 3.8e9 * 8 / 1e12) and "128-bit vectors assumed" in source
    assert "sse" not in source
    old_x86 = CpuFacts.parse("flags\t\t: fpu sse sse2\n", cpus=1, base_mhz=2000.0)
    assert "(sse2)" in derive(old_x86, "fp32")[1]


def test_a_cpu_report_has_a_derived_peak_and_mfu_which_a_measured_one_replaces(monkeypatch,
                                                                               tmp_path, request):
    """Out of the box a CPU run's report has a peak (source "derived: ...") and its rows an
    MFU; ``fxflops peak --measure``'s figure replaces it; the environment overrides both."""
    from fxflops.peaks import cpu_bandwidth
    from fxflops.peaks.devices import save_measured

    # (a cache of its own: the figure it keeps must not become later tests' peak; the
    # host's bandwidth kept in it as any fxflops command keeps it)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FXFLOPS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("FXFLOPS_PEAK_GBPS", raising=False)
    monkeypatch.setattr(cpu_bandwidth, "_MAY_MEASURE", [True])
    cpu_bandwidth.host_bandwidth.cache_clear()
    request.addfinalizer(cpu_bandwidth.host_bandwidth.cache_clear)
    compiled = torch.compile(torch.nn.Linear(64, 64), backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(32, 64))
    report = fxflops.recorder().to_dict()
    assert report["peak"]["source"].startswith("derived:") and report["peak"]["tflops"] > 0
    # both roofs: the FLOP/s derived, the memory bandwidth measured; the row's bound filled
    assert report["peak"]["gbps"] > 0 and "GB/s measured" in report["peak"]["source"]
    (row,) = report["graphs"][0]["rows"]
    assert row["mfu"] is not None and row["mfu"] > 0
    assert row["bound"] in ("memory", "compute") and row["roofline_ms"] > 0
    device = fxflops.recorder().info["device"]
    save_measured(device, {report["process"]["dtype"] or "fp32": 1.5, "fp32": 1.5}, 10.0)
    measured = fxflops.recorder().to_dict()["peak"]
    assert measured == {"tflops": 1.5, "gbps": 10.0, "source": "measured"}
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "2.5")
    # the environment's FLOP/s beside the measured bandwidth: the source names both
    assert fxflops.recorder().to_dict()["peak"] == {"tflops": 2.5, "gbps": 10.0,
                                                    "source": "env+measured"}
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "20")
    assert fxflops.recorder().to_dict()["peak"] == {"tflops": 2.5, "gbps": 20.0,
                                                    "source": "env"}


# --- a CPU's memory bandwidth: measured once, kept in the host's peak cache ----------------


@pytest.fixture
def bandwidth_cache(tmp_path, monkeypatch):
    """An empty peak cache of this test's own, nothing measured in this process yet, and
    the measurements made counted (each a real one)."""
    from fxflops.peaks import cpu_bandwidth

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FXFLOPS_PEAK_TFLOPS", raising=False)
    monkeypatch.delenv("FXFLOPS_PEAK_GBPS", raising=False)
    made: list[tuple[cpu_bandwidth.Bandwidth, float]] = []
    real = cpu_bandwidth.measure

    def counted(*args, **kwargs):
        start = time.perf_counter()
        found = real(*args, **kwargs)
        made.append((found, time.perf_counter() - start))
        return found

    monkeypatch.setattr(cpu_bandwidth, "measure", counted)
    monkeypatch.setattr(cpu_bandwidth, "_MAY_MEASURE", [True])  # (as the CLI allows it)
    cpu_bandwidth.host_bandwidth.cache_clear()
    yield made
    cpu_bandwidth.host_bandwidth.cache_clear()


def test_a_recording_process_never_measures_the_bandwidth(tmp_path, monkeypatch):
    """A process that records a model (the library, a server, a training job) reads the
    kept figure and never measures: nothing kept, no memory roof, nothing measured; the
    ``fxflops`` command may (``allow_measuring``)."""
    from fxflops.peaks import cpu_bandwidth

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_bandwidth, "_MAY_MEASURE", [])
    calls = []
    monkeypatch.setattr(cpu_bandwidth, "measure", lambda *a, **k: calls.append(1))
    cpu_bandwidth.host_bandwidth.cache_clear()
    try:
        assert cpu_bandwidth.host_bandwidth("cpu:test") is None and calls == []
    finally:
        cpu_bandwidth.host_bandwidth.cache_clear()


def _cached(device):
    from fxflops.peaks.cache import cache_path

    with open(cache_path()) as f:
        return json.load(f)[device]["bandwidth"]


def test_a_cpus_bandwidth_is_measured_once_in_well_under_a_second_and_kept(bandwidth_cache):
    from fxflops.peaks import cpu_bandwidth

    first = cpu_bandwidth.host_bandwidth("cpu:test")
    assert first is not None and first.gbps > 0 and first.kernel in ("copy", "triad")
    ((measured, seconds),) = bandwidth_cache
    assert measured == first
    # short: the copies and triads stop at the budget (about 0.35 s here, 1 s is slack)
    assert seconds < 1.0
    (key,) = _cached("cpu:test")
    assert _cached("cpu:test")[key]["gbps"] == first.gbps
    # a later process (nothing in memory) reads the kept figure and measures nothing
    cpu_bandwidth.host_bandwidth.cache_clear()
    assert cpu_bandwidth.host_bandwidth("cpu:test") == first and len(bandwidth_cache) == 1


def test_a_cpus_bandwidth_is_measured_again_when_its_facts_change(bandwidth_cache,
                                                                   monkeypatch):
    """Kept per facts, as the FLOP/s peak is derived from them: other cores (or another
    clock, another CPU model) measure again and keep their figure beside the first."""
    from fxflops.peaks import cpu_bandwidth
    from fxflops.peaks.cpu import CpuFacts

    facts = CpuFacts(frozenset({"avx2"}), model_name="Test CPU", clock_ghz=2.0, cpus=2)
    monkeypatch.setattr(cpu_bandwidth, "this_host", lambda: facts)
    cpu_bandwidth.host_bandwidth("cpu:test")
    one_core = dataclasses.replace(facts, cpus=1)
    monkeypatch.setattr(cpu_bandwidth, "this_host", lambda: one_core)
    cpu_bandwidth.host_bandwidth.cache_clear()
    cpu_bandwidth.host_bandwidth("cpu:test")
    assert len(bandwidth_cache) == 2
    assert sorted(_cached("cpu:test")) == ["Test CPU, 1 core(s) x 2.00 GHz",
                                           "Test CPU, 2 core(s) x 2.00 GHz"]
    monkeypatch.setattr(cpu_bandwidth, "this_host", lambda: facts)  # back to two cores
    cpu_bandwidth.host_bandwidth.cache_clear()
    cpu_bandwidth.host_bandwidth("cpu:test")
    assert len(bandwidth_cache) == 2  # kept: not measured a third time


@pytest.mark.parametrize("content,problem", [
    ("{\"cpu:test\": {\"bandwidth\": {", "cannot be read"),  # cut short
    ("[1, 2]", "not an object of devices"),
    ("{\"cpu:test\": {\"bandwidth\": {\"KEY\": {\"gbps\": \"fast\", \"kernel\": \"copy\", "
     "\"threads\": 2}}}}", "is not one"),
])
def test_a_bad_peak_cache_is_warned_about_once_and_written_over(bandwidth_cache, fxflops_log,
                                                                content, problem):
    from fxflops.peaks import cache as peak_cache
    from fxflops.peaks import cpu_bandwidth

    key = cpu_bandwidth.facts_key(cpu_bandwidth.this_host(), torch.get_num_threads())
    path = peak_cache.cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(content.replace("KEY", key))
    for _ in range(2):
        cpu_bandwidth.host_bandwidth.cache_clear()
        found = cpu_bandwidth.host_bandwidth("cpu:test")
        assert found is not None and found.gbps > 0  # the run goes on, with a figure
    warned = [r.getMessage() for r in fxflops_log.records if problem in r.getMessage()]
    assert len(warned) == 1, fxflops_log.text
    assert len(bandwidth_cache) == 1  # measured, kept, then read
    assert _cached("cpu:test")[key]["gbps"] == found.gbps  # written over, whole


def test_the_peak_cache_is_replaced_whole_never_written_in_place(tmp_path, monkeypatch):
    """A reader holding the old file keeps reading the old file whole (a new file renamed
    over it), and no temporary file is left beside it."""
    from fxflops.peaks import cache as peak_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    peak_cache.update_device("cpu:a", {"gbps": 1.0})
    path = peak_cache.cache_path()
    with open(path) as f:
        old = f.read()
    os.link(path, tmp_path / "reader")  # a reader's open file
    peak_cache.update_device("cpu:b", {"gbps": 2.0})
    assert (tmp_path / "reader").read_text() == old
    assert peak_cache.read_cache() == {"cpu:a": {"gbps": 1.0}, "cpu:b": {"gbps": 2.0}}
    assert sorted(os.listdir(os.path.dirname(path))) == [os.path.basename(path)]


def test_a_process_waits_for_the_one_measuring_and_reads_its_figure(bandwidth_cache):
    """While one process holds the cache's lock (measuring), another waits for it, then
    reads the figure kept and measures nothing: two processes never measure side by side
    (each would see half the memory, and keep that)."""
    from fxflops.peaks import cache as peak_cache
    from fxflops.peaks import cpu_bandwidth

    key = cpu_bandwidth.facts_key(cpu_bandwidth.this_host(), torch.get_num_threads())
    got = {}
    waiter = threading.Thread(target=lambda: got.update(
        found=cpu_bandwidth.host_bandwidth("cpu:test")))
    with peak_cache.locked():
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive()  # waiting for the lock
        peak_cache.update_device("cpu:test", {"bandwidth": {key: {
            "gbps": 12.5, "kernel": "triad", "threads": 2}}})
    waiter.join(timeout=30)
    assert got["found"] == cpu_bandwidth.Bandwidth(12.5, "triad", 2)
    assert bandwidth_cache == []


def test_the_environments_bandwidth_is_taken_and_nothing_is_measured(bandwidth_cache,
                                                                     monkeypatch, fxflops_log):
    """``FXFLOPS_PEAK_GBPS`` replaces the measurement (none is made); a bad value is warned
    about once and the measured one taken, the run going on."""
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "7")
    peak = current_peak("cpu:test", "fp32")
    assert peak["gbps"] == 7.0 and peak["source"].endswith("+env") and bandwidth_cache == []
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "fast")
    for _ in range(2):
        peak = current_peak("cpu:test", "fp32")
        assert peak["gbps"] == bandwidth_cache[0][0].gbps
    assert "GB/s measured" in peak["source"] and not peak["source"].endswith("+env")
    assert sum("FXFLOPS_PEAK_GBPS='fast' is not valid" in r.getMessage()
               for r in fxflops_log.records) == 1


@pytest.mark.parametrize("source,label", [
    ("derived: 2 core(s) x 2.10 GHz (current clock) x 32 FLOP/cycle (avx2+fma); "
     "8.41 GB/s measured (triad, 2 thread(s))", "derived"),
    ("derived: 2 core(s) x 2.10 GHz (current clock) x 32 FLOP/cycle (avx2+fma)+env",
     "derived+env"),
    ("env+derived: 1 core(s) x 2.10 GHz (current clock) x 32 FLOP/cycle (avx2+fma)",
     "env+derived"),
    ("table:H100 SXM:bf16", "H100 SXM"), ("table:H200:fp8+env", "H200+env"),
    ("env", "env"), ("measured", "measured"), ("env+measured", "env+measured"),
    ("none", "none"), ("", "none"), (None, "none")])
def test_a_peaks_source_in_a_word(source, label):
    from fxflops.peaks.of_run import source_label

    assert source_label(source) == label
