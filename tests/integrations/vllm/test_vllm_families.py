"""The model families vLLM serves, run for real on vllm-cpu 0.32 and checked against vLLM's
own analytic model (vllm/v1/metrics/perf.py, ``ModelMetrics``), LM head aside (it runs
outside the compiled graph).

Each family runs on vllm-cpu's oneDNN linear, and a dense and the MLA + MoE family on SGL's
too (``SGL_FAMILIES``; tests/gemm_path_plugin forces one):
oneDNN's ``_C::onednn_mm`` and SGL's ``_C::weight_packed_linear``, which an AMX host picks for
every linear of these models (weights of at most 1 MiB). The counts must not depend on it.

One run per family (module-scoped), in two phases: one short request decoding alone (the
size-1 rows: contexts about 17-19), then two long ones decoding together (the size-2 rows:
contexts about 161-163, 8x longer and past the 64-token sliding windows):

- dense (Qwen2, GQA), mixture of experts (Mixtral; DeepSeek-V2's routed + shared experts),
  one sliding window for all layers (Mistral), alternating local/global layers (Gemma 2),
  MLA (DeepSeek-V2, with DeepSeek's real latent sizes);
- decode: matmul FLOPs (the graph's static count + attention counted at run time) within 1%
  of perf.py's, and bytes_io (weights the step reads + the KV cache attention reads) within
  10% of perf.py's read bytes;
- prefill: everything but attention within 1% of perf.py's; attention equals perf.py's
  per-pair rate times the causal pairs (perf.py counts prefill attention non-causally).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from tests import procs
from tests.helpers import perf_model

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine
ROOT = Path(__file__).resolve().parents[3]
SHORT, LONG, TOKENS = 16, 160, 4  # prompt lengths; tokens generated per request


# vllm-cpu's two kernels for a bf16 linear, and the op each puts in the graph
GEMM_PATHS = {"onednn": "_C::onednn_mm", "sgl": "_C::weight_packed_linear"}
PLUGIN = ROOT / "tests" / "gemm_path_plugin"


def start_family(out: Path, arch: str, path: str) -> subprocess.Popen:
    # FXFLOPS=1 around vLLM's mode 2 with the eager backend: the same Dynamo graph and the
    # same instrumentation as backend "fxflops" (tests/integrations/vllm/test_vllm.py runs that, Inductor
    # inside), without an Inductor compile per family
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--arch", arch,
           "--tokens", str(TOKENS), "--phases", str(SHORT), f"{LONG},{LONG}",
           "--cache", str(out / "cache"), "--backend", "eager",
           # vLLM's own estimate of each step, and its counters of it at the end
           "--mfu-metrics", "--print-metrics"]
    pythonpath = os.pathsep.join(p for p in (str(PLUGIN), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "FXFLOPS": "1", "TEST_CPU_GEMM_PATH": path,
           "PYTHONPATH": pythonpath}
    return procs.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env, start_new_session=True)


class Runs(dict):
    """{(arch, kernel path): the run's graph}; ``engine[key]``: (the report's ``engine``
    section, vLLM's own counters printed at the end of the run)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: dict[tuple[str, str], tuple[dict, dict]] = {}


def finish_family(proc: subprocess.Popen, out: Path) -> tuple[dict, dict, dict]:
    stdout, stderr = procs.finish(proc)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
    assert f"generated [{TOKENS}, {TOKENS}] for prompts [{LONG}, {LONG}]" in stdout
    (report,) = load_reports([out])
    (graph,) = report["graphs"]
    (line,) = [x for x in stdout.splitlines() if x.startswith("vllm-metrics ")]
    return graph, report.get("engine") or {}, json.loads(line.split(" ", 1)[1])


def perf_step(perf, requests: list[tuple[int, int, bool]]) -> tuple[float, float]:
    """perf.py's (FLOPs, read bytes) of one step, LM head aside."""
    from vllm.v1.metrics.perf import ExecutionContext

    ctx = ExecutionContext()
    for tokens, context, prefill in requests:
        ctx.add(tokens, context, prefill)
    flops = perf.get_num_flops_breakdown(ctx)
    read = perf.get_read_bytes_breakdown(ctx)

    def body(parts: dict) -> float:
        return sum(v for k, v in parts.items() if not k.startswith("unembed"))

    return body(flops), body(read)


def decode_steps(graph: dict) -> dict[int, list[list[int]]]:
    """The decode steps of the run, by size: each a list of the requests' context lengths.

    Decode step j of a request with prompt P reads a context of P + j tokens. The engine
    runs in its own process and may prefill the two long requests in two steps (the second
    beside the first one's first decode): then they decode together one step fewer, a
    token apart, and the second decodes its last token alone. Which happened is read from
    the run: the size-1 row's number of calls.
    """
    short = [[SHORT + j] for j in range(1, TOKENS)]
    split = rows(graph)[1]["calls"] == len(short) + 1
    if not split:
        return {1: short, 2: [[LONG + j, LONG + j] for j in range(1, TOKENS)]}
    together = [[LONG + j + 1, LONG + j] for j in range(1, TOKENS - 1)]
    return {1: short + [[LONG + TOKENS - 1]], 2: together}


def perf_decode(perf, steps: list[list[int]]) -> tuple[float, float]:
    """perf.py's mean (FLOPs, read bytes) over decode steps (each: the contexts decoded)."""
    per_step = [perf_step(perf, [(1, c, False) for c in contexts]) for contexts in steps]
    n = len(per_step)
    return sum(f for f, _ in per_step) / n, sum(b for _, b in per_step) / n


FAMILIES = ["qwen2", "mixtral", "mistral", "gemma2", "deepseek_v2"]
# every family on oneDNN's linear; SGL's (hosts with AVX-512 BF16 or AMX only) on a dense
# family and on the MLA + MoE one: its one formula counts every linear of every family
# alike, and three more engine runs would cost the suite about two minutes
SGL_FAMILIES = ["qwen2", "deepseek_v2"]
RUNS = [(arch, "onednn") for arch in FAMILIES] + [(arch, "sgl") for arch in SGL_FAMILIES]


def host_runs_sgl() -> bool:
    """SGL's bf16 kernel needs AVX-512 BF16 (or AMX): every host of this kind has it."""
    import torch

    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every run of ``RUNS``, two at a time: a vLLM worker computes on one
    thread, so two runs share this 2-core machine at little cost to each."""
    pending = [(arch, path, tmp_path_factory.mktemp(f"{arch}-{path}")) for arch, path in RUNS
               if path != "sgl" or host_runs_sgl()]
    running: list[tuple[str, str, Path, subprocess.Popen]] = []
    graphs = Runs()
    try:
        while pending or running:
            while pending and len(running) < 2:
                arch, path, out = pending.pop(0)
                running.append((arch, path, out, start_family(out, arch, path)))
            arch, path, out, proc = running.pop(0)
            graph, engine, metrics = finish_family(proc, out)
            graphs[arch, path] = graph
            graphs.engine[arch, path] = engine, metrics
    finally:
        for *_, proc in running:
            proc.kill()
    return graphs


@pytest.fixture(scope="module", params=RUNS, ids=[f"{a}-{p}" for a, p in RUNS])
def family(request, runs):
    arch, path = request.param
    if (arch, path) not in runs:
        pytest.skip("this host cannot run SGL's kernel (no AVX-512 BF16, no AMX)")
    return arch, runs[arch, path], perf_model(arch)


# where vLLM cannot make a oneDNN linear (bf16 oneDNN needs AVX-512), it falls back to
# torch's own (``dispatch_cpu_unquantized_gemm``)
TORCH_LINEAR = "torch._C._nn.linear"


def onednn_linear_on_this_host() -> bool:
    """Whether vLLM's oneDNN bf16 linear can be made on this host, asked as vLLM asks it
    (``create_onednn_mm``, which raises where oneDNN has no bf16 matmul: an AVX2 CPU)."""
    import torch
    import vllm._custom_ops as ops

    try:
        ops.create_onednn_mm(torch.randn(64, 64, dtype=torch.bfloat16).t(), 32)
    except RuntimeError:
        return False
    return True


def test_the_forced_linear_kernel_ran(family, request):
    """The graph's linears went through the kernel the run forced, and nothing else; the
    oneDNN path is torch's own linear on a host where vLLM cannot make a oneDNN one (the
    assertion says which ran)."""
    arch, graph, _ = family
    path = request.node.callspec.params["family"][1]
    expected = GEMM_PATHS[path]
    if path == "onednn" and not onednn_linear_on_this_host():
        expected = TORCH_LINEAR
    ops = {r["name"] for r in graph["by_op"]}
    assert expected in ops, (arch, path, expected, sorted(ops))
    others = (set(GEMM_PATHS.values()) | {TORCH_LINEAR}) - {expected}
    assert not ops & others, (arch, path, expected, sorted(ops))


def rows(graph: dict) -> dict:
    return {r["size"]: r for r in graph["rows"]}


def test_nothing_is_uncounted_or_estimated(family):
    arch, graph, _ = family
    assert graph["uncounted"] == {}, (arch, graph["uncounted"])
    # every layer checked against its own sizes, none short of them
    assert graph["layers"]["checked"] >= 4 and graph["layers"]["estimated"] == [], arch
    assert graph["runtime_ops"], arch  # attention (or MLA) counted at run time


@pytest.mark.parametrize("size", [1, 2])
def test_decode_flops_and_bytes_agree_with_vllm_perf_model(family, size):
    arch, graph, perf = family
    row = rows(graph)[size]
    steps = decode_steps(graph)[size]
    assert row["calls"] == len(steps)
    flops, read = perf_decode(perf, steps)
    assert row["matmul_flops"] == pytest.approx(flops, rel=0.01), (arch, size)
    assert row["bytes_io"] == pytest.approx(read, rel=0.10), (arch, size)


@pytest.mark.parametrize("path", list(GEMM_PATHS))
def test_dense_static_flops_per_size_by_hand(runs, path):
    """Qwen2 (GQA with one KV head): every row's static matmul FLOPs, by hand: QKV, O,
    gate_up and down projections of 2 layers, 2 FLOPs a multiply-add."""
    if ("qwen2", path) not in runs:
        pytest.skip("this host cannot run SGL's kernel")
    graph = runs["qwen2", path]
    hidden, inter, heads, kv_heads, head_dim, layers = 256, 768, 4, 1, 64, 2
    per_token = layers * 2 * (hidden * (heads + 2 * kv_heads) * head_dim
                              + heads * head_dim * hidden + 3 * hidden * inter)
    for size, r in rows(graph).items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * per_token, size


def test_kv_cache_bytes_follow_the_context(family):
    """The KV-cache bytes per request grow with the context as the layers' windows allow:
    by hand, per layer K+V of every context token, capped at a windowed layer's window."""
    arch, graph, _ = family
    per_token = {  # per layer: K and V (MLA: the latent entry), bf16; window or None
        "qwen2": [(2 * 64 * 2 * 1, None)] * 2,
        "mixtral": [(2 * 64 * 2 * 2, None)] * 2,
        "mistral": [(2 * 64 * 2 * 2, 64)] * 2,
        "gemma2": [(2 * 64 * 2 * 2, 64), (2 * 64 * 2 * 2, None)],
        "deepseek_v2": [((512 + 64) * 2, None)] * 2,
    }[arch]
    for size, steps in decode_steps(graph).items():
        expected = sum(b * min(c, w or c) for contexts in steps for c in contexts
                       for b, w in per_token) / len(steps)
        assert rows(graph)[size]["runtime_bytes"] == int(expected), (arch, size)


