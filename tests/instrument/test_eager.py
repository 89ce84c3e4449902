"""``fxflops.eager(model)`` (fxflops/instrument/eager.py, fxflops/cost/census.py): an
uncompiled model's calls counted from the ops they run, once per shape class, and timed per
size in the same rows as compiled graphs', exact against FlopCounterMode and against the
compiled path at the same size; outputs unchanged; a census failure said once."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxflops
from fxflops.cost import registry
from tests import models


def fcm(fn, inputs) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        for x in inputs:
            fn(x)
    return counter.get_total_flops()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16)).eval()


def llama_eager_attention() -> torch.nn.Module:
    # attention as matmuls, which FlopCounterMode counts on every torch (CPU SDPA it
    # counts only from 2.15 on)
    model = models.llama()
    model.config._attn_implementation = "eager"
    return model


def rows_of(graph_name: str) -> dict:
    return {r["size"]: r for r in fxflops.recorder().stats() if r["graph"] == graph_name}


def test_eager_rows_count_each_size_as_flop_counter_mode_and_time_it():
    model = mlp()
    counted = fxflops.eager(model)
    inputs = [torch.randn(b, 32) for b in (2, 4, 4, 4, 2)]
    with torch.no_grad():
        for x in inputs:
            assert torch.equal(counted(x), model(x))  # outputs unchanged
    (graph,) = fxflops.recorder().graphs
    rows = rows_of(graph.name)
    assert set(rows) == {"2x32", "4x32"}
    assert rows["2x32"]["calls"] == 2 and rows["4x32"]["calls"] == 3
    for size, n in (("2x32", 2), ("4x32", 4)):
        row = rows[size]
        assert row["matmul_flops"] == fcm(model, [torch.randn(n, 32)]) > 0
        assert row["flops"] == row["matmul_flops"] + n * 64  # GELU: one per element
        # the census's call is counted, not timed (its time is the census's)
        assert row["timed_calls"] == row["calls"] - 1
    assert rows["4x32"]["median_ms"] > 0
    assert graph.meta["split_size"] == "2x32"  # the split below: its first census's
    assert set(graph.cost.by_module()) == {"0", "1", "2"}
    assert set(graph.cost.by_op()) == {"aten::addmm", "aten::gelu"}


def test_eager_and_compiled_agree_at_one_size_on_a_real_decoder():
    model = llama_eager_attention()
    ids = torch.randint(0, 128, (2, 24))
    eager = fxflops.eager(model, name="eager_llama")
    compiled = torch.compile(model, backend="fxflops")
    with torch.no_grad():
        out_eager = eager(ids).logits
        assert torch.equal(out_eager, model(ids).logits)
        compiled(ids)
    graphs = fxflops.recorder().graphs
    eager_row = next(r for r in fxflops.recorder().stats() if r["graph"] == "eager_llama")
    compiled_rows = [r for r in fxflops.recorder().stats() if r["graph"] != "eager_llama"]
    assert len(graphs) >= 2 and compiled_rows
    reference = fcm(model, [ids])
    assert eager_row["matmul_flops"] == reference > 0
    assert sum(r["matmul_flops"] for r in compiled_rows) == reference
    compiled_total = sum(r["flops"] for r in compiled_rows)
    assert abs(eager_row["flops"] - compiled_total) <= 0.01 * compiled_total
    # the per-module split: each decoder layer's projections
    modules = next(g for g in graphs if g.name == "eager_llama").cost.by_module()
    assert {"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"} <= set(modules)


def test_a_scope_sees_eager_calls_too():
    model = mlp()
    counted = fxflops.eager(model)
    inside = [torch.randn(3, 32), torch.randn(5, 32), torch.randn(3, 32)]
    with torch.no_grad():
        counted(torch.randn(2, 32))
        with fxflops.scope() as s:
            for x in inside:
                counted(x)
    assert s.calls == 3
    assert s.matmul_flops == fcm(model, inside)


def test_a_census_failure_is_said_once_and_the_model_runs_on(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")

    def broken(*args, **kwargs):
        raise RuntimeError("formula broke")

    name = "aten::addmm"
    monkeypatch.setitem(registry.FORMULAS, name,
                        registry.Formula(broken, "matmul", None, False))
    model = mlp()
    counted = fxflops.eager(model)
    with torch.no_grad():
        for b in (2, 3, 3):
            x = torch.randn(b, 32)
            assert torch.equal(counted(x), model(x))
    rows = rows_of(fxflops.recorder().graphs[0].name)
    assert all(r["matmul_flops"] == 0 for r in rows.values()) and rows
    said = [r for r in caplog.records if "could not count aten::addmm" in r.getMessage()]
    assert len(said) == 1


def test_a_model_error_is_the_models_own():
    def fails(x):
        raise ValueError("the model's own")

    counted = fxflops.eager(fails)
    with pytest.raises(ValueError, match="the model's own"):
        counted(torch.randn(2))


# --- sizes from tensor data (unbacked: .item(), nonzero) --------------------------------

class DataSized(torch.nn.Module):
    """Sizes that come from tensor data: ``k = n.item(); x[:k]``, and a boolean mask
    (``nonzero``), as MoE routing makes them."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 48)

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 1)
        torch._check(k <= x.shape[0])
        kept = x[x.sum(-1) > 0]
        return self.linear(x[:k]), self.linear(kept)


