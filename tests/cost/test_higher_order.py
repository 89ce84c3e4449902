"""Higher-order ops (fxflops/cost/higher_order.py): what the subgraphs of FlexAttention,
nested compile regions, cond, scan, map, while_loop and checkpoints cost, against
FlopCounterMode run eagerly on the same module and inputs, static and dynamic; outputs
equal to the inner backend's.

Where FlopCounterMode cannot count the HOP eagerly, the test says so and uses the
independent reference it names: on torch 2.13's CPU, eager FlexAttention refuses to run
under a dispatch mode (torch's registered flex formula instead), and FlopCounterMode
counts no body of an eager ``scan`` (it raises) or ``map`` (0): the same loop written out
in Python, under FlopCounterMode.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

import fxflops
from fxflops.cost import higher_order

torch.manual_seed(0)


def fcm(fn, *args) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def compiled_calls(model, inputs, inner="inductor", dynamic=False):
    """Compile ``model`` with fxflops around ``inner`` (and ``inner`` alone), call both on
    each input; per call: (matmul FLOPs, FLOPs) of the rows it moved, and its output (which
    must equal the inner backend's). ``dynamic``: dim 0 of the first input marked dynamic
    (``torch.compile(dynamic=True)`` fails inside Dynamo for nested compile regions on
    torch 2.13, before any backend runs)."""
    rec = fxflops.recorder()
    ours = torch.compile(model, backend=fxflops.backend(inner))
    plain = torch.compile(model, backend=inner)
    got = []
    for args in inputs:
        if dynamic:
            torch._dynamo.mark_dynamic(args[0], 0)
        before = {(g.id, k): r.count for g in rec.graphs for k, r in g.rows.items()}
        with torch.no_grad():
            out = ours(*args)
            ref = plain(*args)
        assert torch.equal(out[0] if isinstance(out, tuple) else out,
                           ref[0] if isinstance(ref, tuple) else ref)
        moved = [r for g in rec.graphs for k, r in g.rows.items()
                 if r.count != before.get((g.id, k), 0)]
        assert moved, "no instrumented graph ran"
        got.append((sum(r.cost.matmul_flops for r in moved), sum(r.cost.flops for r in moved)))
    return got, [g for g in rec.graphs]


def symbolic(graphs) -> bool:
    """Whether the first graph compiled is symbolic (a static run's second size recompiles
    as dynamic: Dynamo's automatic dynamic shapes)."""
    return bool(graphs[0].cost.symbols)


# --- FlexAttention: torch's registered formula ------------------------------------------

class Flex(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x, block_mask):
        from torch.nn.attention.flex_attention import flex_attention

        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return flex_attention(q, k, v, block_mask=block_mask)


@pytest.mark.parametrize("dynamic", [False, True])
def test_flex_attention_counted_by_torchs_registered_formula(dynamic, fxflops_log):
    from torch.nn.attention.flex_attention import create_block_mask

    model = Flex()
    inputs = []
    for batch, seq in ((2, 128), (3, 128)):
        mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device="cpu")
        inputs.append((torch.randn(batch, seq, 64), mask))
    got, graphs = compiled_calls(model, inputs, dynamic=dynamic)
    flex = flop_registry[torch.ops.higher_order.flex_attention]
    for (x, _), (matmul, flops) in zip(inputs, got):
        b, s, _ = x.shape
        qkv = torch.empty(b, 4, s, 16)
        # FlopCounterMode cannot run eager FlexAttention on CPU (torch 2.13): the linear
        # under FlopCounterMode, plus torch's own registered flex formula
        linear = fcm(model.qkv, x)
        assert matmul == linear + flex(qkv, qkv, qkv) > linear
        assert flops >= matmul
    assert symbolic(graphs) == dynamic
    assert "flex_attention" not in fxflops_log.text


# --- nested compile regions (invoke_subgraph) -------------------------------------------

class Nested(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    @torch.compiler.nested_compile_region
    def block(self, x):
        return torch.relu(self.linear(x))

    def forward(self, x):
        return self.block(self.block(self.block(x)))


@pytest.mark.parametrize("dynamic", [False, True])
def test_nested_compile_region_counted_once_per_call(dynamic):
    model = Nested()
    inputs = [(torch.randn(16, 64),), (torch.randn(5, 64),)]
    got, graphs = compiled_calls(model, inputs, dynamic=dynamic)
    for (x,), (matmul, flops) in zip(inputs, got):
        assert matmul == fcm(model, x) == 3 * 2 * x.shape[0] * 64 * 64
        assert flops == matmul + 3 * x.shape[0] * 64  # the relus (addmm: its matmul only)
    assert symbolic(graphs) == dynamic


# --- cond ---------------------------------------------------------------------------------

class CondOnData(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 128)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a(x).sum(-1), lambda x: self.b(x).sum(-1),
                          (x,))


class CondOnSize(CondOnData):
    def forward(self, x):
        return torch.cond(x.shape[0] > 8, lambda x: self.a(x).sum(-1),
                          lambda x: self.b(x).sum(-1), (x,))


def test_cond_on_tensor_data_counts_the_larger_branch_as_flopcountermode(fxflops_log):
    model = CondOnData()
    inputs = [(torch.randn(16, 64).abs(),), (-torch.randn(16, 64).abs(),)]
    got, _ = compiled_calls(model, inputs)
    for (x,), (matmul, _) in zip(inputs, got):
        # FlopCounterMode counts a cond's larger branch whichever runs: the upper bound
        assert matmul == fcm(model, x) == 2 * 16 * 64 * 128
    assert "cond on tensor data: the larger branch counted" in fxflops_log.text


def test_cond_on_sizes_counts_the_branch_each_size_takes():
    model = CondOnSize()
    inputs = [(torch.randn(16, 64),), (torch.randn(4, 64),), (torch.randn(12, 64),)]
    got, graphs = compiled_calls(model, inputs, dynamic=True)
    assert symbolic(graphs)
    for (x,), (matmul, _) in zip(inputs, got):
        n = x.shape[0]
        assert matmul == fcm(model, x) == 2 * n * 64 * (64 if n > 8 else 128)
    assert len({g.id for g in graphs}) == 1  # one graph, its cost a Piecewise of the size


# --- scan, map, while_loop ----------------------------------------------------------------

class Scan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def step(self, carry, x):
        carry = torch.tanh(self.linear(x) + carry)
        return carry, carry.clone()

    def forward(self, xs):
        from torch._higher_order_ops.scan import scan

        return scan(self.step, torch.zeros(xs.shape[1], 64), xs)

    def unrolled(self, xs):
        carry = torch.zeros(xs.shape[1], 64)
        for x in xs:
            carry, _ = self.step(carry, x)


class Map(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 32)

    def forward(self, xs):
        from torch._higher_order_ops.map import map as hop_map

        return hop_map(self.linear, xs)

    def unrolled(self, xs):
        for x in xs:
            self.linear(x)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("model_type", [Scan, Map])
def test_scan_and_map_count_the_body_once_per_slice(model_type, dynamic):
    model = model_type()
    inputs = [(torch.randn(5, 16, 64),), (torch.randn(7, 16, 64),)]
    # Inductor on CPU fails on both (torch 2.13: DataDependentOutputException in its own
    # lowering, with or without fxflops): aot_eager inside
    got, graphs = compiled_calls(model, inputs, inner="aot_eager", dynamic=dynamic)
    for (xs,), (matmul, _) in zip(inputs, got):
        assert matmul == fcm(model.unrolled, xs) > 0
    assert symbolic(graphs) == dynamic


class While(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, self.linear(x)),
                          (torch.tensor(0), x))


