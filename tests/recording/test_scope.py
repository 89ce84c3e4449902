"""``fxflops.scope()``: the calls made inside a block, in rows of its own, exact against
FlopCounterMode; the process-wide rows lose nothing; nesting, phases, flushes, errors.
And ``fxflops.peak()``, the peak the report uses."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fxflops
from fxflops.recording import phases
from fxflops.report.files import load_reports
from tests import models
from tests.helpers import graphs_of


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16)).eval()


def fcm(model: torch.nn.Module, inputs: list[torch.Tensor]) -> int:
    """FlopCounterMode's FLOPs of ``model`` run eagerly on each of ``inputs``."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        for x in inputs:
            model(x)
    return counter.get_total_flops()


def calls_by_size(rows) -> dict:
    out: dict = {}
    for r in rows:
        out[(r["graph"], r["size"])] = out.get((r["graph"], r["size"]), 0) + r["calls"]
    return out


def calls_by_batch(rows) -> dict:
    """Calls per (graph, batch): a size label's first number (``5x16``: 5)."""
    out: dict = {}
    for r in rows:
        at = (r["graph"], int(str(r["size"]).split("x")[0]))
        out[at] = out.get(at, 0) + r["calls"]
    return out


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_scope_counts_the_calls_inside_exactly_as_flop_counter_mode(name):
    model = mlp() if name == "mlp" else models.cnn()
    shape = (32,) if name == "mlp" else (3, 16, 16)
    compiled = torch.compile(model, backend="fxflops", dynamic=True)
    outside = [torch.randn(2, *shape)]
    inside = [torch.randn(3, *shape), torch.randn(5, *shape), torch.randn(3, *shape)]
    after = [torch.randn(5, *shape)]
    with torch.no_grad():
        for x in outside:
            compiled(x)
        with fxflops.scope() as s:
            for x in inside:
                compiled(x)
        for x in after:  # after the scope: the process's rows only
            compiled(x)
    assert s.matmul_flops == fcm(model, inside) > 0
    assert s.calls == 3
    ((graph, _),) = {(r["graph"], 0) for r in s.rows()}
    assert calls_by_batch(s.rows()) == {(graph, 3): 2, (graph, 5): 1}
    for r in s.rows():  # each size's calls timed in the scope's own rows
        assert r["timed_calls"] == r["calls"] and r["median_ms"] > 0
        assert r["total_matmul_flops"] == r["matmul_flops"] * r["calls"]
    # the process-wide rows lose nothing: every call, inside the scope or not
    assert calls_by_batch(fxflops.recorder().stats()) == {(graph, 2): 1, (graph, 3): 2,
                                                          (graph, 5): 2}
    every = outside + inside + after
    total = sum(r["total_matmul_flops"] for r in fxflops.recorder().stats())
    assert total == fcm(model, every)
    # nothing rebound: the graph's calls went to the process's rows throughout
    (record,) = fxflops.recorder().graphs
    (graph,) = graphs_of(record)
    assert graph._rows is record.rows


def test_graphs_compiled_before_and_inside_a_scope_both_count():
    before = torch.compile(lambda x: x @ x.T, backend=fxflops.backend(inner="eager"))
    before(torch.randn(4, 8))
    with fxflops.scope() as s:
        before(torch.randn(4, 8))
        inside = torch.compile(lambda x: (x @ x).sum(), backend=fxflops.backend(inner="eager"))
        inside(torch.randn(6, 6))
        inside(torch.randn(6, 6))
    assert calls_by_size(s.rows()) == {("graph0", 4): 1, ("graph1", 6): 2}
    assert s.matmul_flops == 2 * 4 * 8 * 4 + 2 * (2 * 6 * 6 * 6)
    assert calls_by_size(fxflops.recorder().stats()) == {("graph0", 4): 2, ("graph1", 6): 2}
    # a graph compiled inside it records into the process's rows once it closed
    inside(torch.randn(6, 6))
    assert s.calls == 3
    assert calls_by_size(fxflops.recorder().stats())[("graph1", 6)] == 3


