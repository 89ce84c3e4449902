"""Cost analysis: exact against FlopCounterMode on real models, symbolic == concrete."""

from __future__ import annotations

import logging
import types

import pytest
import sympy
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

import fxflops
from fxflops.cost.graph_cost import GraphCost
from tests import models
from tests.helpers import torch_lacks


def fcm_flops(model, x) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def fxflops_matmul(model, x, dynamic: bool, compiled=None):
    """matmul FLOPs fxflops records for one call (summed over graphs if Dynamo breaks)."""
    rec = fxflops.recorder()
    if compiled is None:
        compiled = torch.compile(model, backend=fxflops.backend(inner="eager"), dynamic=dynamic)
    before = {(g.id, k): r.count for g in rec.graphs for k, r in g.rows.items()}
    with torch.no_grad():
        compiled(x)
    moved = [(g, r) for g in rec.graphs for k, r in g.rows.items()
             if r.count != before.get((g.id, k), 0)]
    assert moved, "no instrumented graph ran"
    return sum(r.cost.matmul_flops for _, r in moved), [g for g, _ in moved], compiled


def missed_by_torch(name: str, model, b: int, s: int) -> int:
    """Matmul FLOPs of ops the installed torch's registry misses, by their documented
    formulas (each only where torch lacks it: torch 2.15 counts CPU SDPA itself).

    CPU SDPA (aten._scaled_dot_product_flash_attention_for_cpu): QK^T and PV,
    2 * 2 * B * H * S * S * D per layer. MoE experts (transformers::grouped_mm_fallback):
    every routed token through gate_up (K -> 2I) and down (I -> K).
    """
    cfg = model.config
    hidden = cfg.hidden_size
    layers = cfg.num_hidden_layers
    sdpa = 0
    if torch_lacks("aten::_scaled_dot_product_flash_attention_for_cpu"):
        sdpa = layers * 2 * (2 * b * s * s * hidden)
    experts = 0
    if name == "mixtral" and torch_lacks("transformers::grouped_mm_fallback"):
        rows = b * s * cfg.num_experts_per_tok
        i = cfg.intermediate_size
        experts = layers * (2 * rows * hidden * 2 * i + 2 * rows * i * hidden)
    return sdpa + experts


SIZES = [(1, 8), (2, 16), (3, 32)]


@pytest.mark.parametrize("name", sorted(models.TRANSFORMERS))
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_matmul_flops_equal_flop_counter_mode(name, dynamic):
    torch.manual_seed(0)
    model = models.TRANSFORMERS[name]()
    compiled = None
    for b, s in SIZES:
        if not dynamic:
            torch._dynamo.reset()
            compiled = None
        x = torch.randint(0, 128, (b, s))
        got, graphs, compiled = fxflops_matmul(model, x, dynamic, compiled)
        expected = fcm_flops(model, x) + missed_by_torch(name, model, b, s)
        assert got == expected, (name, b, s)
        for g in graphs:
            assert g.cost.uncounted == {}, g.cost.uncounted
            if dynamic and (b, s) != SIZES[0]:
                assert g.cost.symbols, "the dynamic compile should be symbolic"


def test_cpu_sdpa_difference_is_exactly_its_formula():
    """Where torch's registry lacks CPU SDPA, FlopCounterMode counts it 0 and fxflops counts
    torch's SDPA formula; where it has it (2.15), both count it the same."""
    from torch.utils.flop_counter import sdpa_flop_count

    q = torch.randn(2, 4, 16, 8)
    k = v = torch.randn(2, 4, 16, 8)

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    lacks = torch_lacks("aten::_scaled_dot_product_flash_attention_for_cpu")
    assert fcm_flops(lambda x: f(*x), (q, k, v)) == (0 if lacks else sdpa_flop_count(
        q.shape, k.shape, v.shape))
    gm = torch.fx.symbolic_trace(f)
    cost = fxflops.analyze(gm, (q, k, v))
    assert cost.matmul_flops == sdpa_flop_count(q.shape, k.shape, v.shape) == 2 * 2 * 2 * 4 * 16 * 16 * 8
    (node,) = [n for n in cost.nodes if n.matmul_flops]
    assert node.op.endswith("scaled_dot_product_attention")


SDPA_OPS = ["efficient_attention", "flash_attention", "cudnn_attention",
            "flash_attention_for_cpu"]


