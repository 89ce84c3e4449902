"""SGLang (0.5.23, its torch 2.14.1; scripts/sglang_leg.sh) under fxflops, on CPU tensors:
SGLang's real ``patch_model`` of both graph runners (the decode CUDA-graph runner's, mode
``max-autotune-no-cudagraphs``; the CPU runner's, ``dynamic=False`` with Inductor's
``freezing``) and its real ``install_torch_compiled``, driven on a small decoder; fxflops'
plugin switched on through SGLang's own ``HookRegistry``. Checked: one row per compiled
size, named by it, counted; its FLOPs exact against ``FlopCounterMode``; outputs equal to
SGLang's own compile's; off, nothing changes; a failure inside fxflops leaves SGLang's
compile as it was; SGLang's own estimate (``--enable-mfu-metrics``) beside the rows, its
differences named; a CUDA-graph capture and its replays on the CUDA simulator.

What is not driven here, and why: SGLang's ``DecodeCudaGraphRunner`` itself. Building one
needs a ``ModelRunner`` with its KV pools and a GPU attention backend (FlashInfer or
Triton kernels, ``sgl_kernel``, a CUDA-only build that needs ``libcuda.so.1``), SGLang's
published parallel groups (``get_parallel()``), ``torch.cuda.mem_get_info`` and graph
memory pools, none of which the CUDA simulator stands in for; and SGLang's CPU engine
wants AMX for its attention. The capture here is the runner's pattern (its compiled
forward called eagerly, then once under ``torch.cuda.graph``, then replayed) on the
simulator, around SGLang's real ``patch_model``.
"""

from __future__ import annotations

import logging
import os
import types

import pytest
import torch

pytest.importorskip("sglang", reason="SGLang's tests run in scripts/sglang_leg.sh's venv")
pytestmark = pytest.mark.sglang

import fxflops  # noqa: E402
from fxflops.recording import cuda_events  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB, CONTEXT = 64, 4, 2, 16, 128, 2, 256, 8
MAX_BS = 4


