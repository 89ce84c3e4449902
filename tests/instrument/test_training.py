"""Training steps: forward and backward graphs counted and timed, model vs hardware FLOPs.

The reference is FlopCounterMode on the same eager step (forward + ``backward()``), which
counts matmul-class ops; fxflops' forward + backward matmul FLOPs must equal it, plus only
CPU SDPA's forward and backward where the installed torch's registry misses them (before
torch 2.15; docs/conventions.md), added here by torch's own formulas.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

import fxflops
from fxflops.report.steps import training_steps
from tests import procs
from tests.helpers import torch_lacks
from tests.models import SmallCNN

CPU_SDPA = "aten::_scaled_dot_product_flash_attention_for_cpu"


def eager_step_flops(step, *args) -> int:
    """FlopCounterMode's count of ``step(*args)``, run eagerly."""
    with FlopCounterMode(display=False) as counter:
        step(*args)
    return counter.get_total_flops()


def rows_at(size: object = None) -> dict[str, list[int]]:
    """phase -> [matmul FLOPs, recomputed matmul FLOPs, calls], summed over the graphs'
    rows of size label ``size`` (None: every row)."""
    out: dict[str, list[int]] = {}
    for g in fxflops.recorder().graphs:
        phase = g.meta.get("phase", "none")
        for r in g.rows.values():
            if size is None or r.size == size:
                acc = out.setdefault(phase, [0, 0, 0])
                acc[0] += r.cost.matmul_flops
                acc[1] += r.cost.recomputed_matmul_flops
                acc[2] += r.count
    return out


def torch_backward_case(a, w1, w2):
    """torch's test/test_flop_counter.py::test_backward (5184 FLOPs there)."""
    a = torch.mm(a, w1)
    a = a.unsqueeze(0).expand(7, 4, 6)
    return torch.bmm(a, w2).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_backward_case(dynamic):
    compiled = torch.compile(torch_backward_case, backend="fxflops", dynamic=dynamic)
    a = torch.randn(4, 5, requires_grad=True)
    w1, w2 = torch.randn(5, 6), torch.randn(7, 6, 7)
    compiled(a, w1, w2).backward()
    expected = eager_step_flops(lambda: torch_backward_case(a, w1, w2).backward())
    assert expected == 5184  # torch's own expected value
    phases = rows_at()
    assert phases["forward"][0] + phases["backward"][0] == expected
    assert phases["forward"][2] == phases["backward"][2] == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_cnn_step_equals_flop_counter(dynamic):
    torch.manual_seed(0)
    model = SmallCNN().train()
    compiled = torch.compile(model, backend="fxflops", dynamic=dynamic)
    for batch in (2, 5):
        x = torch.randn(batch, 3, 16, 16)
        compiled(x).logsumexp(-1).mean().backward()
        expected = eager_step_flops(lambda x: model(x).logsumexp(-1).mean().backward(), x)
        got = rows_at(f"{batch}x16" if dynamic else batch)
        assert got["forward"][0] + got["backward"][0] == expected, batch
        assert got["backward"][0] > got["forward"][0]  # grads of input and weights
    names = {g.name for g in fxflops.recorder().graphs}
    assert all(f"{g.meta['source']}.backward" in names for g in fxflops.recorder().graphs
               if g.meta.get("phase") == "forward")


def test_transformers_decoder_step_equals_flop_counter_plus_cpu_sdpa():
    """A tiny Llama (transformers, SDPA attention) trained through AOTAutograd with
    dynamic shapes: one pair of graphs, every size exact."""
    import transformers

    torch.manual_seed(0)
    heads, kv_heads, hidden, layers = 4, 2, 64, 2
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
        attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(cfg).train()
    compiled = torch.compile(model, backend=fxflops.backend(inner="aot_eager"), dynamic=True)
    head_dim = hidden // heads
    for batch, seq in ((2, 16), (3, 24)):
        ids = torch.randint(0, 128, (batch, seq))
        compiled(input_ids=ids, labels=ids).loss.backward()
        expected = eager_step_flops(
            lambda ids: model(input_ids=ids, labels=ids).loss.backward(), ids)
        # what FlopCounterMode counts 0 on CPU where torch's registry lacks CPU SDPA (before
        # 2.15): SDPA, forward and backward, per layer
        q = k = v = (batch, heads, seq, head_dim)  # k, v repeated to every head
        sdpa = layers * (
            (sdpa_flop_count(q, k, v) if torch_lacks(CPU_SDPA) else 0) +
            (sdpa_backward_flop_count(q, q, k, v) if torch_lacks(f"{CPU_SDPA}_backward") else 0))
        got = rows_at(f"{batch}x{seq}")
        assert got["forward"][0] + got["backward"][0] == expected + sdpa, (batch, seq)
    graphs = fxflops.recorder().graphs
    assert len(graphs) == 2 and all(not g.cost.uncounted for g in graphs)


class Checkpointed(nn.Module):
    def __init__(self, use_checkpoint: bool) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 8)
        self.use_checkpoint = use_checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.inner, x, use_reentrant=False) if self.use_checkpoint \
            else self.inner(x)
        return self.head(h)


