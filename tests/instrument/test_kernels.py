"""The per-kernel profile (``fxflops.kernels``), for real: Inductor on this CPU compiles the
graphs, its provenance tracking maps nodes to the kernels it generated, torch.profiler times
them. What each test checks against: FLOPs and bytes by hand (the known fusion), the rows'
own FLOPs (exact sums at every size), the graph's node-by-node and I/O bytes (bounds), the
profiler's nesting (kernels within their call).

Which kernels Inductor makes depends on the host (ISA, and its GEMM choice): the known
fusion below is Inductor's default on any CPU (an extern GEMM, one fused C++ epilogue);
each test prints the kernels it saw.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
import sympy
import torch

import fxflops
from fxflops.cli.demo_model import DemoConfig, DemoDecoder
from fxflops.cost.graph_cost import GraphCost, NodeCost
from fxflops.cost.kernels import Shape, at_size, kernel_costs
from tests import procs
from tests.helpers import graphs_of

ROOT = Path(__file__).resolve().parents[2]
W = torch.randn(256, 128)


def fused(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ W) * 2 + 1


def report_of() -> dict:
    data = fxflops.recorder().to_dict()
    json.dumps(data)  # what a report file holds
    return data


def test_known_fusion_by_hand():
    compiled = torch.compile(fused, backend=fxflops.backend(kernels=0))
    compiled(torch.randn(64, 256))
    (graph,) = report_of()["graphs"]
    kernels = graph["kernels"]
    print("kernels:", [k["kernel"] for k in kernels])
    gemm, epilogue = kernels
    assert gemm["kernel"].startswith("extern_kernels.mm") and gemm["nodes"] == ["matmul"]
    assert gemm["flops"] == gemm["matmul_flops"] == 2 * 64 * 256 * 128
    assert gemm["bytes"] == 4 * (64 * 256 + 256 * 128 + 64 * 128)  # x, W read; x @ W written
    assert epilogue["kernel"].startswith("cpp_fused") and not epilogue["extern"]
    assert sorted(epilogue["nodes"]) == ["add", "mul", "relu"]
    # one FLOP per element each for relu, * 2 and + 1; it reads x @ W and writes the output
    assert epilogue["flops"] == 3 * 64 * 128 and epilogue["matmul_flops"] == 0
    assert epilogue["bytes"] == 2 * 4 * 64 * 128
    (row,) = graph["rows"]
    assert [k["flops"] for k in row["kernels"]] == [gemm["flops"], epilogue["flops"]]
    assert "kernels_profile" not in row  # kernels=0: the map, no profiling


@pytest.mark.parametrize("dynamic", [False, True])
def test_demo_model_every_node_in_a_kernel_and_exact_sums(dynamic):
    cfg = DemoConfig(layers=1)
    model = DemoDecoder(cfg).eval()
    compiled = torch.compile(model, backend=fxflops.backend(kernels=0), dynamic=dynamic)
    with torch.no_grad():
        for seq in (16, 24, 16, 40):
            compiled(torch.randint(0, cfg.vocab, (2, seq)))
    checked = 0
    records = {g.name: g for g in fxflops.recorder().graphs}
    for graph in report_of()["graphs"]:
        kernels = graph.get("kernels")
        assert kernels, f"{graph['name']}: no kernels mapped"
        print(graph["name"], [k["kernel"] for k in kernels])
        # every node with a cost is in a kernel: nothing with FLOPs is left in <none>
        assert all(k["kernel"] != "<none>" for k in kernels)
        costed = {n.name for n in records[graph["name"]].cost.nodes if n.flops != 0}
        placed = {node for k in kernels for node in k["nodes"]}
        assert costed <= placed, costed - placed
        for row in graph["rows"]:
            ks = row["kernels"]
            assert sum(k["flops"] for k in ks) == row["flops"]
            assert sum(k["matmul_flops"] for k in ks) == row["matmul_flops"]
            fused_bytes = sum(k["bytes"] for k in ks)
            assert row["bytes_io"] <= fused_bytes <= row["bytes_nodes"]
            checked += 1
    assert checked >= (3 if dynamic else 3)


def test_a_node_split_over_kernels_shares_by_its_computing_parts():
    """The stated rule, on a mapping written by hand: node ``norm`` has three computing
    aten nodes in K1 and one in K2 (and a view in K3, which holds no part of it)."""
    s = sympy.Symbol("s", positive=True, integer=True)
    cost = GraphCost(flops=7 * s, matmul_flops=0, bytes_io=0, bytes_nodes=0, symbols=(s,),
                     nodes=[NodeCost("norm", "norm", flops=7 * s)], uncounted={})
    shape = Shape(inputs={"x": (), "norm": ("x",)}, out_bytes={"x": 4 * s, "norm": 4 * s},
                  returned=frozenset({"norm"}), order=("x", "norm"))
    mapping = {"postToPre": {p: ["norm"] for p in ("pow_1", "mean", "rsqrt", "mul", "view")},
               "cppCodeToPost": {"cpp_k1:1": ["pow_1", "mean", "rsqrt"], "cpp_k2:2": ["mul"],
                                 "cpp_k3:3": ["view"]},
               "_post_ops": {"pow_1": "aten.pow.Tensor_Scalar", "mean": "aten.mean.dim",
                             "rsqrt": "aten.rsqrt.default", "mul": "aten.mul.Tensor",
                             "view": "aten.view.default"}}
    kernels = {k.name: k for k in kernel_costs(cost, shape, mapping)}
    assert kernels["cpp_k1"].flops == sympy.Rational(3, 4) * 7 * s
    assert kernels["cpp_k2"].flops == sympy.Rational(1, 4) * 7 * s
    assert "cpp_k3" not in kernels  # a view computes no part of a node
    for size in range(1, 9):
        figures = at_size(list(kernels.values()), {s: size})
        assert sum(f["flops"] for f in figures) == 7 * size  # exact at every size
        assert figures[0]["flops"] in (21 * size // 4, 21 * size // 4 + 1)
    # both parts read the node's input; the last part writes its output
    assert kernels["cpp_k1"].bytes == 4 * s and kernels["cpp_k2"].bytes == 8 * s


def test_profiled_calls_time_every_kernel_within_the_call(monkeypatch):
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "1")  # a roofline to place the kernels on
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "10")
    compiled = torch.compile(fused, backend=fxflops.backend(kernels=3))
    for _ in range(6):
        compiled(torch.randn(64, 256))
    (graph,) = report_of()["graphs"]
    (row,) = graph["rows"]
    assert row["calls"] == 6
    prof = row["kernels_profile"]
    assert prof["calls"] == 3 and prof["unmatched"] == 0
    assert all(k["median_ms"] > 0 for k in row["kernels"])
    # the kernels run inside the call: their time is at most the call's, the rest the
    # wrapper's (stated in the report; a Python wrapper takes some)
    assert prof["kernels_ms"] <= prof["median_ms"]
    assert prof["overhead_ms"] == pytest.approx(prof["median_ms"] - prof["kernels_ms"])
    assert prof["overhead_ms"] > 0
    # each kernel's rates and roofline from its FLOPs and bytes by hand (test above) and
    # its measured median, against 1 TFLOP/s and 10 GB/s
    by_hand = {"extern_kernels.mm": (2 * 64 * 256 * 128, 4 * (64 * 256 + 256 * 128 + 64 * 128)),
               "cpp_fused": (3 * 64 * 128, 2 * 4 * 64 * 128)}
    for k in row["kernels"]:
        flops, nbytes = next(v for name, v in by_hand.items() if k["kernel"].startswith(name))
        seconds = k["median_ms"] / 1e3
        assert k["intensity"] == pytest.approx(flops / nbytes)
        assert k["tflops"] == pytest.approx(flops / seconds / 1e12)
        assert k["gbps"] == pytest.approx(nbytes / seconds / 1e9)
        compute_s, memory_s = flops / 1e12, nbytes / 10e9  # both kernels: memory-bound
        assert k["bound"] == "memory" and memory_s > compute_s
        assert k["roofline_share"] == pytest.approx(memory_s / seconds)
    for call in prof["trace"]:
        assert sum(k["dur_us"] for k in call["kernels"]) <= call["dur_us"]
        assert [k["kernel"] for k in call["kernels"]] == [k["kernel"] for k in graph["kernels"]]


def test_a_kernel_launched_twice_is_timed_per_launch():
    """Inductor launches one generated kernel twice where two nodes' code is the same (two
    GELUs of one width): each of its two entries in the map is timed by its own launch,
    the n-th entry by the n-th launch in the call, and no launch is counted unmatched. The
    reference is the profile's own timeline of each call (``trace``), launch by launch."""
    from statistics import median

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32),
                              torch.nn.Linear(32, 64), torch.nn.GELU())
    compiled = torch.compile(mlp, backend=fxflops.backend(kernels=3))
    with torch.no_grad():
        for _ in range(5):
            compiled(torch.randn(16, 32))
    (graph,) = report_of()["graphs"]
    (row,) = graph["rows"]
    names = [k["kernel"] for k in row["kernels"]]
    twice = [n for n in set(names) if names.count(n) == 2 and not n.startswith("extern")]
    assert twice, f"no kernel launched twice here: {names}"
    prof = row["kernels_profile"]
    assert prof["calls"] == 3 and prof["unmatched"] == 0
    for name in twice:
        for n, entry in enumerate(k for k in row["kernels"] if k["kernel"] == name):
            per_call = [[k["dur_us"] for k in call["kernels"] if k["kernel"] == name][n]
                        for call in prof["trace"]]
            assert entry["median_ms"] == pytest.approx(median(per_call) / 1e3, rel=1e-3)


