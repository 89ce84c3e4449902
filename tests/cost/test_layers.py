"""The layer safety net (fxflops/cost/layer_check.py, its layers from the backend's layer
sources in fxflops/instrument/plan.py): a layer whose ops no formula counts right is
counted from its own sizes, and says so, instead of collapsing to zero.

The unknown kernel is a real custom op registered here (``fxflops_test::mystery_gemm``, an
out-variant GEMM like the kernels vLLM picks per machine) that fxflops has no formula for.
"""

from __future__ import annotations

import pytest
import torch

import fxflops
from fxflops.cost import layer_check as layers
from fxflops.instrument import plan

_LIB = torch.library.Library("fxflops_test", "DEF")
_LIB.define("mystery_gemm(Tensor(a!) out, Tensor x, Tensor w) -> ()")


def _mystery_gemm(out, x, w):
    out.copy_(x @ w.t())


_LIB.impl("mystery_gemm", _mystery_gemm, "CPU")


@torch.library.register_fake("fxflops_test::mystery_gemm")
def _mystery_gemm_fake(out, x, w):
    return None


def mystery_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype)
    torch.ops.fxflops_test.mystery_gemm(out, x, weight)
    return out


class MysteryLinear(torch.nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, k), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mystery_linear(x, self.weight)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = MysteryLinear(32, 64)
        self.down = torch.nn.Linear(64, 32, bias=False)  # counted by torch's own formula

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


@pytest.fixture
def block_layers():
    specs = {"up": layers.LayerSpec("linear", layers.type_name(MysteryLinear), in_features=32,
                                    out_features=64),
             "down": layers.LayerSpec("linear", layers.type_name(torch.nn.Linear),
                                      in_features=64, out_features=32)}

    def source(gm, example_inputs):
        return [specs]

    plan.register_layer_source(source)
    yield specs
    plan.unregister_layer_source(source)


def test_an_unknown_gemm_is_counted_from_its_layer(block_layers, fxflops_log):
    compiled = torch.compile(Block(), backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        for m in (5, 9):
            x = torch.randn(m, 32)
            torch._dynamo.mark_dynamic(x, 0)  # one graph for every number of tokens
            compiled(x)
    (graph,) = fxflops.recorder().graphs
    cost = graph.cost
    assert cost.layers_checked == 2  # both layers checked; only the unknown one estimated
    (estimate,) = cost.estimated
    assert (estimate.layer, estimate.ops) == ("up", ("fxflops_test::mystery_gemm",))
    assert cost.uncounted == {}  # counted, from the layer, not silently zero
    for row in fxflops.recorder().stats():
        m = row["key"][0]
        assert row["matmul_flops"] == 2 * m * 32 * 64 + 2 * m * 64 * 32  # by hand
    assert any("up" in r.getMessage() and "mystery_gemm" in r.getMessage()
               for r in fxflops_log.records)


def test_a_layer_its_formulas_count_is_left_as_counted(block_layers):
    """``down`` (aten.mm, exact) is checked and not touched; without a source, nothing is."""
    compiled = torch.compile(Block().down, backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    (graph,) = fxflops.recorder().graphs
    assert graph.cost.estimated == [] and graph.cost.layers_checked == 0  # a bare Linear:
    # its path is "" (the compiled module itself), which no spec names


def test_without_a_layer_source_the_unknown_op_is_uncounted():
    compiled = torch.compile(Block(), backend=fxflops.backend(inner="eager"))
    with torch.no_grad():
        compiled(torch.randn(3, 32))
    (graph,) = fxflops.recorder().graphs
    assert graph.cost.uncounted == {"fxflops_test::mystery_gemm": 1}
    assert graph.cost.estimated == []


@pytest.mark.vllm
def test_a_vllm_linear_on_an_unknown_kernel_is_named_in_report_cli_and_metrics(tmp_path):
    """vLLM's real ReplicatedLinear dispatching to an unknown GEMM (tests/vllm_unknown_gemm.py,
    its own process): its FLOPs are 2·M·K·N by hand, and the report JSON, ``fxflops
    report`` and the Prometheus series all name the layer and the op."""
    import json
    import sys

    from tests import procs

    pytest.importorskip("vllm")
    report = tmp_path / "r.json"
    proc = procs.run([sys.executable, "-m", "tests.vllm_unknown_gemm", str(report)],
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    series = json.loads(proc.stdout.strip().splitlines()[-1])
    data = json.loads(report.read_text())
    (graph,) = data["graphs"]
    (estimate,) = graph["layers"]["estimated"]
    assert estimate["layer"] == "up" and estimate["ops"] == ["fxflops_test::vendor_gemm"]
    assert graph["uncounted"] == {}
    rows = {r["size"]: r for r in graph["rows"]}
    assert {m: rows[m]["matmul_flops"] for m in (5, 9)} == {5: 2 * 5 * 32 * 64,
                                                             9: 2 * 9 * 32 * 64}
    (layers,) = [s for s in series if s["family"] == "fxflops_graph_estimated_layers"]
    assert dict(layers["labels"])["op"] == "fxflops_test::vendor_gemm" and layers["value"] == 1
    estimated = {dict(s["labels"])["size"]: s["value"] for s in series
                 if s["family"] == "fxflops_graph_estimated_flops"}
    assert estimated == {"5": 2 * 5 * 32 * 64, "9": 2 * 2 * 9 * 32 * 64}  # x calls
    cli = procs.run([sys.executable, "-m", "fxflops", "report", str(report)], timeout=300)
    assert cli.returncode == 0, cli.stderr
    (line,) = [ln for ln in cli.stdout.splitlines() if "vendor_gemm" in ln]
    assert "up" in line, line