def test_scopes_nest_and_may_close_out_of_order():
    f = torch.compile(lambda x: x @ x, backend=fxflops.backend(inner="eager"), dynamic=True)
    x = torch.randn(3, 3)
    with fxflops.scope() as outer:
        f(x)
        with fxflops.scope() as inner:
            f(x)
            f(x)
        f(x)
    assert (outer.calls, inner.calls) == (4, 2)
    assert outer.matmul_flops == 4 * 2 * 27 and inner.matmul_flops == 2 * 2 * 27
    # closed in another order than opened (as threads can): each keeps its own calls, and
    # what the inner one merges after the outer one closed goes to the process's rows
    a = fxflops.scope().__enter__()
    f(x)
    b = fxflops.scope().__enter__()
    f(x)
    a.__exit__(None, None, None)
    f(x)
    b.__exit__(None, None, None)
    assert (a.calls, b.calls) == (2, 2)
    assert calls_by_size(fxflops.recorder().stats()) == {("graph0", 3): 7}


def test_a_scope_sees_its_own_timings_after_many_calls_outside():
    """A size called often before the scope samples one call in FXFLOPS_SAMPLE_EVERY; in a
    scope its first calls are each timed again: a scope of a few calls has a median."""
    f = torch.compile(lambda x: x * 2, backend=fxflops.backend(inner="eager"))
    x = torch.randn(8)
    for _ in range(600):
        f(x)
    (before,) = fxflops.recorder().stats()
    with fxflops.scope() as s:
        for _ in range(3):
            f(x)
    (row,) = s.rows()
    assert row["calls"] == row["timed_calls"] == 3 and row["median_ms"] > 0
    (after,) = fxflops.recorder().stats()
    assert after["calls"] == before["calls"] + 3
    assert after["timed_calls"] == before["timed_calls"] + 3  # the scope's samples merged


def test_a_flush_while_a_scope_is_open_counts_its_calls_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FXFLOPS_OUT", str(tmp_path))
    f = torch.compile(lambda x: x + 1, backend=fxflops.backend(inner="eager"))
    x = torch.randn(4)
    with fxflops.scope() as s:
        f(x)
        f(x)
        fxflops.recorder().flush()
        (report,) = load_reports([tmp_path])
        assert sum(r["calls"] for r in report["graphs"][0]["rows"]) == 2
        f(x)
        assert s.calls == 3  # read while open: what it holds so far
    fxflops.recorder().flush()
    (report,) = load_reports([tmp_path])
    assert sum(r["calls"] for r in report["graphs"][0]["rows"]) == 3
    assert s.calls == 3


def test_a_scope_keeps_warmup_phases_apart():
    f = torch.compile(lambda x: x @ x, backend=fxflops.backend(inner="eager"))
    x = torch.randn(2, 2)
    with fxflops.scope() as s:
        f(x)
        with phases.warmup("profile"):
            f(x)
            f(x)
    assert s.calls == 1  # the rows: real traffic's
    (graph,) = s.report()["graphs"]
    assert [(r["calls"], r["warmup"]) for r in graph["warmup"]] == [(2, "profile")]
    (record,) = fxflops.recorder().graphs
    assert sum(r.count for r in record.rows.values()) == 1
    assert sum(r.count for r in record.warmup["profile"].values()) == 2


