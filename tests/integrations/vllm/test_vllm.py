"""vLLM for real (vllm-cpu 0.32.0): a tiny dummy-weight Llama/Qwen2, nothing downloaded.

Each scenario runs examples/vllm_tiny.py in a subprocess (vLLM spawns workers; each run
takes about a minute on 2 cores, most of it Inductor compiling).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from fxflops.report.merge import merge_rows
from tests import procs
from tests.helpers import HEAD_DIM, HEADS, KV_HEADS, LAYERS, dense_matmul_per_token, vllm_cache_root

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine
ROOT = Path(__file__).resolve().parents[3]
# examples/vllm_tiny.py: two prompts of 12 and 17 tokens, 8 new tokens each
PROMPTS = (12, 17)


def run_tiny(out: Path, *extra: str, env: dict | None = None) -> str:
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), *extra]
    proc = procs.run(cmd, timeout=900, cwd=ROOT,
                     env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "generated [8, 8]" in proc.stdout
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture(scope="module")
def cold(tmp_path_factory, cache_dir):
    out = tmp_path_factory.mktemp("cold")
    log = run_tiny(out, "--cache", str(cache_dir), "--dump", str(out / "vllm-dump"), env=COLD_ENV)
    return out, log


# FXFLOPS_WINDOW=0 is a bad value: the run must go on (warned once) with the default window;
# FXFLOPS_KERNELS=0: Inductor's kernels mapped (not profiled), to be found again at a warm start
COLD_ENV = {"VLLM_LOG_BATCHSIZE_INTERVAL": "0", "FXFLOPS_WINDOW": "0", "FXFLOPS_KERNELS": "0"}


def test_bad_environment_value_warns_and_the_run_goes_on(cold):
    out, log = cold
    assert "FXFLOPS_WINDOW='0' is not valid" in log and "using the default 512" in log
    (report,) = load_reports([out])
    rows = rows_by_size(report)
    assert rows and all(r["calls"] >= 1 and r["median_ms"] > 0 for r in rows.values())


def rows_by_size(report: dict) -> dict:
    (graph,) = report["graphs"]
    return {r["size"]: r for r in graph["rows"]}


def test_mode2_cold_start_rows_flops_and_attention(cold):
    out, _ = cold
    (report,) = load_reports([out])
    assert report["process"]["rank"] == 0
    (graph,) = report["graphs"]
    assert graph["uncounted"] == {}
    assert graph["runtime_ops"] == ["attention:vllm::unified_attention_with_output"]
    rows = rows_by_size(report)
    assert len(rows) >= 2  # prefill and decode sizes (the scheduler decides the batching)
    for size, r in rows.items():
        if size == 4096:  # vLLM's warm-up call at max_num_batched_tokens
            continue
        assert r["calls"] >= 1 and r["median_ms"] > 0 and r["flops"] > 0
        static_matmul = r["matmul_flops"] - r["runtime_flops"]
        assert static_matmul == size * dense_matmul_per_token()
    # attention from the real KV lengths, whatever the batching: prefill q(q+1)/2 pairs,
    # then 7 decode steps whose new token at position p sees p + 1 keys
    coeff = LAYERS * 4 * HEADS * HEAD_DIM
    pairs = sum(q * (q + 1) // 2 + sum(p + 1 for p in range(q, q + 7)) for q in PROMPTS)
    counted = sum(r["runtime_flops"] * r["calls"] for s, r in rows.items() if s != 4096)
    assert counted == pytest.approx(coeff * pairs, abs=len(rows))
    assert (out / "graphs" / f"{graph['name']}.py").exists()
    # in vLLM's per-rank debug_dump_path folder (where depyf writes in mode 3; mode 2
    # has no depyf dump of its own)
    beside = list((out / "vllm-dump").glob(f"rank_0*/fxflops/{graph['name']}.py"))
    assert beside and "# fxflops: graph" in beside[0].read_text()


def test_whole_forward_agrees_with_vllm_batchsize_log(cold):
    out, log = cold
    (report,) = load_reports([out])
    ours = {r["size"]: r for r in report["forward"]}
    lines = re.findall(r"Batchsize forward time stats \(batchsize, count, median_time\(ms\)\): "
                       r"(\[.*\])", log)
    assert lines, "vLLM logged no batch-size stats"
    theirs = {bs: (count, ms) for bs, count, ms in eval(lines[-1])}  # a list of tuples
    size = max(theirs, key=lambda bs: theirs[bs][0])  # the size vLLM saw most
    count, ms = theirs[size]
    assert ours[size]["calls"] == count
    # vLLM times the whole set_forward_context block and synchronises; we time the model
    # forward inside it: within 25% or 2 ms of each other
    assert abs(ours[size]["median_ms"] - ms) <= max(0.25 * ms, 2.0), (ours[size], ms)
    assert ours[size]["runtime_flops"] > 0 and ours[size]["flops"] > ours[size]["runtime_flops"]


def test_mode2_warm_start_loads_the_artifact_and_reports(cold, cache_dir, tmp_path):
    # the same environment as the cold run: vLLM's cache key covers some variables
    log = run_tiny(tmp_path, "--cache", str(cache_dir), env=COLD_ENV)
    # vLLM says it loaded the AOT artifact (not recompiled): a warm start went through
    # InstrumentedGraph.deserialize_compile_artifacts, with no new compile of the model
    assert "Directly load AOT compilation from path" in log
    assert "saved AOT compiled function" not in log
    (report,) = load_reports([tmp_path])
    (graph,) = report["graphs"]
    assert graph["meta"].get("loaded") is True
    rows = rows_by_size(report)
    assert len(rows) >= 2
    for size, r in rows.items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * dense_matmul_per_token()
        assert r["median_ms"] > 0
    # the kernel map came back with the artifact (nothing was compiled to capture it from):
    # the cold run's kernels, and per-kernel FLOPs adding up to each row's exactly
    (cold_report,) = load_reports([cold[0]])
    names = [k["kernel"] for k in graph["kernels"]]
    assert names and names == [k["kernel"] for k in cold_report["graphs"][0]["kernels"]]
    for r in rows.values():
        assert sum(k["flops"] for k in r["kernels"]) == r["flops"]
        assert sum(k["matmul_flops"] for k in r["kernels"]) == r["matmul_flops"]


def test_tp2_rank_reports_merge_to_tp1(cold, tmp_path):
    """Two ranks, with ``FXFLOPS=1`` around vLLM's eager backend (mode 3's name and
    Inductor are the CLI test's below; no Inductor compile in two workers here)."""
    run_tiny(tmp_path, "--tp", "2", "--backend", "eager", "--cache", str(tmp_path / "cache"),
             env={"FXFLOPS": "1"})
    reports = load_reports([tmp_path])
    assert sorted(r["process"]["rank"] for r in reports) == [0, 1]
    assert sorted(p.name.split("-rank")[1] for p in tmp_path.glob("*.json")) == \
        ["0.json", "1.json"]
    from fxflops.report.rows import flat_rows

    merged = {(r["graph"], r["size"]): r for r in merge_rows(flat_rows(reports))}
    (tp1,) = load_reports([cold[0]])
    tp1_rows = rows_by_size(tp1)
    graph_name = reports[0]["graphs"][0]["name"]
    common = [s for s in tp1_rows if (graph_name, s) in merged and s != 4096]
    assert common
    for size in common:  # static matmul FLOPs: each rank does its shard
        m = merged[(graph_name, size)]
        assert m["matmul_flops"] - m["runtime_flops"] == \
            tp1_rows[size]["matmul_flops"] - tp1_rows[size]["runtime_flops"]
    out = procs.run([sys.executable, "-m", "fxflops.cli.main", "report", str(tmp_path)])
    assert out.returncode == 0 and "all" in out.stdout
    # collectives (_C::shm_allreduce) and masks are counted as documented: nothing uncounted
    assert all(g["uncounted"] == {} for rep in reports for g in rep["graphs"])
    # one run: both ranks carry the run id their parent process set
    assert len({rep["run"]["id"] for rep in reports}) == 1
    # the one instrumentation path: device, dtype (MFU's peak) and an annotated dump
    for rep in reports:
        assert rep["process"]["device"].startswith("cpu") and rep["process"]["dtype"] == "bf16"
        for g in rep["graphs"]:
            assert (tmp_path / "graphs" / f"{g['name']}.py").exists()


