"""Hybrid models on vllm-cpu 0.32, run for real: Qwen3-Next (Gated DeltaNet linear attention,
full attention, MoE) and Nemotron-H (a Mamba2 mixer, MLPs, attention), tiny dummy-weight
configs (examples/vllm_tiny.py), with ``FXFLOPS=1`` around mode 2, and around mode 0 (vLLM
compiles nothing: every forward counted from the ops it runs, fxflops/integrations/vllm/
uncompiled.py), each checked against the same hand formulas.

vLLM's perf.py does not model these layers, so the reference is the papers' recurrences,
written out here per token (a multiply-add is 2 FLOPs; the state products and the conv taps
are matmul-class, the decay, gates, norms and activations one vector FLOP per element):

- Mamba2 (Dao & Gu 2024): ``h <- exp(dt·A)·h + (dt·x) ⊗ B``, ``y = h·C + D·x`` per head of P
  channels and state N, after a depthwise causal conv (width W, bias) and SiLU over x, B, C;
  dt gets a bias and softplus.
- Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024): per value head, ``S <- α·S``, ``u = S·k``,
  ``S <- S + β(v - u) ⊗ k``, ``o = S·q``, with ``α = exp(g)``, ``g = -exp(A_log)·softplus(a
  + dt_bias)``, ``β = sigmoid(b)``, q and k L2-normalised (q also scaled by 1/√K), after a
  depthwise causal conv (width W, no bias) and SiLU over q, k and v.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sympy

from fxflops.report.files import load_reports
from tests import procs

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine
ROOT = Path(__file__).resolve().parents[3]
ARCHS = ("qwen3_next", "nemotron_h")


MODES = {"compiled": "2", "eager": "0"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{(arch, "compiled" or "eager"): its report}: each family in mode 2 and in mode 0
    (vLLM compiles nothing: the forwards counted from the ops they run), two runs at a
    time (a vLLM worker computes on one thread)."""
    pending = [(arch, how) for arch in ARCHS for how in MODES]
    running: list = []
    result = {}
    try:
        while pending or running:
            while pending and len(running) < 2:
                arch, how = pending.pop(0)
                out = tmp_path_factory.mktemp(f"{arch}-{how}")
                cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out),
                       "--arch", arch, "--tokens", "4", "--phases", "16", "40,40",
                       "--mode", MODES[how], "--backend", "eager", "--cache", str(out / "cache")]
                running.append((arch, how, out, procs.popen(
                    cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                    start_new_session=True, env={**os.environ, "FXFLOPS": "1"})))
            arch, how, out, proc = running.pop(0)
            stdout, stderr = procs.finish(proc)
            assert proc.returncode == 0, stdout[-2000:] + stderr[-5000:]
            assert "generated [4, 4] for prompts [40, 40]" in stdout
            (result[arch, how],) = load_reports([out])
    finally:
        for *_, proc in running:
            if proc.poll() is None:
                proc.kill()
    return result


@pytest.fixture(scope="module", params=list(MODES))
def graphs(request, runs) -> dict:
    """{arch: the run's one graph}: the compiled model's, or the uncompiled model's record
    (every hand formula below holds for both)."""
    return {arch: runs[arch, request.param]["graphs"][0] for arch in ARCHS}


def per_token(graph: dict, op: str) -> tuple[int, int]:
    """(matmul, vector) FLOPs per token of ``op``'s nodes: its roll-up is linear in the
    token count (one size symbol, or several equal at run time). An uncompiled model's
    split is its census's at one size (``meta.split_size``), in plain numbers: divided by
    it (``test_rows_scale_with_the_tokens``: no constant term)."""
    (row,) = [r for r in graph["by_op"] if r["name"] == op]
    if graph["meta"].get("eager"):
        tokens = graph["meta"]["split_size"]
        assert int(row["matmul_flops"]) % tokens == 0 and int(row["flops"]) % tokens == 0
        matmul = int(row["matmul_flops"]) // tokens
        return matmul, int(row["flops"]) // tokens - matmul

    def slope(expr: str) -> int:
        e = sympy.sympify(expr)
        return int(e.subs({s: 1 for s in e.free_symbols}) - e.subs({s: 0 for s in e.free_symbols}))

    matmul = slope(str(row["matmul_flops"]))
    return matmul, slope(str(row["flops"])) - matmul