@pytest.mark.parametrize("kind", SDPA_OPS)
def test_grouped_query_attention_counts_the_kv_heads_broadcast_on_any_torch(kind):
    """GQA (8 query heads, 2 key/value heads): every SDPA op's formula counts the key's and
    value's heads broadcast to the query's, as the kernels run it and torch >= 2.13 counts it
    (torch 2.11, the GPU machine's, asserts equal heads), forward and backward, by hand."""
    import fxflops.cost.formulas  # noqa: F401 (registers the built-in formulas)
    from fxflops.cost.registry import FORMULAS

    b, hq, hkv, sq, sk, d = 2, 8, 2, 5, 7, 16
    q, kv = (b, hq, sq, d), (b, hkv, sk, d)
    matmul = 2 * b * hq * sq * sk * d  # one [sq, d] x [d, sk] product per query head
    forward = FORMULAS[f"aten::_scaled_dot_product_{kind}"].fn
    backward = FORMULAS[f"aten::_scaled_dot_product_{kind}_backward"].fn
    assert forward(q, kv, kv, out_val=None) == 2 * matmul
    assert backward(q, q, kv, kv, out_val=None) == 5 * matmul
    # equal heads, and heads that do not divide the query's, as torch's formula has them
    assert forward(q, (b, hq, sk, d), (b, hq, sk, d), out_val=None) == 2 * matmul
    with pytest.raises(AssertionError):
        forward(q, (b, 3, sk, d), (b, 3, sk, d), out_val=None)


@pytest.mark.parametrize("kind", SDPA_OPS)
def test_grouped_query_attention_counts_from_tensors_as_the_analysis_passes_them(kind):
    """The analysis hands a formula the op's tensors (meta ones here: any device's op),
    not their shapes: GQA is counted from them the same way, forward and backward."""
    import fxflops.cost.formulas  # noqa: F401 (registers the built-in formulas)
    from fxflops.cost.registry import FORMULAS

    b, hq, hkv, sq, sk, d = 2, 8, 2, 5, 7, 16
    q = torch.empty(b, hq, sq, d, device="meta")
    kv = torch.empty(b, hkv, sk, d, device="meta")
    matmul = 2 * b * hq * sq * sk * d
    forward = FORMULAS[f"aten::_scaled_dot_product_{kind}"].fn
    backward = FORMULAS[f"aten::_scaled_dot_product_{kind}_backward"].fn
    assert forward(q, kv, kv, out_val=None) == 2 * matmul
    assert backward(q, q, kv, kv, out_val=None) == 5 * matmul


def test_gqa_sdpa_through_analysis_equals_the_hand_count():
    """A traced GQA attention (``enable_gqa``) costs its hand count on this torch's CPU op."""
    b, hq, hkv, s, d = 1, 8, 2, 9, 16
    q = torch.randn(b, hq, s, d)
    k = v = torch.randn(b, hkv, s, d)

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    cost = fxflops.analyze(torch.fx.symbolic_trace(f), (q, k, v))
    assert cost.uncounted == {}
    assert cost.matmul_flops == 2 * (2 * b * hq * s * s * d)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_cnn_matches_flop_counter_mode(dynamic):
    model = models.cnn()
    compiled = None
    for b, hw in [(1, 16), (2, 32), (4, 24)]:
        if not dynamic:
            torch._dynamo.reset()
            compiled = None
        x = torch.randn(b, 3, hw, hw)
        got, graphs, compiled = fxflops_matmul(model, x, dynamic, compiled)
        assert got == fcm_flops(model, x)
        assert all(g.cost.uncounted == {} for g in graphs)


def test_aten_graph_matches_dynamo_graph():
    """The same model seen after AOTAutograd (aten ops) costs the same matmul FLOPs."""
    from torch._functorch.aot_autograd import aot_module_simplified

    model = models.llama()
    x = torch.randint(0, 128, (2, 16))
    seen: dict[str, GraphCost] = {}

    def aten_backend(gm, example_inputs):
        def fw(g, ex):
            seen["aten"] = fxflops.analyze(g, ex)
            return g.forward

        seen["dynamo"] = fxflops.analyze(gm)
        return aot_module_simplified(gm, example_inputs, fw_compiler=fw)

    with torch.no_grad():
        torch.compile(model, backend=aten_backend)(x)
    assert seen["aten"].matmul_flops == seen["dynamo"].matmul_flops == (
        fcm_flops(model, x) + missed_by_torch("llama", model, 2, 16))
    assert seen["aten"].uncounted == {}
    ops = {n.op for n in seen["aten"].nodes}
    assert any(op.startswith("aten::") for op in ops)