@pytest.mark.parametrize("inner", ["inductor", "aot_eager"])
def test_activation_checkpointing_adds_hardware_flops_only(inner):
    x = torch.randn(16, 32)
    totals = {}
    for use_checkpoint in (False, True):
        torch._dynamo.reset()
        fxflops.reset_recorder()
        torch.manual_seed(0)
        model = Checkpointed(use_checkpoint)
        compiled = torch.compile(model, backend=fxflops.backend(inner=inner))
        compiled(x).sum().backward()
        got = rows_at()
        hardware = got["forward"][0] + got["backward"][0]
        recomputed = got["forward"][1] + got["backward"][1]
        totals[use_checkpoint] = (hardware - recomputed, hardware)
    segment = eager_step_flops(lambda: Checkpointed(False).inner(x))  # the forward redone
    assert segment == 2 * 16 * (32 * 64 + 64 * 32)
    assert totals[True][0] == totals[False][0]  # model FLOPs: the same step
    # hardware: + the recomputation. The compiled backward redoes the whole segment (its
    # output, which the head's weight gradient reads, is not saved either); eager
    # checkpointing stops early and redoes one linear less, so eager is no reference here
    assert totals[True][1] - totals[False][1] == segment


@pytest.mark.parametrize("inner", ["inductor", "aot_eager", "eager"])
def test_loss_and_gradients_bit_identical(inner):
    def train(backend):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = SmallCNN().train()
        compiled = torch.compile(model, backend=backend)
        losses = []
        for step in range(3):
            x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(step))
            loss = compiled(x).logsumexp(-1).mean()
            loss.backward()
            losses.append(loss.detach())
        return losses, [p.grad.clone() for p in model.parameters()]

    plain_losses, plain_grads = train(inner)
    losses, grads = train(fxflops.backend(inner=inner))
    assert all(torch.equal(a, b) for a, b in zip(losses, plain_losses))
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    # inductor and aot_eager: forward and backward graphs; eager: Dynamo's graph as eager
    # runs it (no AOTAutograd inserted), its forward counted
    phases = {g.meta.get("phase") for g in fxflops.recorder().graphs}
    assert phases == ({None} if inner == "eager" else {"forward", "backward"}), phases


def test_backward_is_timed_and_steps_roll_up(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    compiled = torch.compile(model, backend="fxflops")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="fxflops")
    def opt_step():
        opt.step()

    steps = 5
    for _ in range(steps):
        compiled(torch.randn(8, 64)).pow(2).mean().backward()
        opt_step()
        opt.zero_grad()
        with torch.no_grad():  # an evaluation forward each step: not part of the step
            compiled(torch.randn(8, 64))
    # the model's forward and backward, the optimizer's step (compiled first of the two
    # graphs without a phase), the model recompiled under no_grad
    phased = {g.meta["phase"]: g for g in fxflops.recorder().graphs if "phase" in g.meta}
    opt_graph, eval_graph = [g for g in fxflops.recorder().graphs if "phase" not in g.meta]
    graphs = {**phased, "none": opt_graph}
    backward = next(iter(graphs["backward"].rows.values()))
    assert backward.count == steps and all(ns > 0 for ns in backward.samples())

    path = fxflops.recorder().save(tmp_path / "train.json")
    report = json.loads(open(path).read())
    [step] = report["steps"]
    rows = {(g["name"]): g["rows"][0] for g in report["graphs"]}
    fw, bw = rows[graphs["forward"].name], rows[graphs["backward"].name]
    opt_row = rows[graphs["none"].name] if graphs["none"].name in rows else None
    others = [n for n in step["other_graphs"]]
    assert step["steps"] == steps and step["size"] == 8
    # the optimizer's compiled step ran once a step, and is in the step; so did the no-grad
    # evaluation (the model's frame compiled again), which is not
    assert others == [opt_graph.name] and opt_row is not None and opt_row["calls"] == steps
    assert rows[eval_graph.name]["calls"] == steps and eval_graph.name not in others
    opt = rows[others[0]]
    assert step["step_ms"] == pytest.approx(fw["median_ms"] + bw["median_ms"] + opt["median_ms"])
    assert step["flops"] == fw["flops"] + bw["flops"] + opt["flops"]
    assert step["model_flops"] == step["flops"] - step["recomputed_flops"]
    # matmul FLOPs per step by hand: 2 linears forward, their input and weight grads back
    # (the first linear's input needs no grad)
    lin = 2 * 8 * 64 * 128
    assert fw["matmul_flops"] == 2 * lin and bw["matmul_flops"] == 3 * lin