@pytest.mark.parametrize("grad", [False, True])
def test_sizes_from_tensor_data_are_bound_from_the_outputs(monkeypatch, grad):
    # grad: AOTAutograd's boxed forward (its argument list cleared by the inner)
    monkeypatch.setattr(torch._dynamo.config, "capture_scalar_outputs", True)
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)
    model = DataSized()
    compiled = torch.compile(model, backend="fxflops")
    torch.manual_seed(1)
    calls = [(torch.randn(8, 64), torch.tensor(k)) for k in (3, 5, 5, 2)]
    with torch.set_grad_enabled(grad):
        for x, n in calls:
            out = compiled(x, n)
            ref = model(x, n)
            assert all(torch.allclose(a, b) for a, b in zip(out, ref))
    assert not fxflops.recorder().uninstrumented
    rows = fxflops.recorder().stats()
    assert sum(r["calls"] for r in rows) == len(calls)
    expected = sum(fcm(lambda c: model(*c), [c]) for c in calls)
    assert sum(r["total_matmul_flops"] for r in rows) == expected > 0


def test_calls_in_a_warmup_phase_go_to_its_rows_on_every_path(monkeypatch):
    """A warm-up phase's calls (vLLM's profile run) go to the phase's rows and the calls
    after it to the traffic's, for an uncompiled model (``fxflops.eager``) and a graph whose
    size is read from its outputs (``OutputBoundGraph``): at a size served before the phase
    too, whose serving row the hot path holds."""
    from fxflops.recording import phases

    monkeypatch.setattr(torch._dynamo.config, "capture_scalar_outputs", True)
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)
    counted = fxflops.eager(mlp())
    compiled = torch.compile(DataSized(), backend="fxflops")
    x, n = torch.randn(8, 64), torch.tensor(3)

    def call_both() -> None:
        with torch.no_grad():
            counted(torch.randn(4, 32))
            compiled(x, n)

    call_both()  # served: each size's row made in the traffic's rows
    with phases.warmup("profile"):
        call_both()
        call_both()
    call_both()
    assert len(fxflops.recorder().graphs) == 2
    for record in fxflops.recorder().graphs:
        served = {r.size: r.count for r in record.rows.values()}
        warm = {r.size: r.count for r in record.warmup["profile"].values()}
        assert list(served.values()) == [2] and served.keys() == warm.keys(), record.name
        assert list(warm.values()) == [2], record.name
    assert sum(r["calls"] for r in fxflops.recorder().stats()) == 4  # traffic's only


def test_sizes_past_the_cap_go_to_the_overflow_row_uncensused(monkeypatch):
    """Bounded memory: past FXFLOPS_MAX_SIZES shape classes, no census runs and no cost is
    kept; the calls are counted and timed in the overflow row, as a compiled graph's are."""
    monkeypatch.setenv("FXFLOPS_MAX_SIZES", "2")
    model = mlp()
    counted = fxflops.eager(model)
    with torch.no_grad():
        for b in (2, 3, 4, 5, 4):
            x = torch.randn(b, 32)
            assert torch.equal(counted(x), model(x))
    record = counted.record
    assert len(record.counted) == 2
    assert record.overflow.count == 3 and record.dropped_sizes == 2
    assert sum(r.count for r in record.rows.values()) == 2


def test_after_a_census_fails_new_sizes_run_uncounted_without_a_census(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="fxflops")
    from fxflops.cost import census

    model = mlp()
    counted = fxflops.eager(model)
    with torch.no_grad():
        counted(torch.randn(2, 32))

        def broken(self, *args, **kwargs):
            raise RuntimeError("census broke")

        monkeypatch.setattr(census.Census, "cost", broken)
        for b in (3, 3, 4):
            x = torch.randn(b, 32)
            assert torch.equal(counted(x), model(x))
        counted(torch.randn(2, 32))  # a size counted before goes on as before
    said = [r for r in caplog.records if "calls at new sizes not counted" in r.getMessage()]
    assert len(said) == 1
    assert set(counted.record.counted) == {(torch.Size([2, 32]),)}
    assert counted.record.rows[(torch.Size([2, 32]),)].count == 2


def test_a_size_first_seen_inside_a_cuda_graph_capture_counts_at_its_replays():
    """A model first called at a size while its stream captures a CUDA graph (a breakable
    CUDA graph's capture runs the model eagerly once per size): censused inside the
    capture, which runs nothing (no call counted then, nothing read from the device), and
    each replay of the graph counts one call at that size, timed by its captured pair, its
    FLOPs FlopCounterMode's. Then an eager call at another size: censused and counted as
    any."""
    from fxflops.instrument.eager import EagerModel
    from fxflops.recording import cuda_events
    from tests.cuda_sim import CudaSim

    sim = CudaSim(lag=2, devices=1)
    try:
        model = mlp()

        def forward(x: torch.Tensor) -> torch.Tensor:
            sim.launch(0.5)  # its kernels, on the (simulated) device
            return model(x)

        counted = EagerModel(forward, "captured_mlp{index}",
                             clock=cuda_events.CudaEventClock(sim))
        x = torch.randn(8, 32)
        graph = sim.CUDAGraph()
        with torch.no_grad(), sim.graph(graph):
            assert torch.equal(counted(x), model(x))
        assert not sim.violations, sim.violations  # no read of the device while capturing
        (record,) = fxflops.recorder().graphs
        assert all(r.count == 0 for r in record.all_rows())  # the capture ran nothing
        for _ in range(5):
            graph.replay()
            sim.step()
        with torch.no_grad():
            counted(torch.randn(4, 32))  # an eager call at a new size: its census
        sim.drain()
        cuda_events.collect_all()
        rows = rows_of(record.name)
        assert rows["8x32"]["calls"] == 5 and rows["8x32"]["timed_calls"] == 5
        assert rows["8x32"]["median_ms"] == 0.5
        assert rows["8x32"]["matmul_flops"] == fcm(model, [x]) > 0
        assert rows["4x32"]["calls"] == 1
        assert rows["4x32"]["matmul_flops"] == fcm(model, [torch.randn(4, 32)])
    finally:
        cuda_events._CLOCKS.pop(sim.CUDAGraph, None)