def test_nothing_uncounted(graphs):
    for arch, graph in graphs.items():
        assert graph["uncounted"] == {}, (arch, graph["uncounted"])
        assert graph["layers"]["estimated"] == [], arch


def test_gated_deltanet_per_token_from_the_paper(graphs):
    """3 GDN layers: 2 key heads and 4 value heads of K = V = 64, conv width 4, no conv bias."""
    hk, hv, k, v, w, layers = 2, 4, 64, 64, 4, 3
    conv_channels = 2 * hk * k + hv * v  # q, k and v go through the conv
    matmul = (2 * w * conv_channels  # the conv's taps
              + hv * (2 * k * v      # u = S·k
                      + 2 * k * v    # S += δ ⊗ k (an outer product accumulated)
                      + 2 * k * v))  # o = S·q
    vector = (conv_channels          # SiLU after the conv
              + hv * 4 + hv          # g = -exp(A_log)·softplus(a + dt_bias); β = sigmoid(b)
              + hk * (3 * k + 3 * k + k)  # L2 norms of q and k, q / √K
              + hv * (k * v          # α·S
                      + 2 * v        # δ = β·(v - u)
                      + 1))          # α = exp(g)
    got = per_token(graphs["qwen3_next"], "vllm::cpu_gdn_attention_core")
    assert got == (layers * matmul, layers * vector)


def test_mamba2_per_token_from_the_paper(graphs):
    """1 Mamba2 mixer: 8 heads of P = 64, state N = 64, 1 group, conv width 4 with bias."""
    h, p, n, g, w = 8, 64, 64, 1, 4
    conv_channels = h * p + 2 * g * n  # x, B and C go through the conv
    matmul = (2 * w * conv_channels  # the conv's taps
              + h * (2 * p * n       # h += (dt·x) ⊗ B
                     + 2 * p * n))   # y = h·C
    vector = (2 * conv_channels      # conv bias, SiLU
              + 2 * h                # dt + dt_bias, softplus
              + h * (p * n           # exp(dt·A)·h
                     + p             # dt·x
                     + 2)            # dt·A, exp
              + 2 * h * p)           # + D·x
    assert per_token(graphs["nemotron_h"], "vllm::mamba_mixer2") == (matmul, vector)


def test_rows_scale_with_the_tokens(graphs):
    """Every size's static matmul FLOPs are the same per-token count times the size (the
    recurrent form: prefill and decode cost the same per token)."""
    for arch, graph in graphs.items():
        rows = [r for r in graph["rows"] if isinstance(r["size"], int)]
        assert len(rows) >= 3, arch
        per = {(r["matmul_flops"] - r["runtime_flops"]) / r["size"] for r in rows}
        assert len(per) == 1, (arch, per)


def test_uncompiled_forwards_count_what_the_compiled_ones_do(runs):
    """Mode 0 against mode 2 over the same prompts: at every size both ran, the same static
    matmul FLOPs per forward, exactly (the same ops: counted once from the graph, once from
    the ops the forward ran); every uncompiled forward row carries FLOPs; the report names
    why nothing was compiled."""
    for arch in ARCHS:
        eager, compiled = runs[arch, "eager"], runs[arch, "compiled"]
        (graph,) = eager["graphs"]
        assert "compilation mode NONE" in graph["meta"]["uncompiled"], arch
        assert not eager["uninstrumented"], arch
        got = {r["size"]: r for r in eager["forward"]}
        want = {r["size"]: r for r in compiled["forward"]}
        both = set(got) & set(want)
        assert {1, 2} <= both, (arch, sorted(got), sorted(want))  # the decodes, at least
        for size in both:
            static = got[size]["matmul_flops"] - got[size]["runtime_flops"]
            assert static == want[size]["matmul_flops"] - want[size]["runtime_flops"] > 0, \
                (arch, size)
        assert all(r["flops"] > 0 and r["matmul_flops"] > 0 for r in got.values()), arch