def test_step_rollup_by_hand():
    """training_steps on rows with known figures: MFU on model FLOPs, HFU on all."""
    def row(graph, phase, size, calls, median, flops, matmul, recomputed=0, source="g0"):
        return {"run": "r", "rank": None, "pid": 1, "graph": graph, "size": size,
                "calls": calls, "median_ms": median, "total_ms": median * calls,
                "flops": flops, "matmul_flops": matmul, "bytes_io": 1000,
                "recomputed_flops": recomputed, "recomputed_matmul_flops": recomputed,
                **({"phase": phase, "source": source} if phase else {})}

    rows = [row("g0", "forward", 8, 10, 2.0, 100e9, 90e9),
            row("g0.backward", "backward", 8, 10, 4.0, 250e9, 200e9, recomputed=20e9),
            row("g0", "forward", 16, 5, 3.0, 200e9, 180e9),
            row("g0.backward", "backward", 16, 5, 6.0, 500e9, 400e9, recomputed=40e9),
            # the optimizer, once a step (10 + 5 steps), in two recompiles of its frame
            {**row("opt", None, "static", 1, 3.0, 10e9, 0), "frame": 7},
            {**row("opt_2", None, "static", 14, 1.0, 10e9, 0), "frame": 7},
            row("eval", None, 8, 3, 1.5, 100e9, 90e9)]           # not once a step
    [s8, s16] = sorted(training_steps(rows, {"tflops": 100.0, "gbps": 1000.0}),
                       key=lambda s: s["steps"], reverse=True)
    assert s8["steps"] == 10 and s16["steps"] == 5 and s8["other_graphs"] == ["opt", "opt_2"]
    opt_ms = (3.0 * 1 + 1.0 * 14) / 15
    assert s8["step_ms"] == pytest.approx(2.0 + 4.0 + opt_ms)
    assert s8["flops"] == 100e9 + 250e9 + 10e9 and s8["model_flops"] == s8["flops"] - 20e9
    seconds = (6.0 + opt_ms) / 1e3
    assert s8["mfu"] == pytest.approx((90e9 + 200e9 - 20e9) / seconds / 100e12)
    assert s8["hfu"] == pytest.approx((90e9 + 200e9) / seconds / 100e12)
    assert s16["step_ms"] == pytest.approx(3.0 + 6.0 + opt_ms)
    # a recompile of the model's frame at size 8 (a guard failed once): averaged, not added
    rows.append({**row("g9", "forward", 8, 2, 5.0, 100e9, 90e9, source="g9"), "frame": 3})
    rows.append({**row("g9.backward", "backward", 8, 2, 7.0, 250e9, 200e9, source="g9"),
                 "frame": 3})
    for r in rows[:4]:
        r["frame"] = 3
    [s8] = [s for s in training_steps(rows, {}) if s["size"] == 8]
    assert s8["steps"] == 12  # calls of the frame's backward graphs at size 8
    assert s8["forward_ms"] == pytest.approx((2.0 * 10 + 5.0 * 2) / 12)


def test_inference_keeps_its_rows_and_other_inners_warn(fxflops_log):
    model = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model, backend="fxflops")(x)
    [graph] = fxflops.recorder().graphs
    assert graph.name == "graph0" and "phase" not in graph.meta  # the Dynamo graph itself

    torch._dynamo.reset()
    fxflops.reset_recorder()

    def custom(gm, example_inputs):
        return gm.forward

    torch.compile(model, backend=fxflops.backend(inner=custom))(x).sum().backward()
    [graph] = fxflops.recorder().graphs
    assert "phase" not in graph.meta
    assert any("only forward graphs are counted" in r.getMessage() for r in fxflops_log.records)


def test_a_failing_phase_runs_uninstrumented(monkeypatch, fxflops_log):
    from fxflops.recording.store import GraphRecord

    def broken(self, key):
        raise RuntimeError("row exploded")

    monkeypatch.setattr(GraphRecord, "row", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    compiled = torch.compile(model, backend=fxflops.backend(inner="aot_eager"))
    x = torch.randn(4, 8)
    loss = compiled(x).sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    broken_msgs = [r.getMessage() for r in fxflops_log.records if "row exploded" in r.getMessage()]
    assert len(broken_msgs) == 2  # forward and backward: once each, then uninstrumented
    assert all("runs uninstrumented" in m for m in broken_msgs)


def test_example_report_compare_plot(tmp_path):
    """examples/train_tiny.py (docs/training.md), then the CLI on what it wrote."""
    import shutil
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = procs.run([sys.executable, "examples/train_tiny.py", str(out), "--inner",
                     "aot_eager", "--steps", "3", "--seq", "16"],
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = out / "train.json"
    data = json.loads(report.read_text())
    [step] = data["steps"]
    assert step["steps"] == 3 and step["backward_ms"] > 0 and step["other_graphs"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return procs.run([sys.executable, "-m", "fxflops.cli.main", *args],
                         timeout=600)

    shown = cli("report", str(out))
    assert shown.returncode == 0 and "training steps" in shown.stdout
    assert "graph0.backward" in shown.stdout
    again = tmp_path / "again.json"
    shutil.copy(report, again)
    compared = cli("compare", str(report), str(again))
    assert compared.returncode == 0 and "graph0.backward" in compared.stdout
    assert "training steps" in compared.stdout and "1.00x" in compared.stdout
    png = tmp_path / "plot.png"
    plotted = cli("plot", str(out), "-o", str(png))
    assert plotted.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG"