def test_graph_without_metadata_uses_example_inputs():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(5, 32)
    cost = fxflops.analyze(gm, [x])
    assert cost.matmul_flops == fcm_flops(model, x) == 2 * 5 * (32 * 64 + 64 * 8)
    assert cost.flops == cost.matmul_flops + 5 * 64  # ReLU: one FLOP an element
    assert cost.bytes_io == (5 * 32 + 5 * 8) * 4
    for node in gm.graph.nodes:
        if node.op == "call_module":
            assert node.meta["fxflops"].flops > 0


def test_node_meta_and_rollups():
    model = models.llama()
    captured = {}

    def be(gm, ex):
        captured["cost"] = fxflops.analyze(gm)
        captured["gm"] = gm
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=be)(torch.randint(0, 128, (2, 8)))
    cost, gm = captured["cost"], captured["gm"]
    metas = [n.meta["fxflops"] for n in gm.graph.nodes if "fxflops" in n.meta]
    assert sum(m.flops for m in metas) == cost.flops
    q_proj = [m for m in metas if m.module.endswith("layers.0.self_attn.q_proj")]
    assert q_proj and q_proj[0].matmul_flops == 2 * 16 * 64 * 64
    by_module = cost.by_module(depth=3)
    assert "model.layers.0" in by_module and "model.layers.1" in by_module
    assert by_module["model.layers.0"].flops == by_module["model.layers.1"].flops
    assert sum(r.flops for r in cost.by_op().values()) == cost.flops
    assert cost.bytes_nodes >= cost.bytes_io > 0


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])
@given(b=st.integers(2, 6), s=st.integers(2, 40))
def test_symbolic_count_at_n_equals_concrete_count(b, s):
    from fxflops.cli.demo_model import DemoConfig, DemoDecoder

    model = DemoDecoder(DemoConfig(layers=1, vocab=64, hidden=64, heads=4, kv_heads=2,
                                   intermediate=96)).eval()
    costs = []

    def be(gm, ex):
        costs.append(fxflops.analyze(gm))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=be, dynamic=True)(torch.randint(0, 64, (3, 7)))
    symbolic = costs[-1]
    assert len(symbolic.symbols) == 2
    torch._dynamo.reset()
    torch.compile(model, backend=be, dynamic=False)(torch.randint(0, 64, (b, s)))
    concrete = costs[-1]
    assert not concrete.symbols
    batch, seq = symbolic.symbols  # in input order: input_ids is [batch, seq]
    at = symbolic.at({batch: b, seq: s})
    assert at.flops == concrete.flops
    assert at.matmul_flops == concrete.matmul_flops
    # bytes may differ by the scalars (norm eps) a dynamic graph takes as 0-d tensor inputs
    assert 0 <= at.bytes_io - concrete.bytes_io <= 8 * 4


def test_at_binds_all_or_by_name():
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    cost = GraphCost(flops=2 * s0 * s1 + 3, matmul_flops=2 * s0 * s1, bytes_io=4 * s0,
                     bytes_nodes=8 * s0, symbols=(s0, s1), nodes=[], uncounted={})
    assert cost.at(3) == (21, 18, 12, 24, 0, 0, 0)  # nothing recomputed nor estimated
    assert cost.at({"s0": 2, "s1": 5}).flops == 23
    assert cost.at({s0: 2, s1: 5}).matmul_flops == 20
    assert isinstance(cost.at(3).flops, int)
    with pytest.raises(KeyError):
        cost.at({"s0": 1})


def test_unknown_op_raising_formula_and_missing_metadata_are_listed(fxflops_log):
    lib = torch.library.Library("fxflops_test", "FRAGMENT")
    lib.define("mystery(Tensor x) -> Tensor")
    lib.impl("mystery", lambda x: x * 2, "CompositeExplicitAutograd")
    lib.impl("mystery", lambda x: torch.empty_like(x), "Meta")
    lib.define("fragile(Tensor x) -> Tensor")
    lib.impl("fragile", lambda x: x + 1, "CompositeExplicitAutograd")
    lib.impl("fragile", lambda x: torch.empty_like(x), "Meta")

    @fxflops.register_formula("fxflops_test::fragile")
    def fragile_flop(x_shape, out_shape=None, **kwargs):
        raise RuntimeError("this formula is broken")

    def f(x):
        return torch.ops.fxflops_test.fragile(torch.ops.fxflops_test.mystery(x)).sin() @ x.T

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 4)
    cost = fxflops.analyze(gm, [x])
    assert cost.uncounted == {"fxflops_test::mystery": 1, "fxflops_test::fragile": 1}
    assert cost.matmul_flops == 2 * 4 * 4 * 4  # the rest is still counted
    # a node whose metadata is gone
    sin = next(n for n in gm.graph.nodes if n.name == "sin")
    del sin.meta["val"]
    cost = fxflops.analyze(gm)
    # the node without metadata, and the matmul that reads its (missing) value
    assert cost.uncounted["method.sin"] == 1 and cost.uncounted["_operator.matmul"] == 1
    messages = [r.getMessage() for r in fxflops_log.records]
    assert any("no FLOP formula for fxflops_test::mystery" in m for m in messages)
    assert any("this formula is broken" in m for m in messages)
    assert any("no shape metadata" in m for m in messages)
    # each warning once, however often the graph is analysed
    fxflops.analyze(gm)
    assert len([m for m in (r.getMessage() for r in fxflops_log.records)
                if "fxflops_test::mystery" in m]) == 1