def test_profiling_off_leaves_the_call_path_as_it_was():
    from fxflops.instrument.wrap import InstrumentedGraph

    mapped = []
    for kernels in (None, 0):
        fxflops.reset_recorder()
        torch._dynamo.reset()
        backend = fxflops.backend(kernels=kernels)
        compiled = torch.compile(fused, backend=backend)
        compiled(torch.randn(64, 256))
        (record,) = fxflops.recorder().graphs
        mapped.append(record.kernels is not None)
        # the plain class: its __call__ is the inlined fast path
        (graph,) = graphs_of(record)
        assert type(graph) is InstrumentedGraph
    assert mapped == [False, True]


def test_kernels_hold_on_an_inductor_cache_hit():
    first = torch.compile(fused, backend=fxflops.backend(kernels=0))
    first(torch.randn(32, 256))
    (before,) = report_of()["graphs"]
    torch._dynamo.reset()
    fxflops.reset_recorder()
    from torch._dynamo.utils import counters

    hits = counters["inductor"]["fxgraph_cache_hit"]
    again = torch.compile(fused, backend=fxflops.backend(kernels=0))
    again(torch.randn(32, 256))
    assert counters["inductor"]["fxgraph_cache_hit"] > hits  # served from Inductor's cache
    (after,) = report_of()["graphs"]
    assert [(k["kernel"], k["nodes"], k["flops"], k["bytes"]) for k in after["kernels"]] == \
        [(k["kernel"], k["nodes"], k["flops"], k["bytes"]) for k in before["kernels"]]