def test_prefill_agrees_with_vllm_perf_model_after_the_causal_adjustment(family):
    arch, graph, perf = family
    row = rows(graph)[SHORT]
    from vllm.v1.metrics.perf import ExecutionContext

    ctx = ExecutionContext()
    ctx.add(SHORT, SHORT, True)
    parts = perf.get_num_flops_breakdown(ctx)
    attention = sum(v for k, v in parts.items() if k.endswith(("attn_qk", "attn_av")))
    rest = sum(v for k, v in parts.items()
               if not k.startswith("unembed") and not k.endswith(("attn_qk", "attn_av")))
    static = row["matmul_flops"] - row["runtime_flops"]
    assert static == pytest.approx(rest, rel=0.01), arch
    # perf.py: every query against the whole context, SHORT x SHORT pairs; causal: fewer
    causal = attention * (SHORT * (SHORT + 1) // 2) / (SHORT * SHORT)
    assert row["runtime_flops"] == pytest.approx(causal, rel=1e-6), arch


def test_vllms_own_estimate_is_read_step_for_step(family, runs, request):
    """With ``--enable-mfu-metrics`` the worker evaluates vLLM's ``ModelMetrics`` on each step
    it runs: its FLOPs and written bytes add up to vLLM's own counters exactly (the
    scheduler's, exported by another process). vLLM's read-bytes counter also counts steps
    that scheduled no token (every weight read, nothing computed): it may exceed the
    workers' by whole such steps, and by nothing else."""
    from vllm.v1.metrics.perf import ExecutionContext

    arch, _, perf = family
    engine, counters = runs.engine[request.node.callspec.params["family"]]
    estimate = engine["estimate"]
    assert sum(r["flops"] for r in estimate) == counters["vllm:estimated_flops_per_gpu"], arch
    assert sum(r["write_bytes"] for r in estimate) == \
        counters["vllm:estimated_write_bytes_per_gpu"], arch
    empty_step = perf.get_read_bytes(ExecutionContext())
    extra = counters["vllm:estimated_read_bytes_per_gpu"] - sum(r["read_bytes"] for r in estimate)
    assert empty_step > 0 and extra >= 0 and extra % empty_step == 0, (arch, extra, empty_step)


def test_decode_agrees_with_vllms_estimate_and_the_lm_head_is_named(family, runs, request):
    """The report's comparison: at every decode size, measured graph FLOPs within 1% of
    vLLM's estimate with the LM head aside, the LM head named as the difference (it runs
    outside the compiled graph)."""
    arch, _, _ = family
    engine, _ = runs.engine[request.node.callspec.params["family"]]
    by_size = {r["size"]: r for r in engine["estimate_vs_measured"]}
    for size in (1, 2):
        row = by_size[size]
        assert row["steps"] == row["estimate_steps"], (arch, size)
        assert row["ratio"] == pytest.approx(1, rel=0.01), (arch, size, row)
        named = {d["component"] for d in row["differs"]}
        assert "lm_head" in named and "attention" not in named, (arch, size, row["differs"])