def test_while_loop_counts_one_iteration_and_says_so(fxflops_log):
    model = While()
    x = torch.randn(16, 64)
    got, graphs = compiled_calls(model, [(x,)])
    assert got[0][0] == fcm(model.linear, x)  # one iteration's body (3 ran)
    notes = [n.note for g in graphs for n in g.cost.nodes if n.note]
    assert notes == ["while_loop: one iteration counted per call (its trip count is data)"]
    assert "one iteration counted per call" in fxflops_log.text


# --- checkpoints --------------------------------------------------------------------------

class Checkpointed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)
        self.out = torch.nn.Linear(64, 8)

    def forward(self, x):
        h = torch.utils.checkpoint.checkpoint(lambda x: torch.relu(self.linear(x)), x,
                                              use_reentrant=False)
        return self.out(h)


@pytest.mark.parametrize("dynamic", [False, True])
def test_checkpointed_region_counted_once_in_a_forward(dynamic):
    # (a compiled training step's recomputation: tests/instrument/test_training.py,
    # test_activation_checkpointing_adds_hardware_flops_only)
    model = Checkpointed()
    inputs = [(torch.randn(16, 64),), (torch.randn(6, 64),)]
    got, graphs = compiled_calls(model, inputs, dynamic=dynamic)
    for (x,), (matmul, _) in zip(inputs, got):
        assert matmul == fcm(model, x) == 2 * x.shape[0] * 64 * (64 + 8)
    assert symbolic(graphs) == dynamic


# --- never breaks the model -----------------------------------------------------------------

def test_a_higher_order_op_with_no_cost_is_named_once_and_its_graph_runs(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    monkeypatch.delitem(higher_order.HANDLERS, "higher_order::invoke_subgraph")
    model = Nested()
    inputs = [(torch.randn(16, 64),), (torch.randn(16, 64),)]
    got, _ = compiled_calls(model, inputs)  # (outputs equal Inductor's: asserted there)
    assert got[0][0] == 0
    named = [r for r in caplog.records
             if "no cost for the higher-order op higher_order::invoke_subgraph" in r.getMessage()]
    assert len(named) == 1


def test_associative_scan_counts_n_minus_one_combines():
    """``associative_scan`` reaches a graph only on CUDA (``combine_mode="pointwise"``; on
    a CPU, ``"generic"`` is traced inline, no HOP): the graph is built by hand here, as
    Dynamo makes it on a GPU (the HOP, its combine subgraph, fake example values), and
    analysed as the backend analyses it."""
    from torch._higher_order_ops.associative_scan import associative_scan_op
    from torch._subclasses import FakeTensorMode

    def combine(a, b):
        return (a * b + a,)

    combine_gm = torch.fx.symbolic_trace(combine)
    root = torch.nn.Module()
    root.combine_fn = combine_gm
    graph = torch.fx.Graph()
    xs = graph.placeholder("xs")
    fn = graph.get_attr("combine_fn")
    node = graph.call_function(associative_scan_op, (fn, [xs], ()))
    graph.output((node,))
    gm = torch.fx.GraphModule(root, graph)
    with FakeTensorMode() as mode:
        value = mode.from_tensor(torch.empty(9, 16))
    xs.meta["val"] = value
    node.meta["val"] = [value]
    cost = fxflops.analyze(gm)
    # 8 combines of one 16-element slice: a mul and an add per element
    assert cost.flops == (9 - 1) * 2 * 16 and cost.matmul_flops == 0
    assert cost.uncounted == {}