def test_a_scope_s_report_is_a_report(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    compiled = torch.compile(model, backend=fxflops.backend(inner="eager"), dynamic=True)
    compiled(torch.randn(2, 16))
    with fxflops.scope() as s:
        compiled(torch.randn(4, 16))
    path = tmp_path / "scope.json"
    path.write_text(json.dumps(s.report()))
    report = fxflops.load_report(str(path))  # validated
    (graph,) = report["graphs"]
    assert [(r["size"], r["calls"]) for r in graph["rows"]] == [(4, 1)]
    assert graph["rows"][0]["matmul_flops"] == 2 * 4 * 16 * 16
    assert report["peak"] == fxflops.recorder().to_dict()["peak"]
    text = s.table()
    assert "graph0" in text and "total" in text and str(s) == text


def test_a_scope_is_entered_once_and_read_after_entering():
    s = fxflops.scope()
    with pytest.raises(RuntimeError, match="not entered"):
        s.rows()
    with s:
        assert s.open
    assert not s.open and s.calls == 0
    with pytest.raises(RuntimeError, match="entered already"):
        with s:
            pass


def test_peak_is_the_report_s_peak(monkeypatch):
    f = torch.compile(lambda x: x @ x, backend=fxflops.backend(inner="eager"))
    f(torch.randn(4, 4))
    report = fxflops.recorder().to_dict()["peak"]
    got = fxflops.peak()
    assert got.device == fxflops.recorder().info["device"]
    assert got.source == report["source"]
    assert got.flops_per_s == pytest.approx(report["tflops"] * 1e12)
    assert got.tflops == pytest.approx(report["tflops"])
    # a device the table knows, by name, for a dtype
    h100 = fxflops.peak("NVIDIA H100 80GB HBM3", torch.float8_e4m3fn)
    assert h100.dtype == "fp8"
    assert (h100.tflops, h100.gbps) == (pytest.approx(1978.9), pytest.approx(3350.0))
    assert h100.source == "table:H100 SXM:fp8"
    # the environment overrides the table, as in a report
    monkeypatch.setenv("FXFLOPS_PEAK_TFLOPS", "123")
    monkeypatch.setenv("FXFLOPS_PEAK_GBPS", "456")
    cpu = fxflops.peak("cpu", "fp32")
    assert (cpu.flops_per_s, cpu.bytes_per_s, cpu.source) == (123e12, 456e9, "env")
    assert cpu.device.startswith("cpu:")


@pytest.fixture
def sim():
    from fxflops.recording import cuda_events
    from tests.cuda_sim import CudaSim

    simulator = CudaSim(lag=2, devices=1)
    yield simulator
    cuda_events._CLOCKS.pop(simulator.CUDAGraph, None)


def test_a_scope_on_a_gpu_has_every_sample_where_it_belongs(sim, monkeypatch):
    """CUDA-event timed calls (the simulator, the device two host steps behind): a scope
    counts its calls when made and times them when their events are read, after it closed
    too, and the process-wide rows get those late samples as well."""
    from tests.helpers import compile_on_sim, on_device

    compile_on_sim(monkeypatch, sim)
    compiled = torch.compile(torch.nn.Linear(8, 8),
                             backend=fxflops.backend(inner=on_device(sim, 1.0)))
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled(x)
        sim.step()
        with fxflops.scope() as s:
            for _ in range(5):
                compiled(x)
                sim.step()
        compiled(x)  # outside
    sim.drain()
    (row,) = s.rows()
    assert row["calls"] == row["timed_calls"] == 5 and row["median_ms"] == 1.0
    (row,) = fxflops.recorder().stats()
    assert row["calls"] == row["timed_calls"] == 7 and row["lost_samples"] == 0


COUNTERS = ("calls", "chosen_calls", "timed_calls", "lost_samples", "total_ms",
            "total_matmul_flops")


def _by_graph(rows) -> dict:
    """The counters of each (graph, size) row, serving rows only."""
    return {(r["graph"], r["size"]): {k: r[k] for k in COUNTERS} for r in rows}


@pytest.mark.parametrize("held", [1, 3])
def test_a_scope_sees_cuda_graph_replays_as_the_recorders_difference(sim, monkeypatch, held):
    """Graphs captured in one CUDA graph (one: vLLM's piecewise pieces, their replays
    sampled; three: a FULL graph, its replays counted at a collection) replayed before, in
    and after a scope, the device two replays behind: the scope's rows are exactly what the
    process's rows gained from its opening to its closing, calls, samples (the last two
    read after it closed), losses and time, and nothing of the replays after it."""
    from tests.helpers import captured_linears

    monkeypatch.setenv("FXFLOPS_REPLAY_SAMPLE_EVERY", "4")  # (read at the capture)
    graph = captured_linears(monkeypatch, sim, held)
    rec = fxflops.recorder()
    with torch.no_grad():
        for _ in range(40):
            graph.replay()
            sim.step()
        sim.drain()
        before = _by_graph(rec.stats())
        with fxflops.scope() as s:
            for _ in range(50):
                graph.replay()
                sim.step()
        rec.settle()
        sim.drain()  # the scope's last replays are read after it closed
        after = _by_graph(rec.stats())
        for _ in range(9):  # after the scope: none of these is its
            graph.replay()
            sim.step()
        sim.drain()
    scoped = _by_graph(s.rows())
    assert len(scoped) == held
    for at, row in scoped.items():
        gained = {k: after[at][k] - before[at][k] for k in COUNTERS}
        assert row["calls"] == 50
        assert row == pytest.approx(gained)
        assert row["timed_calls"] + row["lost_samples"] == row["chosen_calls"] > 0
    assert sum(r["calls"] for r in rec.stats()) == held * (1 + 40 + 50 + 9)
    assert sim.violations == []