def test_vllm_bench_latency_cli_flow(tmp_path):
    """`vllm bench latency -cc '{"mode": 2, "backend": "fxflops"}'`, then `fxflops report`:
    examples/vllm_latency.sh, as a user runs it."""
    out = tmp_path / "out"
    proc = procs.run(["bash", str(ROOT / "examples" / "vllm_latency.sh"), str(out)],
                     timeout=900, cwd=ROOT,
                     env={**os.environ, "VLLM_CACHE_ROOT": vllm_cache_root(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Avg latency" in proc.stdout + proc.stderr
    assert "<forward>" in proc.stdout  # the report table
    (report,) = load_reports([out])
    rows = rows_by_size(report)
    # 2 prompts of 16 tokens: prefill steps of 16 or more tokens, then 2-token decode steps
    assert any(16 <= size < 4096 for size in rows)
    for size, r in rows.items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * dense_matmul_per_token()
    assert rows[2]["calls"] >= 3 and rows[2]["runtime_flops"] > 0


def test_mode3_backend_name_on_cpu_runs_instrumented(tmp_path):
    """`vllm bench latency -cc '{"mode": 3, "backend": "fxflops"}'`: the CLI loads general
    plugins before it parses -cc, so the name shim accepts it and switches FXFLOPS=1 on; vLLM
    on CPU then turns mode 3 into mode 2 with Inductor, which is instrumented."""
    env = {k: v for k, v in os.environ.items() if k != "FXFLOPS"}
    env["VLLM_CACHE_ROOT"] = vllm_cache_root(tmp_path / "cache")
    proc = procs.run(["bash", str(ROOT / "examples" / "vllm_latency.sh"), str(tmp_path / "out"),
                     '{"mode": 3, "backend": "fxflops"}'],
                     timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (report,) = load_reports([tmp_path / "out"])
    (graph,) = report["graphs"]
    assert graph["name"].startswith("model") and graph["meta"]["inner"] != "fxflops"
    for size, r in rows_by_size(report).items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * dense_matmul_per_token()
    assert report["forward"]


def vllm_perf_model(arch: str):
    """vLLM's own analytic FLOP model (vllm/v1/metrics/perf.py) for the tiny config."""
    import tempfile

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.perf import ModelMetrics

    sys.path.insert(0, str(ROOT / "examples"))
    import vllm_tiny

    path = vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), f"fxflops-tiny-{arch}"), arch)
    cfg = EngineArgs(model=path, load_format="dummy", skip_tokenizer_init=True,
                     dtype="bfloat16", max_model_len=512).create_engine_config()
    return ModelMetrics(cfg)


def test_flops_agree_with_vllm_perf_model(cold, tmp_path):
    """Per size, the graph's matmul FLOPs (attention aside) against vLLM's perf.py count of
    the same layers (projections + MLP; the LM head runs outside the graph): within 1%.
    Attention at decode: perf.py's count equals fxflops' FLOPs per pair times the pairs."""
    from vllm.v1.metrics.perf import ExecutionContext

    (report,) = load_reports([cold[0]])
    perf = vllm_perf_model("llama")
    for size, r in rows_by_size(report).items():
        ctx = ExecutionContext()
        ctx.add(size, size, is_prefill=True)
        parts = perf.get_num_flops_breakdown(ctx)
        dense = parts["attn.qkv_proj"] + parts["attn.out_proj"] + parts["ffn.dense_ffn"]
        ours = r["matmul_flops"] - r["runtime_flops"]
        assert abs(ours - dense) <= 0.01 * dense, (size, ours, dense)
    # decode: two requests with 12 and 17 cached tokens, one new token each. fxflops' attention
    # formula on the graph's shapes (fake tensors) gives FLOPs per (query, key) pair; by hand
    # each new token sees its context and itself: 13 + 18 pairs
    import torch

    import fxflops.integrations.vllm.formulas  # noqa: F401 (registers vLLM's formulas)
    from fxflops.cost.registry import formula_for

    ctx = ExecutionContext()
    ctx.add(1, 13, is_prefill=False)
    ctx.add(1, 18, is_prefill=False)
    parts = perf.get_num_flops_breakdown(ctx)
    with torch._subclasses.FakeTensorMode():
        q, o = (torch.empty(2, HEADS * HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.empty(2, KV_HEADS * HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
        cost = formula_for("vllm::unified_attention_with_output").fn(q, k, v, o, "layer")
    assert LAYERS * cost.flops_per_pair * (13 + 18) == \
        parts["attn.attn_qk"] + parts["attn.attn_av"]