def test_views_are_free_not_uncounted():
    def f(x):
        return x.view(2, 8).transpose(0, 1)[3:].unsqueeze(0)

    cost = fxflops.analyze(torch.fx.symbolic_trace(f), [torch.randn(16)])
    assert cost.flops == 0 and cost.uncounted == {} and cost.bytes_nodes == 0

    # reshape of a transposed tensor copies: bytes, still no FLOPs
    cost = fxflops.analyze(torch.fx.symbolic_trace(lambda x: x.view(2, 8).t().reshape(16)),
                           [torch.randn(16)])
    assert cost.flops == 0 and cost.uncounted == {} and cost.bytes_nodes == 2 * 16 * 4


def test_register_formula_overrides_and_is_used_by_analysis():
    lib = torch.library.Library("fxflops_test2", "FRAGMENT")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda x: x * 3, "CompositeExplicitAutograd")
    lib.impl("scale", lambda x: torch.empty_like(x), "Meta")

    @fxflops.register_formula(torch.ops.fxflops_test2.scale, kind="matmul")
    def scale_flop(x_shape, out_shape=None, **kwargs):
        return 10 * x_shape[0]

    cost = fxflops.analyze(torch.fx.symbolic_trace(lambda x: torch.ops.fxflops_test2.scale(x)),
                           [torch.randn(7)])
    assert cost.flops == cost.matmul_flops == 70


def test_analysis_logs_nothing_for_supported_models(caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    test_node_meta_and_rollups()
    assert not [r for r in caplog.records if r.name == "fxflops"]


def test_a_second_registration_of_an_op_fails_unless_it_says_override():
    """As torch's flop-counter registry: an op registered twice is refused, naming it; a
    user replaces a built-in formula on purpose with ``override=True``."""
    import fxflops.integrations.vllm.formulas  # noqa: F401 (registers _C::onednn_mm's)
    from fxflops.cost.registry import FORMULAS, IO_BYTES, DuplicateRegistration

    original = FORMULAS["_C::onednn_mm"]
    with pytest.raises(DuplicateRegistration, match="_C::onednn_mm"):
        fxflops.register_formula("_C::onednn_mm", kind="matmul")(lambda *a, **k: 0)
    assert FORMULAS["_C::onednn_mm"] is original
    try:
        fxflops.register_formula("_C::onednn_mm", kind="matmul", override=True)(
            lambda *a, **k: 7)
        assert FORMULAS["_C::onednn_mm"] is not original
    finally:
        FORMULAS["_C::onednn_mm"] = original
    with pytest.raises(DuplicateRegistration, match="aten::embedding"):
        fxflops.register_io_bytes(["aten::embedding"])(lambda *a, **k: 0)
    assert "aten::embedding" in IO_BYTES


def test_a_pybind11_function_is_named_by_its_own_name_on_any_pybind11():
    """torch 2.11's pybind11 prefixes a free function's ``__qualname__`` with its function
    record's type (``pybind11_detail_function_record_v1_....``): the op is still named
    ``torch._C._log_api_usage_once`` (zero FLOPs, known), as torch 2.13's pybind11 names it.
    A stand-in with 2.11's attributes (this torch's own function is checked too)."""
    import fxflops.cost.formulas  # noqa: F401 (registers the built-in formulas)
    from fxflops.cost.registry import ZERO_FLOP_OPS, op_name

    record = type("pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx", (),
                  {"__module__": "pybind11_builtins"})

    # what torch 2.11's torch._C._log_api_usage_once carries
    free = types.SimpleNamespace(__module__="torch._C", __name__="_log_api_usage_once",
                                 __qualname__=f"{record.__name__}._log_api_usage_once",
                                 __self__=record())
    assert op_name(free) == op_name(torch._C._log_api_usage_once) == \
        "torch._C._log_api_usage_once"
    assert "torch._C._log_api_usage_once" in ZERO_FLOP_OPS