def test_training_step_forward_and_backward_kernels():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                                torch.nn.Linear(128, 32))
    compiled = torch.compile(model, backend=fxflops.backend(kernels=2))
    for _ in range(3):
        compiled(torch.randn(16, 64)).sum().backward()
    graphs = report_of()["graphs"]
    phases = {g["meta"]["phase"]: g for g in graphs}
    assert set(phases) == {"forward", "backward"}
    for phase, graph in phases.items():
        print(phase, [k["kernel"] for k in graph["kernels"]])
        assert any(k["matmul_flops"] for k in graph["kernels"])  # the GEMMs are externs
        for row in graph["rows"]:
            assert sum(k["flops"] for k in row["kernels"]) == row["flops"]
            assert row["kernels_profile"]["calls"] == 2
            assert all(k.get("median_ms", 0) > 0 for k in row["kernels"])


@pytest.fixture
def kernel_report(tmp_path, monkeypatch):
    """A report file of profiled kernels (``FXFLOPS_KERNELS=3``), and its annotated dump."""
    out = tmp_path / "out"
    code = ("import torch, fxflops\n"
            "W = torch.randn(256, 128)\n"
            "f = torch.compile(lambda x: torch.relu(x @ W) * 2 + 1, backend='fxflops',"
            " dynamic=True)\n"
            "for n in (32, 64, 32, 64, 32, 64, 48):\n"
            "    f(torch.randn(n, 256))\n")
    env = {**os.environ, "FXFLOPS_OUT": str(out), "FXFLOPS_KERNELS": "3"}
    result = procs.run([sys.executable, "-c", code], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_trace_loads_with_calls_and_kernels_nested(kernel_report, tmp_path):
    trace = tmp_path / "trace.json"
    result = procs.run([sys.executable, "-m", "fxflops.cli.main", "trace", str(kernel_report),
                        "-o", str(trace)])
    assert result.returncode == 0, result.stderr
    events = json.loads(trace.read_text())["traceEvents"]  # the trace-event format
    calls = [e for e in events if e.get("cat") == "graph"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(calls) == 3 + 3 + 1  # 3 calls profiled at 32 and at 64, the one at 48
    assert len(kernels) == 2 * len(calls)
    for k in kernels:  # each kernel inside a call of its graph
        parents = [c for c in calls if c["pid"] == k["pid"] and c["tid"] == k["tid"]
                   and c["ts"] <= k["ts"] and k["ts"] + k["dur"] <= c["ts"] + c["dur"] + 1e-6]
        assert len(parents) == 1, k
        assert k["args"]["flops"] > 0 and k["args"]["bytes"] > 0
    assert all(e["ph"] in ("X", "M") for e in events)


def test_report_kernels_and_the_dump_name_them(kernel_report):
    result = procs.run([sys.executable, "-m", "fxflops.cli.main", "report", str(kernel_report),
                        "--kernels"], env={**os.environ, "COLUMNS": "220"})
    assert result.returncode == 0, result.stderr
    # (dynamic=True: W, a global, is an input with sizes of its own: 64x256x128)
    for text in ("extern_kernels.mm", "cpp_fused", "kernels of graph0 at size 64x256x128",
                 "outside kernels (the wrapper's)"):
        assert text in result.stdout
    dump = (kernel_report / "graphs" / "graph0.py").read_text()
    assert "# kernels (2, in the order they run):" in dump
    assert "kernel extern_kernels.mm" in dump and "kernel cpp_fused" in dump
    sized = (kernel_report / "graphs" / "graph0.size64x256x128.py").read_text()
    assert f"{2 * 64 * 256 * 128 / 1e6:.3g} MFLOP" in sized  # the GEMM's FLOPs at 64


def test_plot_kernels_draws_a_point_per_kernel(kernel_report, tmp_path):
    pytest.importorskip("matplotlib")
    image = tmp_path / "kernels.png"
    result = procs.run([sys.executable, "-m", "fxflops.cli.main", "plot", str(kernel_report),
                        "--kernels", "-o", str(image)])
    assert result.returncode == 0, result.stderr
    assert "6 kernel points" in result.stdout and image.read_bytes()[:4] == b"\x89PNG"


def test_peak_measure_is_kept_as_this_hosts_peak(tmp_path):
    """``fxflops peak --measure``: this CPU's GEMM rate, printed and kept as its peak
    (source ``measured``) for later runs, and physically possible: under the peak the CPU's
    own facts allow (cores x clock x FLOP/cycle; a turbo clock may pass the current clock a
    little, a miscounted GEMM by 2x would not). A rate measured again is not compared:
    this VM's neighbours move it by half (a timed assertion, not a test)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    result = procs.run([sys.executable, "-m", "fxflops.cli.main", "peak", "--measure",
                        "--n", "512"], env=env)
    assert result.returncode == 0, result.stderr
    check = ("import json\n"
             "from fxflops.peaks.devices import current_peak, load_measured\n"
             "from fxflops.peaks.cpu import host_peak\n"
             "from fxflops.peaks.devices import device_name\n"
             "kept = load_measured(device_name('cpu'))\n"
             "peak = current_peak(device_name('cpu'), 'fp32')\n"
             "print(json.dumps({'kept': kept['tflops']['fp32'], 'source': peak['source'],"
             " 'tflops': peak['tflops'], 'derived': host_peak('fp32')[0]}))\n")
    out = procs.run([sys.executable, "-c", check], env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["source"] == "measured" and got["tflops"] == got["kept"] > 0
    assert f"fp32: measured {got['kept']:.3f} TFLOP/s" in result.stdout
    if got["derived"] is not None:  # a host whose cores, clock and ISA can be read
        assert got["kept"] <= 1.5 * got["derived"]


def test_peak_prints_the_table_peak_readably_and_says_when_a_matmul_passes_it(tmp_path):
    """``fxflops peak``: the table peak in four significant figures (not a float's repr),
    and a note when the matmul it measures passes it (a derived peak is as high as the
    clock the CPU admits to, which a VM's turbo passes), which a peak above it omits."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    printed = {}
    for told in ("0.000123456789", "123456789"):
        result = procs.run([sys.executable, "-m", "fxflops.cli.main", "peak", "--n", "128"],
                           env={**env, "FXFLOPS_PEAK_TFLOPS": told})
        assert result.returncode == 0, result.stderr
        printed[told] = result.stdout
    assert "table peak:   0.0001235 TFLOP/s" in printed["0.000123456789"]
    assert "table peak:   1.235e+08 TFLOP/s" in printed["123456789"]
    note = "the table peak is below what this matmul reached"
    assert note in printed["0.000123456789"] and note not in printed["123456789"]


@pytest.mark.vllm
@pytest.mark.vllm_cpu
def test_vllm_mode2_inductor_graph_kernels_at_every_size(tmp_path):
    """vLLM, mode 2 with backend "fxflops" (Inductor): the model's graph mapped to its
    kernels, exact at every size vLLM ran (attention's run-time FLOPs with the kernel that
    runs it), each kernel timed over its profiled calls; and the worker's log carries none
    of the profiler's own lines."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--mode", "2",
           "--backend", "fxflops", "--cache", str(tmp_path / "cache")]
    result = procs.run(cmd, timeout=900, cwd=ROOT, env={**os.environ, "FXFLOPS_KERNELS": "2"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    # profiled calls in vLLM's worker: the profiler's own lines never reach the log
    log = (result.stdout + result.stderr).splitlines()
    assert not [line for line in log if "USDT:" in line or "STAGE:" in line]
    from fxflops.report.files import load_reports

    (report,) = load_reports([out])
    (graph,) = report["graphs"]
    names = [k["kernel"] for k in graph["kernels"]]
    print(len(names), "kernels:", names[:8])
    assert any(k["matmul_flops"] for k in graph["kernels"])
    assert any(not k["extern"] for k in graph["kernels"])  # Inductor's generated code
    sizes = 0
    for row in graph["rows"]:
        assert sum(k["flops"] for k in row["kernels"]) == row["flops"]
        assert sum(k["matmul_flops"] for k in row["kernels"]) == row["matmul_flops"]
        prof = row["kernels_profile"]
        assert 1 <= prof["calls"] <= 2 and prof["kernels_ms"] <= prof["median_ms"]
        sizes += 1
    assert sizes >= 2


def test_report_kernels_lists_the_slowest_first_and_the_furthest_from_the_roofline():
    """``fxflops report --kernels N``: the N slowest kernels, slowest first; the three
    furthest from their roofline, furthest first (medians and shares written here)."""
    from rich.console import Console

    from fxflops.cli.report import print_kernels

    def kernel(name, ms, share):
        return {"kernel": name, "flops": 1000, "matmul_flops": 0, "bytes": 100,
                "intensity": 10.0, "median_ms": ms, "tflops": 1e-6, "gbps": 1.0,
                "roofline_share": share, "bound": "memory"}

    kernels = [kernel("k_fast", 0.01, 0.9), kernel("k_slow", 0.30, 0.5),
               kernel("k_mid", 0.10, 0.05), kernel("k_far", 0.02, 0.01)]
    report = {"graphs": [{"name": "graph0", "rows": [{"size": 8, "kernels": kernels}]}]}
    console = Console(record=True, width=200)
    print_kernels(console, [report], limit=3)
    text = console.export_text()
    table = [line for line in text.splitlines() if line.startswith("│")]  # the table's rows
    listed = [name for line in table for name in ("k_fast", "k_slow", "k_mid", "k_far")
              if name in line]
    assert listed == ["k_slow", "k_mid", "k_far"], text  # k_fast: past the limit
    assert "furthest from the roofline: k_far (1.0%), k_mid (5.0%), k_slow (50.0%)" in text


def test_the_profilers_own_lines_are_dropped_and_the_rest_kept(capfd, monkeypatch):
    """What Kineto prints while the profiler starts or stops goes nowhere: its USDT and STAGE
    lines, its verbose lines, warnings and errors in its logger's format (a CUDA build on a
    host without a GPU logs ``gpuGetDeviceCount failed``: written here by hand, as this
    host's build does not); another thread's lines written meanwhile, a Python logger's
    ``WARNING:root:`` and a glog-format line among them, are kept in order.
    ``FXFLOPS_LOG=debug`` keeps them all."""
    from fxflops.recording.kernel_profile import profiler_quiet

    kineto = [
        "USDT:2026-12-03 04:36:07 14727:14727 SyncActivityProfilerHandler.cpp:52] profiler_start",
        "STAGE:2026-12-03 04:36:07 14727:14727 ActivityProfilerController.cpp:314] Completed",
        "ERROR:2026-12-03 04:36:07 14727:14727 CudaDeviceProperties.cpp:26] gpuGetDeviceCount "
        "failed with code 35",
        "WARNING:2026-12-03 04:36:07 14727:14730 CuptiActivityProfiler.cpp:1102] no CUPTI",
        "VERBOSE:2026-12-03 04:36:07 14727:14727 CuptiActivityApi.cpp:52] enabled",
    ]
    # another thread's: Python logging's default format, a line that only ends like
    # Kineto's, and glog's format (absl-py's handler writes it too)
    host = ["WARNING:root:a host's warning", "host line 2026-12-03 04:36:07 1:1 a.py:1] x",
            "W1203 04:36:07.123456 14727 my_module.py:52] a host's absl warning"]
    written = [kineto[0], host[0], *kineto[1:3], host[1], *kineto[3:], host[2]]

    def write_all():
        with profiler_quiet():
            os.write(2, "".join(line + "\n" for line in written).encode())

    monkeypatch.delenv("FXFLOPS_LOG", raising=False)
    write_all()
    assert capfd.readouterr().err.splitlines() == host
    monkeypatch.setenv("FXFLOPS_LOG", "debug")
    write_all()
    assert capfd.readouterr().err.splitlines() == written


def test_profiled_calls_leave_the_log_quiet(tmp_path):
    """``kernels=N``: Kineto prints a ``USDT:... profiler_start``/``profiler_stop`` line at
    each profiled call; fxflops drops them (a server profiling N calls per size would flood
    its log), keeps everything else written meanwhile, and writes at most a few lines of
    its own. ``FXFLOPS_LOG=debug`` keeps them."""
    code = textwrap.dedent("""
        import sys, torch, fxflops
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 16))
        compiled = torch.compile(model, backend=fxflops.backend(kernels=3), dynamic=True)
        with torch.no_grad():
            for n in (2, 3, 5, 7):
                for _ in range(4):
                    compiled(torch.randn(n, 16))
        print("host line", file=sys.stderr)
        rows = fxflops.recorder().to_dict()["graphs"][0]["rows"]
        print(sum(r["kernels_profile"]["calls"] for r in rows))
    """)
    script = tmp_path / "profiled.py"
    script.write_text(code)
    quiet = procs.run([sys.executable, str(script)], timeout=600, cwd=ROOT,
                      env={k: v for k, v in os.environ.items() if k != "FXFLOPS_LOG"})
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.split()[-1] == "12"  # 3 profiled calls at each of the 4 sizes
    lines = quiet.stderr.splitlines()
    assert not [line for line in lines if line.startswith(("USDT:", "STAGE:"))]
    # nor any other Kineto line (a CUDA build without a GPU, as torch 2.14.1's leg runs,
    # logs "ERROR:<date> <pid>:<tid> DeviceProperties.cpp:56] gpuGetDeviceCount failed")
    assert not [line for line in lines
                if re.match(r"(V|VERBOSE|INFO|WARNING|ERROR|STAGE|USDT):\d{4}-\d\d-\d\d ", line)],\
        lines
    assert "host line" in lines
    assert len([line for line in lines if "fxflops" in line]) <= 3, lines
    loud = procs.run([sys.executable, str(script)], timeout=600, cwd=ROOT,
                     env={**os.environ, "FXFLOPS_LOG": "debug"})
    assert loud.returncode == 0, loud.stderr[-2000:]
    usdt = [line for line in loud.stderr.splitlines() if line.startswith("USDT:")]
    if not usdt and torch.__version__ < "2.13":  # (a TorchVersion: compares as a release)
        pytest.skip(f"torch {torch.__version__}'s Kineto prints no USDT lines: none to keep "
                    "(the quiet run above held)")
    assert len(usdt) >= 24  # a start and a stop line per profiled call