class Layer(torch.nn.Module):
    """A Llama-type block at decode: one new token per request against a KV cache of
    ``CONTEXT`` tokens (matmul attention: both counters see its two products)."""

    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(HIDDEN), torch.nn.RMSNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.o = torch.nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.gate_up = torch.nn.Linear(HIDDEN, 2 * INTER, bias=False)
        self.down = torch.nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
                ) -> torch.Tensor:
        bs = x.shape[0]
        q, _, _ = self.qkv(self.n1(x)).split(
            [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(bs, HEADS, 1, HEAD_DIM)
        k = k_cache[:bs].repeat_interleave(HEADS // KV_HEADS, 1)
        v = v_cache[:bs].repeat_interleave(HEADS // KV_HEADS, 1)
        a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / HEAD_DIM ** 0.5, -1)
        x = x + self.o(torch.matmul(a, v).reshape(bs, HEADS * HEAD_DIM))
        g, u = self.gate_up(self.n2(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(g) * u)


class TinyDecoder(torch.nn.Module):
    """SGLang's model signature, ``forward(input_ids, positions, forward_batch)``, the LM
    head inside (as SGLang's logits processor is)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: object) -> torch.Tensor:
        x = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, forward_batch.k_cache[i], forward_batch.v_cache[i])  # type: ignore[attr-defined]
        return self.lm_head(self.norm(x))


def linear_flops_per_token() -> int:
    """SGLang's formula's projections and MLP (``_init_estimated_perf_constants``)."""
    attn = 2 * HIDDEN * HEAD_DIM * (HEADS + 2 * KV_HEADS) + 2 * HIDDEN * HEAD_DIM * HEADS
    return (attn + 6 * HIDDEN * INTER) * LAYERS


LM_HEAD_PER_TOKEN = 2 * HIDDEN * VOCAB
ATTENTION_PER_TOKEN = 4 * HEADS * HEAD_DIM * CONTEXT * LAYERS


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = TinyDecoder().eval()
    batch = types.SimpleNamespace(
        k_cache=[torch.randn(MAX_BS, KV_HEADS, CONTEXT, HEAD_DIM) for _ in range(LAYERS)],
        v_cache=[torch.randn(MAX_BS, KV_HEADS, CONTEXT, HEAD_DIM) for _ in range(LAYERS)])
    return m, batch


def inputs(bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(bs)
    return torch.randint(0, VOCAB, (bs,), generator=g), torch.full((bs,), CONTEXT)


TP = types.SimpleNamespace(ca_comm=None)  # what patch_model reads of the TP group


@pytest.fixture
def sites(monkeypatch):
    """SGLang's two compile modules, their functions restored after the test (SGLang's
    HookRegistry patches them and has no undo), its registry reset, fxflops' recorder
    fresh and its plugin's torch.compile gate undone."""
    from sglang.srt.compilation import torch_compile_decoration as decode
    from sglang.srt.managers.scheduler_components import metrics_reporter
    from sglang.srt.model_executor import cpu_graph_runner as cpu
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.plugins.hook_registry import HookRegistry

    from fxflops.integrations.sglang import plugin

    reporter = metrics_reporter.SchedulerMetricsReporter
    for owner, name in ((decode, "patch_model"), (cpu, "patch_model"),
                        (reporter, "_estimate_decode_perf"),
                        (reporter, "_estimate_prefill_perf"), (torch, "compile"),
                        (ModelRunner, "load_model")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    fxflops.reset_recorder()
    yield types.SimpleNamespace(decode=decode, cpu=cpu, reporter=reporter,
                                module=metrics_reporter)
    plugin.uninstall()
    HookRegistry.reset()
    fxflops.reset_recorder()


def switch_on(monkeypatch) -> None:
    from fxflops.integrations.sglang import plugin

    monkeypatch.setenv("FXFLOPS", "1")
    plugin.register()
    plugin.apply()


def flop_counter(model, batch, bs: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs(bs), batch)
    return counter.get_total_flops()


def rows_by_name() -> dict[str, list]:
    return {g.name: g.all_rows() for g in fxflops.recorder().graphs_snapshot()}


def test_installed_but_off_changes_nothing(sites, monkeypatch):
    """Without FXFLOPS=1 the entry point registers no hook: SGLang's functions, its hook
    registry and torch.compile are as they were, after SGLang applies its hooks too."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from fxflops.integrations.sglang import plugin

    monkeypatch.delenv("FXFLOPS", raising=False)
    before = (sites.decode.patch_model, sites.cpu.patch_model, torch.compile,
              sites.reporter._estimate_decode_perf)
    hooks_before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    plugin.register()
    plugin.apply()
    assert dict(HookRegistry._hooks) == hooks_before
    assert (sites.decode.patch_model, sites.cpu.patch_model, torch.compile,
            sites.reporter._estimate_decode_perf) == before
    # and on, the same entry point does change them (the check above can fail)
    switch_on(monkeypatch)
    assert sites.decode.patch_model is not before[0] and torch.compile is not before[2]


def test_the_entry_point_is_sglangs_group():
    """The installed distribution declares ``register`` in SGLang's plugin group, which
    SGLang's loader finds (``load_plugins_by_group``) without calling it."""
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    from fxflops.integrations.sglang import plugin

    found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert found["fxflops"][0] is plugin.register


@pytest.mark.parametrize("compiled", [False, True])
def test_a_server_that_compiles_nothing_is_said_to_be_uncounted(sites, monkeypatch, caplog,
                                                                 compiled):
    """SGLang's ``ModelRunner.load_model`` as the plugin hooks it (its loading body a
    stand-in: a real one needs a GPU): without ``--enable-torch-compile`` SGLang compiles
    nothing and fxflops says once that it counts nothing there (docs/sglang.md says why);
    with it, nothing is said. The load itself is SGLang's, and returns what it returns."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    from fxflops import util

    loads = []
    monkeypatch.setattr(ModelRunner, "load_model", lambda self: loads.append(self))
    monkeypatch.setattr(util, "_warned", set())
    caplog.set_level(logging.WARNING, logger="fxflops")
    switch_on(monkeypatch)
    runner = types.SimpleNamespace(
        server_args=types.SimpleNamespace(enable_torch_compile=compiled))
    for _ in range(2):
        assert ModelRunner.load_model(runner) is None
    assert loads == [runner, runner]
    said = [r for r in caplog.records if "compiles nothing without" in r.getMessage()]
    assert len(said) == (0 if compiled else 1)


@pytest.mark.parametrize("runner", ["decode", "cpu"])
def test_one_row_per_compiled_size_exact_and_equal_to_sglangs_compile(
        runner, sites, model, monkeypatch):
    """Each runner's ``patch_model``, per batch size SGLang compiles: one graph named by
    the size, its row at that size counting each call, its matmul FLOPs equal to
    FlopCounterMode's for the same model and input, the output equal to SGLang's own
    compile's (SGLang's ``patch_model`` without fxflops, same mode and settings: bit for
    bit at decode; with the CPU runner's ``freezing``, within float32's rounding); a size
    SGLang does not compile passes through, with no row. SGLang's ``mode=`` reaches
    fxflops' backend (Inductor's config made of it as ``backend="inductor"`` makes it); the
    CPU runner's Inductor settings (``freezing``) are SGLang's own, set as its runner
    sets them."""
    m, batch = model
    module = getattr(sites, runner)
    if runner == "cpu":
        monkeypatch.setattr(torch._inductor.config, "freezing", True)
    own = module.patch_model
    sizes = (1, 2)
    from fxflops.instrument import backend

    modes = []  # the mode= SGLang passes, as it reaches fxflops' backend
    real = backend.inductor_patches
    monkeypatch.setattr(backend, "inductor_patches",
                        lambda mode, options: modes.append(mode) or real(mode, options))
    expected = {}
    for bs in sizes:
        with torch.no_grad(), own(m, True, bs, TP) as forward:
            expected[bs] = forward(*inputs(bs), batch)
    switch_on(monkeypatch)
    assert module.patch_model is not own
    prefix = "sglang-decode" if runner == "decode" else "sglang-cpu"
    for bs in sizes:
        with module.patch_model(m, True, bs, TP) as forward:
            for _ in range(3):
                out = forward(*inputs(bs), batch)
        if runner == "decode":  # bit for bit
            assert torch.equal(out, expected[bs]), (bs, (out - expected[bs]).abs().max())
        else:  # with freezing, within float32's rounding (6e-7 seen; SGLang's own compile
            # twice differs as much: see the failure test)
            torch.testing.assert_close(out, expected[bs], rtol=1.3e-6, atol=1e-5)
    with module.patch_model(m, False, 3, TP) as forward:  # not compiled by SGLang
        assert forward == m.forward
    sglang_mode = "max-autotune-no-cudagraphs" if runner == "decode" else None
    assert modes == [sglang_mode] * len(sizes)
    rows = rows_by_name()
    assert sorted(rows) == [f"{prefix}:size{bs}" for bs in sizes]
    for bs in sizes:
        (row,) = rows[f"{prefix}:size{bs}"]
        assert row.size == bs and row.count == 3
        assert row.cost.matmul_flops == flop_counter(m, batch, bs)
        assert row.cost.matmul_flops == bs * (linear_flops_per_token() + LM_HEAD_PER_TOKEN
                                              + ATTENTION_PER_TOKEN)


def test_a_failure_inside_fxflops_is_logged_once_and_sglangs_compile_goes_on(
        sites, model, monkeypatch, caplog):
    """fxflops' backend cannot be made: warned once, SGLang's compile runs as it asked
    (Inductor, its mode), outputs as without fxflops, no row."""
    from fxflops.instrument import backend

    m, batch = model
    monkeypatch.setattr(torch._inductor.config, "freezing", True)
    with torch.no_grad(), sites.cpu.patch_model(m, True, 1, TP) as forward:
        expected = forward(*inputs(1), batch)

    def broken(*args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(backend, "backend", broken)
    switch_on(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="fxflops"):
        for _ in range(2):
            with sites.cpu.patch_model(m, True, 1, TP) as forward:
                out = forward(*inputs(1), batch)
    # (SGLang's compile against itself, with freezing: within float32's rounding)
    torch.testing.assert_close(out, expected, rtol=1.3e-6, atol=1e-5)
    warned = [r for r in caplog.records if "broken on purpose" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert rows_by_name() == {}


def test_install_torch_compiled_takes_fxflops_backend(sites, model):
    """SGLang's piecewise entry (``install_torch_compiled``, not selectable in 0.5.23)
    with fxflops' backend as its ``backend_factory``: one graph, general in the token
    count SGLang marks dynamic, a row per runtime size, each exact against
    FlopCounterMode; outside SGLang's piecewise context the model runs uncompiled."""
    from sglang.srt.compilation.compile import install_torch_compiled
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
        enable_tc_piecewise_cuda_graph,
    )

    m, batch = model
    m2 = TinyDecoder().eval()
    m2.load_state_dict(m.state_dict())
    install_torch_compiled(m2, dynamic_arg_dims={"input_ids": 0, "positions": 0},
                           backend_factory=fxflops.backend(inner="inductor", name="pcg"))
    with torch.no_grad():
        m2(*inputs(2), batch)  # outside the context: SGLang runs the forward uncompiled
        assert rows_by_name() == {}
        with enable_tc_piecewise_cuda_graph():
            for bs in (2, 3, 4):
                out = m2(*inputs(bs), batch)
                torch.testing.assert_close(out, m(*inputs(bs), batch))
    (rows,) = rows_by_name().values()
    assert sorted(r.size for r in rows) == [2, 3, 4]
    for row in rows:
        assert row.cost.matmul_flops == flop_counter(m, batch, row.size)


def test_sglangs_estimate_beside_the_rows(sites, model, monkeypatch):
    """SGLang's own estimate of a decode step (``--enable-mfu-metrics``: its
    ``SchedulerMetricsReporter`` constants and ``_estimate_decode_perf``, run as SGLang
    runs them) is kept per step's tokens; beside the compiled size's row the measured
    matmul FLOPs exceed it by exactly the LM head (which SGLang's estimate leaves out and
    its compiled forward holds), attention and the rest agreeing; the differences named."""
    from fxflops.integrations.sglang import estimate

    switch_on(monkeypatch)
    m, batch = model
    monkeypatch.setattr(torch._inductor.config, "freezing", True)
    with sites.cpu.patch_model(m, True, 2, TP) as forward:
        forward(*inputs(2), batch)
    monkeypatch.setattr(sites.module, "get_parallel", lambda: types.SimpleNamespace(tp_size=1))
    config = types.SimpleNamespace(
        hidden_size=HIDDEN, num_attention_layers=LAYERS, head_dim=HEAD_DIM, dtype=torch.bfloat16,
        get_num_attention_heads=lambda tp: HEADS // tp, get_num_kv_heads=lambda tp: KV_HEADS,
        hf_text_config=types.SimpleNamespace(intermediate_size=INTER))
    reporter = sites.reporter.__new__(sites.reporter)
    reporter.scheduler = types.SimpleNamespace(model_config=config)
    reporter._init_estimated_perf_constants()
    step = types.SimpleNamespace(seq_lens_cpu=torch.tensor([CONTEXT, CONTEXT]))
    flops, read, write = reporter._estimate_decode_perf(step, 2)
    (row,) = fxflops.recorder().engine.estimates_snapshot()
    assert (row.size, row.steps, row.flops, row.read_bytes) == (2, 1, flops, int(read))
    assert row.by_component == {"attention": 2 * ATTENTION_PER_TOKEN,
                                "rest": 2 * linear_flops_per_token()}
    (side,) = estimate.side_by_side()
    assert side["size"] == 2 and side["difference"] == 2 * LM_HEAD_PER_TOKEN
    assert "LM head" in side["why"]["rest"] and "MoE" in side["why"]["moe"]
    assert fxflops.recorder().engine.why == estimate.WHY


def test_capture_and_replays_on_the_cuda_simulator(sites, model, monkeypatch):
    """The decode runner's pattern around SGLang's real ``patch_model``: the compiled
    forward called eagerly, then captured once under ``torch.cuda.graph`` (simulated: no
    GPU here), then replayed; each replay is counted in the size's row (its CUDA events
    are recorded in the graph) and timed; no CUDA rule broken."""
    from tests.cuda_sim import CudaSim
    from tests.helpers import plan_on_gpu

    # (torch.cuda.is_available left as it is: Dynamo saves the CUDA RNG's state where it
    # says True, which the simulator does not stand in for)
    sim = CudaSim(lag=2, devices=1).install(monkeypatch, leave=("is_available",))
    plan_on_gpu(monkeypatch)
    switch_on(monkeypatch)
    m, batch = model
    try:
        with sites.decode.patch_model(m, True, 2, TP) as forward:
            forward(*inputs(2), batch)  # SGLang's warm-up run (compiles)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                forward(*inputs(2), batch)
        for _ in range(20):
            g.replay()
            sim.step()
        sim.drain()
        report = fxflops.recorder().to_dict()
    finally:
        cuda_events._CLOCKS.pop(sim.CUDAGraph, None)
    (graph,) = report["graphs"]
    assert graph["name"] == "sglang-decode:size2"
    calls = sum(r["calls"] for r in graph["rows"])
    assert calls == 1 + 20  # the eager warm-up run and every replay (not the capture)
    assert sim.violations == []
    assert os.environ.get("FXFLOPS") == "1"
